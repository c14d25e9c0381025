"""The reclaim action: a queue below its fair share takes back capacity from queues above theirs.

Rules (KAI's), compared at the level just below the lowest common ancestor of the two queues
(for queues without a common parent: their roots):
- the reclaiming job's queue, and each of its ancestors up to that level, stays within its fair
  share with the job (a non-preemptible job: within its quota too);
- a victim is a preemptible job of another queue that frees a resource the reclaiming job
  needs; its side must stay at or above its deserved quota in every such resource (in-quota
  resources and non-preemptible jobs are never reclaimed), and either stay at or above its fair
  share in one of them, or the reclaiming side only takes what it is owed (it stays within its
  deserved quota) from a side above its own;
- the reclaiming side must not end up more saturated, relative to its fair share (dominant
  share), than the side it takes from.
Effort and victim choice are the shared search's (`kai_es.scheduling.victims`). Together these
rules make reclaim one-directional: a queue that reclaimed is at most at its fair share, the one
it took from at least at its own, so neither can take it back.
"""

from __future__ import annotations

from collections.abc import Callable

from kai_es.scheduling.actions.preempting import PreemptingAction, at_most, dominant_share, reason_numbers
from kai_es.scheduling.session import QueueNode, Session
from kai_es.scheduling.victims import Unit
from kai_es.state.model import Job
from kai_es.state.quantities import Vector


def _sides(a: QueueNode, b: QueueNode) -> tuple[tuple[QueueNode, ...], QueueNode, QueueNode] | None:
    """(a's chain below the lowest common ancestor, a's side, b's side), or None when b is in
    a's own chain (the same queue or an ancestor: nothing to reclaim from). Queues without a
    common ancestor: their roots are the sides. (Called for every pair of a reclaimer's and a
    victim's queue: written out, by identity.)"""
    a_chain = a.chain
    k = len(a_chain)  # where the lowest common ancestor is in a's chain (none: past its end)
    b_side: QueueNode | None = b.chain[-1]
    previous: QueueNode | None = None
    for q in b.chain:
        found = -1
        for i, x in enumerate(a_chain):
            if x is q:
                found = i
                break
        if found >= 0:
            k, b_side = found, previous
            break
        previous = q
    if k == 0 or b_side is None or any(x is b_side for x in a_chain):
        return None
    return a_chain[:k], a_chain[k - 1], b_side


def _could_yield(victim: QueueNode) -> bool:
    """Some side of `victim` (itself or an ancestor) could lose preemptible usage under the
    victim-side rules of `admit`, whoever the reclaimer."""
    held = [r for r in (0, 1, 2) if victim.allocated[r] - victim.nonpreemptible[r] > 0]
    for side in victim.chain:
        if any(side.quota[r] < 0 or side.allocated[r] > side.quota[r] for r in held) and \
                any(side.allocated[r] > side.fair[r] or 0 <= side.quota[r] < side.allocated[r] for r in held):
            return True
    return False


def _open_sides(leaf: QueueNode, job: Job, request: Vector, victim: QueueNode
                ) -> tuple[QueueNode, QueueNode] | None:
    """(the reclaimer's side, the victim's side) when `leaf` may reclaim from `victim`'s side at
    all: they differ, and the reclaimer's queues below their common ancestor stay within fair
    share with the job (`_chain_within`); else None."""
    sides = _sides(leaf, victim)
    if sides is None:
        return None
    chain, mine, theirs = sides
    return (mine, theirs) if _chain_within(chain, job, request) else None


def _side_may_yield(mine: QueueNode, theirs: QueueNode, request: Vector, held: list[int],
                    mine_now: tuple[bool, tuple[int, int]] | None = None) -> bool:
    """Whether `admit` could take any unit from side `theirs` for `mine`'s job now or later in
    its search, for units that free only resources in `held` (resources the job requests and
    the victim queue holds preemptibly): each victim-side rule for a unit freeing at least one
    unit of one of them (evictions only lower the victim side's accounting, which makes each
    rule stricter). `mine_now`: `_mine_now(mine, request)`, when the caller has it."""
    if not any(theirs.quota[r] < 0 or theirs.allocated[r] > theirs.quota[r] for r in held):
        return False
    owed, gained_share = mine_now or _mine_now(mine, request)
    keeps_fair = any(theirs.allocated[r] > theirs.fair[r] for r in held)
    if not (keeps_fair or (owed and any(0 <= theirs.quota[r] < theirs.allocated[r] for r in held))):
        return False
    return at_most(gained_share, dominant_share(theirs.allocated, theirs.fair))


def _mine_now(mine: QueueNode, request: Vector) -> tuple[bool, tuple[int, int]]:
    """What the victim-side rules need of the reclaiming side: whether it stays within its
    deserved quota with the job, and its dominant share with the job."""
    return _owed(mine, request), dominant_share(_plus(mine.allocated, request), mine.fair)


def _chain_within(chain: tuple[QueueNode, ...], job: Job, request: Vector) -> bool:
    """The reclaiming side's queues below the common ancestor stay within their fair share with
    the job (a non-preemptible job: within quota too)."""
    for q in chain:
        for r in (0, 1, 2):
            if request[r] <= 0:
                continue
            if q.allocated[r] + request[r] > q.fair[r]:
                return False
            if not job.preemptible and 0 <= q.quota[r] < q.nonpreemptible[r] + request[r]:
                return False
    return True


