"""The time rules of policy kai-es/v3 (KAI's minruntime plugin, preemption delay and stale gang
eviction), as pure functions of the folded state, the scheduler config and the cycle's logical
time. Every time comes from the log: a pod's start is the time it was first observed running or
bound (or its reported `status.startTime`), a job's last eviction the time of the decision
(`kai_es.state.reducer`), "now" the CycleStarted event's logical time.

Contract:
- A job *started* at the earliest start of its occupying pods (one not started yet: now).
- Min-runtime (`preemptMinRuntime` / `reclaimMinRuntime`, ns; None on a queue: unset):
  - preempt: the first value set walking up from the victim's leaf queue, else the config's
    `minRuntime.preemptMinRuntime`;
  - reclaim, by the config's `minRuntime.reclaimResolveMethod` (KAI's): "lca" (the default),
    the first value set walking up from the child of the lowest common ancestor of the two
    leaf queues on the victim's side; "queue", the first value set walking up from the
    victim's own leaf queue (as preempt); either way else the config's
    `minRuntime.reclaimMinRuntime`.
  A job is *protected* while now < started + min-runtime (0: never protected).
- Preemption delay: the PodGroup's `preemptionDelay` (or annotation), else its first pod's (by
  key) annotation, else 0. A job may trigger evictions from max(created, last evicted) + delay.
- Staleness grace period: the PodGroup's, else its first pod's annotation, else the config's
  `defaultStalenessGracePeriod`; negative: never evicted as stale. A gang is stale from the
  reducer's `stale_since_ns` (kai-es/v4 on: also while a leaf sub-group is below its minimum).
"""

from __future__ import annotations

from kai_es.scheduling.config import SchedulerConfig, duration_ns
from kai_es.scheduling.session import QueueNode
from kai_es.state.model import OCCUPYING, ClusterState, Job


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
    return found if found is not None else duration_ns(config.min_runtime.preempt_min_runtime)


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
    return found if found is not None else duration_ns(config.min_runtime.reclaim_min_runtime)


def protected_until_ns(state: ClusterState, job: Job, min_runtime_ns: int, now_ns: int) -> int:
    """Until when `job` may not be a victim (0 or a past time: it may)."""
    if min_runtime_ns <= 0:
        return 0
    return job_started_ns(state, job, now_ns) + min_runtime_ns


def _first_member_value(state: ClusterState, job: Job, field: str) -> int | None:
    for key in sorted(job.members):
        value = getattr(state.pods[key].spec, field)
        if value is not None:
            return int(value)
    return None


def preemption_delay_ns(state: ClusterState, job: Job) -> int:
    spec = job.spec
    if spec is not None and spec.preemption_delay_ns is not None:
        return spec.preemption_delay_ns
    found = _first_member_value(state, job, "preemption_delay_ns")
    return found if found is not None else 0


def may_trigger_evictions_from_ns(state: ClusterState, job: Job) -> int:
    """The earliest time `job` may make room for itself by evicting others."""
    delay = preemption_delay_ns(state, job)
    if delay <= 0:
        return 0
    return max(job.created_ns, job.last_evicted_ns) + delay


def staleness_grace_ns(state: ClusterState, config: SchedulerConfig, job: Job) -> int:
    spec = job.spec
    if spec is not None and spec.staleness_grace_ns is not None:
        return spec.staleness_grace_ns
    found = _first_member_value(state, job, "staleness_grace_ns")
    return found if found is not None else duration_ns(config.default_staleness_grace_period)


def stale_deadline_ns(state: ClusterState, config: SchedulerConfig, job: Job) -> int | None:
    """When the stale gang `job` is due for eviction (None: it is not stale, or never evicted)."""
    if not job.stale_since_ns:
        return None
    grace = staleness_grace_ns(state, config, job)
    if grace < 0:
        return None
    return job.stale_since_ns + grace


def due_times_ns(state: ClusterState, config: SchedulerConfig) -> list[int]:
    """Sorted times at which a time rule may change a cycle's decisions though nothing new was
    logged (a reason for the scheduler to wake up and run a cycle): stale gangs' eviction
    deadlines (every gang in `state.gangs_below_minimum`: under kai-es/v4, gangs short in a
    leaf sub-group too); and, while pods wait, the ends of pending jobs' preemption delays and of
    running jobs' min-runtimes: every value set on the victim's own queue chain and the config's
    defaults, a superset of what either reclaim resolution ("lca" or "queue") and preempt can
    resolve, since each of them picks a value on that chain or a default."""
    out: set[int] = set()
    actions = set(config.action_list)
    if "stalegangeviction" in actions:
        for key in sorted(state.gangs_below_minimum):
            deadline = stale_deadline_ns(state, config, state.jobs[key])
            if deadline is not None:
                out.add(deadline)
    if state.pending_jobs and actions & {"reclaim", "preempt", "consolidation"}:
        defaults = (duration_ns(config.min_runtime.preempt_min_runtime),
                    duration_ns(config.min_runtime.reclaim_min_runtime))
        for key in sorted(state.jobs):
            job = state.jobs[key]
            if job.pending:
                start = may_trigger_evictions_from_ns(state, job)
                if start:
                    out.add(start)
            if job.occupying and job.preemptible:
                started = job_started_ns(state, job, 0)
                for runtime in (*defaults, *_chain_values(state, job.queue)):
                    if runtime > 0 and started > 0:
                        out.add(started + runtime)
    return sorted(out)


def _chain_values(state: ClusterState, queue: str) -> list[int]:
    """Every min-runtime set on `queue` and its ancestors."""
    values: list[int] = []
    seen: set[str] = set()
    while queue in state.queues and queue not in seen:
        seen.add(queue)
        spec = state.queues[queue].spec
        values += [v for v in (spec.preempt_min_runtime_ns, spec.reclaim_min_runtime_ns) if v is not None]
        queue = spec.parent
    return values
