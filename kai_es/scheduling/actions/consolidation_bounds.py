"""Where each node can at best stand in consolidation's node order when the order breaks ties by
the cheapest victim (kai-es/v9 on, `rules.consolidation_nodes.CheapestVictimBreaksTies`), kept
across cycles: a search then looks at the nodes that may rank first, not at every node tied on
free GPU capacity (on a full cluster of 20,000 nodes, thousands of them every cycle).

A node's key in that order is (-free, cheapest is None, cheapest or (), node): its free GPU
capacity once released (milli-GPU), then the victim-order key of its cheapest movable unit
(`victims.keyed_units`), which starts with the unit's job's `victims.job_order`. Its *bound* is
(-free, False, least, node), where `least` is the least `job_order` of the preemptible jobs with
a pod on the node, in any status: a superset of the pods a search may move, so the bound is never
above the key (the cheapest unit's job is one of those jobs). A node without such a pod has no
bound and is never a candidate (it has nothing to move).

Contract: `state_bounds(state)` returns every node's bound as of the state (what a cycle starts
from), sorted, equal to computing them afresh (`fresh_bounds`), at the cost of the nodes whose
pods or usage changed since it was last asked (`tables.changed_since`; the reducer marks the
nodes of a job whose victim order or preemptibility changed as well), each from the pods it
gained and lost and those there whose worth the reducer says changed (`victim_order_changed`),
unless one of the pods that gave its least is among them; plus one pass over the nodes' free capacity
when the node set or a node's spec changed. Within a cycle, the Plan
changes only the nodes it touches, and there movable pods only go (evicted), never come, so a
node's `least` stays a bound: `consolidation_views.NodeViews` ranks the touched nodes apart with
their current free capacity. The sorted bounds use `sortedcontainers.SortedList`, as the
project's other sorted indexes. Derived data in `state.caches`: never in a snapshot or digest.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from kai_es.scheduling.packing.model import ArrayPackTable
from kai_es.scheduling.tables import follow, generation, tables
from kai_es.state.model import ClusterState, NodeState

#: where the bounds are kept in `state.caches`
CACHE_KEY = "scheduling.consolidation_bounds"

#: a job's place in the victim order, `victims.job_order`: (priority, -created_ns, uid)
Least = tuple[int, int, str]


@dataclass(slots=True)
class StateBounds:
    """Every node's bound as of the state, by node index (the tables' order)."""

    #: the tables' generation it is up to date with (`tables.changed_since`)
    seen: int = -2
    #: how many times `tables.follow` handed it out
    asked: int = 0
    names: list[str] = field(default_factory=list)
    #: per node: the least victim order of a preemptible job with a pod there (None: no such pod)
    least: list[Least | None] = field(default_factory=list)
    #: per node: its free GPU capacity once released (milli-GPU: the sum of its devices' free
    #: shares in the future table)
    free: list[int] = field(default_factory=list)
    #: (-free, False, least, node) of every node with a `least`, sorted
    ordered: SortedList = field(default_factory=SortedList)
    #: per node: the pods it held when `least` was computed, and those of them whose job's
    #: order is `least` (a node that changed compares what it holds now with them)
    held: list[tuple[str, ...]] = field(default_factory=list)
    holders: list[tuple[str, ...]] = field(default_factory=list)


def _least(state: ClusterState, keys: Iterable[str], least: Least | None = None,
           holders: tuple[str, ...] = ()) -> tuple[Least | None, tuple[str, ...]]:
    """(the least `victims.job_order` of the preemptible jobs of the pods `keys`, or `least` if
    that is less, and the pods of `keys` and `holders` whose job's order it is)."""
    pods, jobs = state.pods, state.jobs
    best, of = least, list(holders)
    for key in keys:
        pod = pods.get(key)
        if pod is None:
            continue
        job = jobs.get(pod.job_key)
        if job is None or not job.preemptible:
            continue
        order = (job.priority, -job.created_ns, job.uid)
        if best is None or order < best:
            best, of = order, [key]
        elif order == best:
            of.append(key)
    return best, tuple(of)


def _update(state: ClusterState, bounds: StateBounds, n: int, node: NodeState, skipped: bool,
            reworth: AbstractSet[str]) -> None:
    """Bring node `n`'s `least` up to date from what it gained and lost since and from `reworth`,
    the pods whose job's worth as a victim the reducer says may have changed
    (`victim_order_changed`; of those, only the ones it holds count): while every pod that gave
    the least stays, unchanged, the least can only go down, to a pod gained or re-worthed. Else
    (or when a cycle went by unseen, `skipped`) from all it holds. `reworth` is read by lookups
    of the node's own pods only (a node holds tens of pods; the set may hold thousands)."""
    now = node.pods
    held = bounds.held[n]
    if not skipped and held:
        holders = bounds.holders[n]
        if not any(key not in now or key in reworth for key in holders):  # its least's pods stay, unchanged
            look = now.difference(held)
            if reworth:
                look |= reworth & now
            bounds.least[n], bounds.holders[n] = _least(state, look, bounds.least[n], holders)
            bounds.held[n] = tuple(now)
            return
    bounds.least[n], bounds.holders[n] = _least(state, now)
    bounds.held[n] = tuple(now)


def free_milli_gpu(table: ArrayPackTable, node: int) -> int:
    """`node`'s free GPU capacity in `table` (milli-GPU, summed over its devices)."""
    start = table.gpu_start
    return sum(table.dev_free_milli[start[node]:start[node + 1]])


def fresh_bounds(state: ClusterState) -> StateBounds:
    """Every node's bound computed from the state alone."""
    names, nodes, _, future = tables(state)
    found = [_least(state, node.pods) for node in nodes]
    least = [f[0] for f in found]
    free = [free_milli_gpu(future, n) for n in range(len(names))]
    return StateBounds(seen=-2, names=list(names), least=least, free=free,
                       ordered=SortedList(_keys(least, free, range(len(names)))),
                       held=[tuple(node.pods) for node in nodes], holders=[f[1] for f in found])


def state_bounds(state: ClusterState) -> StateBounds:
    """The bounds as of the state (module contract)."""
    bounds = follow(state, CACHE_KEY, StateBounds, lambda: fresh_bounds(state),
                    lambda bounds, changed, rebuilt: _brought_up_to_date(state, bounds, changed, rebuilt))
    state.victim_order_changed.clear()  # (every pod it names is on a changed node or gone: looked at)
    return bounds


def _brought_up_to_date(state: ClusterState, bounds: StateBounds, changed: list[int], rebuilt: bool) -> StateBounds:
    names, nodes, _, future = tables(state)
    # the pods the reducer says changed worth (one that left a node is gone from it: looked at
    # as such), looked up from each changed node's pods rather than grouped by node: grouping
    # read every such pod (thousands a cycle when jobs finish), mostly cache misses
    reworth = state.victim_order_changed
    # a generation (a cycle's) went by without a search: a node may then hold, under a key it held
    # at the last one, a pod recreated in another job and bound by that cycle; from all it holds
    skipped = generation(state) != bounds.seen + 1
    if rebuilt:  # indexes may name other nodes, and specs (free capacity) may differ: by name
        again = set(changed)
        old = {name: i for i, name in enumerate(bounds.names)}
        kept = [old[name] if name in old and i not in again else None for i, name in enumerate(names)]
        least, held, holders = bounds.least, bounds.held, bounds.holders
        bounds.least = [least[k] if k is not None else None for k in kept]
        bounds.held = [held[k] if k is not None else () for k in kept]
        bounds.holders = [holders[k] if k is not None else () for k in kept]
        bounds.names = list(names)
        for n in again:
            _update(state, bounds, n, nodes[n], skipped, reworth)
        bounds.free = [free_milli_gpu(future, n) for n in range(len(names))]
        bounds.ordered = SortedList(_keys(bounds.least, bounds.free, range(len(names))))
    else:
        ordered, least, free = bounds.ordered, bounds.least, bounds.free
        start, dev = future.gpu_start, future.dev_free_milli  # (`free_milli_gpu` written out: every changed node)
        for n in changed:
            was, was_free = least[n], free[n]
            _update(state, bounds, n, nodes[n], skipped, reworth)
            is_least, is_free = least[n], sum(dev[start[n]:start[n + 1]])
            free[n] = is_free
            if is_least != was or is_free != was_free:
                if was is not None:
                    ordered.remove((-was_free, False, was, n))
                if is_least is not None:
                    ordered.add((-is_free, False, is_least, n))
    return bounds


def _keys(least: list[Least | None], free: list[int], nodes: Iterable[int]
          ) -> Iterable[tuple[int, bool, Least, int]]:
    for n in nodes:
        found = least[n]
        if found is not None:
            yield (-free[n], False, found, n)
