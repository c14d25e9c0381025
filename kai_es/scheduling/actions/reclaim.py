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

from kai_es.scheduling import times
from kai_es.scheduling.actions.preempting import PreemptingAction, at_most, dominant_share, reason_numbers
from kai_es.scheduling.session import QueueNode, Session, Vector
from kai_es.scheduling.victims import Unit
from kai_es.state.model import Job


def _sides(a: QueueNode, b: QueueNode) -> tuple[tuple[QueueNode, ...], QueueNode, QueueNode] | None:
    """(a's chain below the lowest common ancestor, a's side, b's side), or None when b is in
    a's own chain (the same queue or an ancestor: nothing to reclaim from)."""
    b_chain = set(id(q) for q in b.chain)
    below: list[QueueNode] = []
    for q in a.chain:
        if id(q) in b_chain:
            break
        below.append(q)
    if not below:
        return None
    common = a.chain[len(below)] if len(below) < len(a.chain) else None
    b_side = b
    for q in b.chain:
        if q.parent is common:
            b_side = q
            break
    if b_side is below[-1] or id(b_side) in {id(q) for q in a.chain}:
        return None
    return tuple(below), below[-1], b_side


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

    def min_runtime_ns(self, leaf: QueueNode, victim_leaf: QueueNode) -> int:
        assert self.session.config is not None
        return times.reclaim_min_runtime_ns(self.state, self.session.config, leaf, victim_leaf)

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        # within fair share at the leaf at least (the full chain is checked per victim)
        return all(request[r] <= 0 or leaf.allocated[r] + request[r] <= leaf.fair[r] for r in (0, 1, 2))

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self._yielding_at = -1
        self._yielding: list[QueueNode] = []

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for victim in self._queues_that_may_yield():
            name = victim.name
            if name == leaf.name or not self._may_yield(leaf, job, request, victim):
                continue
            out.extend((name, priority) for priority in sorted(self.state.victim_jobs[name]))
        return out

    def _queues_that_may_yield(self) -> list[QueueNode]:
        """The leaf queues holding victim jobs that some reclaimer could take from on the Plan as
        it is: `_may_yield` for any preemptor and request (a necessary condition, recomputed when
        the Plan has changed)."""
        length = len(self.plan.operations)
        if self._yielding_at != length:
            queues = self.session.queues
            self._yielding_at = length
            self._yielding = [queues[name] for name in sorted(self.state.victim_jobs)
                              if name in queues and _could_yield(queues[name])]
        return self._yielding

    @staticmethod
    def _may_yield(leaf: QueueNode, job: Job, request: Vector, victim: QueueNode) -> bool:
        """Whether `admit` could take any unit of `victim`'s jobs now or later in this search:
        each of its rules on the victim side, for a unit that frees at least one unit of some
        resource the preemptor requests and the victim queue holds preemptibly (evictions only
        lower the victim side's accounting, which makes each rule stricter)."""
        sides = _open_sides(leaf, job, request, victim)
        if sides is None:
            return False
        mine, theirs = sides
        held = [r for r in (0, 1, 2) if request[r] > 0 and victim.allocated[r] - victim.nonpreemptible[r] > 0]
        above_quota = [r for r in held if theirs.quota[r] < 0 or theirs.allocated[r] > theirs.quota[r]]
        if not above_quota:
            return False
        keeps_fair = any(theirs.allocated[r] > theirs.fair[r] for r in held)
        owed = _owed(mine, request) and any(theirs.quota[r] >= 0 and theirs.allocated[r] > theirs.quota[r]
                                            for r in held)
        if not (keeps_fair or owed):
            return False
        return at_most(dominant_share(_plus(mine.allocated, request), mine.fair),
                       dominant_share(theirs.allocated, theirs.fair))

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