def _owed(mine: QueueNode, request: Vector) -> bool:
    """The reclaiming side stays within its deserved quota with the job."""
    return all(request[r] <= 0 or mine.quota[r] < 0 or mine.allocated[r] + request[r] <= mine.quota[r]
               for r in (0, 1, 2))


def _plus(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


class Reclaim(PreemptingAction):
    name = "reclaim"

    def victim_jobs(self, leaf: QueueNode, job: Job) -> list[Job]:
        queues = self.session.queues
        return [v for v in self.occupying_jobs if v.queue != leaf.name and v.queue in queues]

    def min_runtime_protects(self, leaf: QueueNode, victim: Job, victim_leaf: QueueNode | None) -> bool:
        return self.session.rules.min_runtime.reclaim_protected(self.session, leaf, victim, victim_leaf)

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        # within fair share at the leaf at least (the full chain is checked per victim)
        return all(request[r] <= 0 or leaf.allocated[r] + request[r] <= leaf.fair[r] for r in (0, 1, 2))

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self._yielding_at = -1
        #: id of a queue -> the leaves below it (itself included) holding victims that some
        #: reclaimer could take from (`_could_yield`), by name
        self._yielding_under: dict[int, list[QueueNode]] = {}

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        """Walks the reclaimer's chain: at each level, the other children of the level's parent
        (at the top, the other roots) are the sides it may take from; a side's rules are checked
        once for the side (every requested resource counted as held: a necessary condition for
        each leaf below it), then exactly for each of its leaves holding victims."""
        under = self._under()
        requested = [r for r in (0, 1, 2) if request[r] > 0]
        names: list[str] = []
        chain = leaf.chain
        for depth, mine in enumerate(chain):
            siblings = mine.parent.children if mine.parent is not None else self.session.roots
            sides = [(side, under[id(side)]) for side in siblings if side is not mine and id(side) in under]
            if not sides or not _chain_within(chain[:depth + 1], job, request):
                continue
            mine_now = _mine_now(mine, request)
            for side, leaves in sides:
                if not _side_may_yield(mine, side, request, requested, mine_now):
                    continue
                for victim in leaves:
                    held = [r for r in requested if victim.allocated[r] - victim.nonpreemptible[r] > 0]
                    if _side_may_yield(mine, side, request, held, mine_now):
                        names.append(victim.name)
        found = self.state.victim_jobs
        return [(name, priority) for name in sorted(names) for priority in sorted(found[name])]

    def _under(self) -> dict[int, list[QueueNode]]:
        """`_yielding_under`, recomputed when the Plan has changed."""
        length = len(self.plan.operations)
        if self._yielding_at != length:
            queues = self.session.queues
            self._yielding_at = length
            under: dict[int, list[QueueNode]] = {}
            for name in sorted(self.state.victim_jobs):
                victim = queues.get(name)
                if victim is not None and not victim.children and _could_yield(victim):
                    for q in victim.chain:
                        under.setdefault(id(q), []).append(victim)
            self._yielding_under = under
        return self._yielding_under

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        queues = self.session.queues

        def admit(unit: Unit) -> bool:
            sides = _open_sides(leaf, job, request, queues[unit.job.queue])
            if sides is None:
                return False
            mine, theirs = sides
            lost = unit.request
            after: Vector = (theirs.allocated[0] - lost[0], theirs.allocated[1] - lost[1],
                             theirs.allocated[2] - lost[2])
            moving = [r for r in (0, 1, 2) if lost[r] > 0 and request[r] > 0]
            if not moving:
                return False  # the victim frees nothing the reclaimer needs
            # in-quota resources are never reclaimed
            if any(theirs.quota[r] >= 0 and after[r] < theirs.quota[r] for r in moving):
                return False
            # the victim side stays at or above its fair share in a resource being reclaimed ...
            keeps_fair = any(after[r] >= theirs.fair[r] for r in moving)
            # ... or the reclaimer only takes what it is owed (within its deserved quota)
            owed = _owed(mine, request) and any(theirs.quota[r] >= 0 and after[r] > theirs.quota[r] for r in moving)
            if not (keeps_fair or owed):
                return False
            return at_most(dominant_share(_plus(mine.allocated, request), mine.fair), dominant_share(after, theirs.fair))

        return admit

    def why(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], tuple[str, dict[str, int]]]:
        queues = self.session.queues

        def why(unit: Unit) -> tuple[str, dict[str, int]]:
            theirs = queues[unit.job.queue]
            message = (f"reclaimed for job {job.key} of queue {leaf.name} (at {leaf.allocated[0] / 1000:g} of "
                       f"{leaf.fair[0] / 1000:g} GPU fair share): queue {theirs.name} holds "
                       f"{theirs.allocated[0] / 1000:g} GPU over its fair share {theirs.fair[0] / 1000:g}")
            numbers = {**reason_numbers("reclaimer_queue", leaf.allocated, leaf.fair),
                       **reason_numbers("victim_queue", theirs.allocated, theirs.fair),
                       "requested_milli_gpu": request[0]}
            return message, numbers

        return why
