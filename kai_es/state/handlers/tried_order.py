"""The order a cycle's allocate tried the waiting jobs in (kai-es/v13 on): a cycle records it as
an edit of the order its cut held (`TriedOrder`), or nothing when it is unchanged; the fold keeps
the result as `ClusterState.tried_order`, the positions that `explain`, `serve` and the
PodGroup condition show.

Contract (part of the reducer, `kai_es.state.reducer`):
- `edit(old, new, since_cycle)` is the `TriedOrder` that turns `old` into `new` (the longest
  common head, then the longest common tail of what is left), None when they are equal.
- `keep(state, cycle, edit, keeps)` folds cycle `cycle`'s CycleCompleted: with `keeps` (the
  decision's version keeps orders) the state holds the edited order, marked as `cycle`'s; an
  edit that does not fit the order held (another cycle's base, bounds outside it, a job twice)
  is counted in `ignored_events` and leaves no order, so the next cycle records its own in full;
  without `keeps` no order is held. Nothing here raises on any payload.
"""

from __future__ import annotations

from kai_es.events import payloads as p
from kai_es.state.model import ClusterState


def edit(old: list[str], new: list[str], since_cycle: int) -> p.TriedOrder | None:
    """The edit of `old` (the order of cycle `since_cycle`) that gives `new`; None when equal."""
    if old == new:
        return None
    head = 0
    shortest = min(len(old), len(new))
    while head < shortest and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < shortest - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return p.TriedOrder(since_cycle=since_cycle, keep_head=head, keep_tail=tail,
                        jobs=tuple(new[head:len(new) - tail]))


def applied(old: list[str], order: p.TriedOrder) -> list[str] | None:
    """`old` edited by `order`, or None when the edit does not fit `old` or repeats a job."""
    head, tail = order.keep_head, order.keep_tail
    if head < 0 or tail < 0 or head + tail > len(old):
        return None
    new = old[:head] + list(order.jobs) + old[len(old) - tail:]
    return new if len(set(new)) == len(new) else None


def keep(state: ClusterState, cycle: int, order: p.TriedOrder | None, keeps: bool) -> None:
    """Fold the tried order of completed cycle `cycle` (module docstring)."""
    if not keeps:
        if state.tried_order_cycle:
            state.tried_order, state.tried_order_cycle = [], 0
        return
    if order is not None:
        new = applied(state.tried_order, order) if order.since_cycle == state.tried_order_cycle else None
        if new is None:
            state.ignored_events += 1
            state.tried_order, state.tried_order_cycle = [], 0
            return
        state.tried_order = new
    state.tried_order_cycle = cycle
