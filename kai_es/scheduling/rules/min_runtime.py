"""Min-runtime (KAI's minruntime plugin): a running job is no victim of preempt or reclaim
while it has run for less than its min-runtime, but for an elastic job's surplus pods.

- `NoMinRuntimeV2` (kai-es/v1, v2): no job is protected.
- `QueueMinRuntime` (kai-es/v3 on), all times from the log:
  - a job *started* at the earliest start of its occupying pods (a pod's start is the time it
    was first observed running or bound, or its reported `status.startTime`; none yet: now);
  - preempt: the first `preemptMinRuntime` set walking up from the victim's leaf queue, else
    the config's `minRuntime.preemptMinRuntime`;
  - reclaim, by the config's `minRuntime.reclaimResolveMethod`: "lca" (the default), the first
    `reclaimMinRuntime` set walking up from the child of the lowest common ancestor of the two
    leaf queues on the victim's side; "queue", the first set walking up from the victim's own
    leaf queue; either way else the config's `minRuntime.reclaimMinRuntime`;
  - a job is *protected* while now < started + min-runtime (0: never).

Contract: pure functions of the folded state, the config and the cycle's "now".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.events.timefmt import parse_signed_duration
from kai_es.state.model import OCCUPYING, ClusterState, Job

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig
    from kai_es.scheduling.session import QueueNode, Session


class MinRuntime(Protocol):
    def preempt_protected(self, session: Session, victim: Job, victim_leaf: QueueNode | None) -> bool:
        """Whether `victim` (of queue `victim_leaf`) keeps its gang against preempt now."""

    def reclaim_protected(self, session: Session, reclaimer_leaf: QueueNode, victim: Job,
                          victim_leaf: QueueNode | None) -> bool:
        """Whether `victim` keeps its gang against a reclaimer of `reclaimer_leaf` now."""


class NoMinRuntimeV2:
    __slots__ = ()

    def preempt_protected(self, session: Session, victim: Job, victim_leaf: QueueNode | None) -> bool:
        return False

    def reclaim_protected(self, session: Session, reclaimer_leaf: QueueNode, victim: Job,
                          victim_leaf: QueueNode | None) -> bool:
        return False


class QueueMinRuntime:
    __slots__ = ()

    def preempt_protected(self, session: Session, victim: Job, victim_leaf: QueueNode | None) -> bool:
        config = session.config
        assert config is not None, "the time rules need the config in force"
        runtime = preempt_min_runtime_ns(session.state, config, victim_leaf) if victim_leaf is not None else 0
        return session.now_ns < protected_until_ns(session.state, victim, runtime, session.now_ns)

    def reclaim_protected(self, session: Session, reclaimer_leaf: QueueNode, victim: Job,
                          victim_leaf: QueueNode | None) -> bool:
        config = session.config
        assert config is not None, "the time rules need the config in force"
        runtime = reclaim_min_runtime_ns(session.state, config, reclaimer_leaf, victim_leaf) \
            if victim_leaf is not None else 0
        return session.now_ns < protected_until_ns(session.state, victim, runtime, session.now_ns)


def job_started_ns(state: ClusterState, job: Job, now_ns: int) -> int:
    """When the job started running (the earliest start of its occupying pods; now if none)."""
    starts = [state.pods[k].started_ns for k in job.members
              if state.pods[k].status in OCCUPYING and state.pods[k].started_ns > 0]
    return min(starts) if starts else now_ns


def _first_set(chain: tuple[QueueNode, ...], state: ClusterState, field: str) -> int | None:
    for q in chain:
        queue = state.queues.get(q.name)
        value = getattr(queue.spec, field) if queue is not None else None
        if value is not None:
            return int(value)
    return None


def preempt_min_runtime_ns(state: ClusterState, config: SchedulerConfig, victim_leaf: QueueNode) -> int:
    found = _first_set(victim_leaf.chain, state, "preempt_min_runtime_ns")
    return found if found is not None else parse_signed_duration(config.min_runtime.preempt_min_runtime)


def reclaim_min_runtime_ns(state: ClusterState, config: SchedulerConfig, reclaimer_leaf: QueueNode,
                           victim_leaf: QueueNode) -> int:
    """By `minRuntime.reclaimResolveMethod`: "queue" from the victim's leaf up; "lca" from the
    victim's side just below the lowest common ancestor up."""
    below = 0
    if config.min_runtime.reclaim_resolve_method == "lca":
        mine = {id(q) for q in reclaimer_leaf.chain}
        for i, q in enumerate(victim_leaf.chain):
            if id(q) in mine:
                break
            below = i
    found = _first_set(victim_leaf.chain[below:], state, "reclaim_min_runtime_ns")
    return found if found is not None else parse_signed_duration(config.min_runtime.reclaim_min_runtime)


def protected_until_ns(state: ClusterState, job: Job, min_runtime_ns: int, now_ns: int) -> int:
    """Until when `job` may not be a victim (0 or a past time: it may)."""
    if min_runtime_ns <= 0:
        return 0
    return job_started_ns(state, job, now_ns) + min_runtime_ns
