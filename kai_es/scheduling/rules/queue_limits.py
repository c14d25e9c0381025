"""Queue limits when reclaim, preempt or consolidation make room: when a preemptor's queue
limit is judged, and whether a victim put back must fit its queue's limit.

- `LimitsBeforeSearchV9` (kai-es/v1-v9): a preemptor whose queues' limits (or, for a
  non-preemptible job, quotas) its request would exceed with the allocation as it stands is
  refused before any search; victims are put back (`rules.replacement`) wherever they fit.
- `LimitsOnThePlan` (kai-es/v10 on, KAI's proportion plugin as a predicate,
  `IsTaskAllocationOnNodeOverCapacity`, checked for every task placed): before the search only
  the non-preemptible quota is checked (preempt's `IsNonPreemptibleJobOverQueueQuota`; no
  victim gives back non-preemptible allocation); the limits are checked on the Plan once the
  preemptor is placed, with the victims taken so far no longer counted — so a job at its
  queue's limit may preempt a lower-priority job of its own queue to make room under it (KAI's
  "interactive after train when over quota" case), and the search takes victims until the
  limit holds. A victim put back after the preemptor is placed must fit its queues' limits
  too, or it stays evicted.

Contract: `pre_check(session, leaf, job, request)` is the reasons to refuse the preemptor
before searching ([] to search); `holds(session, leaf, job, request)` says whether the
preemptor's placement on the Plan keeps its queues within their limits (and quotas); and
`victim_fits(session, ops)` whether the pods of evictions `ops` (one job's) back on the Plan
keep their queues within their limits; `after_search(...)` the limit reason a preemptor whose
search failed is told ([] when the limit was judged before). Pure: they read the Session's queue accounting, which follows the Plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.events.payloads import Reason
from kai_es.scheduling.framework import QUEUE_LIMIT
from kai_es.scheduling.fairshare import RESOURCES
from kai_es.state.model import Job
from kai_es.state.quantities import Vector

if TYPE_CHECKING:
    from kai_es.scheduling.plan import Eviction
    from kai_es.scheduling.session import QueueNode, Session


class QueueLimits(Protocol):
    def pre_check(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]: ...

    def holds(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> bool: ...

    def victim_fits(self, session: Session, ops: list[Eviction]) -> bool: ...

    def after_search(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]: ...


class LimitsBeforeSearchV9:
    """kai-es/v1-v9: limits judged once, before the search (module docstring)."""

    __slots__ = ()

    def pre_check(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]:
        return session.limits(leaf, job, request)

    def holds(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> bool:
        return True

    def victim_fits(self, session: Session, ops: list[Eviction]) -> bool:
        return True

    def after_search(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]:
        return []  # judged before the search


def within_limits(leaf: QueueNode, request: Vector) -> bool:
    """Whether every queue from `leaf` up is within its limit in each resource `request` asks
    for, its allocation (the Session's, following the Plan) already counting what was placed."""
    for q in leaf.chain:
        for r in range(len(RESOURCES)):
            if request[r] > 0 and 0 <= q.limit[r] < q.allocated[r]:
                return False
    return True


class LimitsOnThePlan:
    """kai-es/v10 on: KAI's per-task capacity predicate (module docstring)."""

    __slots__ = ()

    def pre_check(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]:
        return session.limits(leaf, job, request, quotas_only=True)

    def holds(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> bool:
        return within_limits(leaf, request)

    def victim_fits(self, session: Session, ops: list[Eviction]) -> bool:
        pods = session.state.pods
        leaf = session.queues.get(session.state.jobs[pods[ops[0].pod_key].job_key].queue)
        return leaf is None or within_limits(leaf, session.request_of([pods[op.pod_key] for op in ops]))

    def after_search(self, session: Session, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]:
        return [r for r in session.limits(leaf, job, request)[:1] if r.code == QUEUE_LIMIT]
