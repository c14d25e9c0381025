"""Jobs: a pod's job (explicit PodGroup or implicit), its queue, priority and age, the
pending-jobs index, stale-gang tracking; and the PodGroup and PriorityClass handlers.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from bisect import insort

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.ingest import bounds
from kai_es.state.handlers.accounting import index_victim, queue_usage
from kai_es.state.handlers.seen import mark_seen
from kai_es.state.keys import PendingJob, PendingPod, pod_key
from kai_es.state.model import (
    DEFAULT_PRIORITY_CLASSES,
    NON_PREEMPTIBLE_PRIORITY,
    OCCUPYING,
    ClusterState,
    Job,
    PodState,
)
from kai_es.state.sorted_on_read import SortedOnRead


def resolve_priority(state: ClusterState, class_name: str, explicit: int | None) -> int:
    """Priority of a PriorityClass name: the observed object, else KAI's defaults, else 0."""
    if class_name:
        if class_name in state.priority_classes:
            return state.priority_classes[class_name]
        if class_name in DEFAULT_PRIORITY_CLASSES:
            return DEFAULT_PRIORITY_CLASSES[class_name]
    return explicit if explicit is not None else 0


def track_stale(state: ClusterState, job: Job) -> None:
    """Keep `job.stale_since_ns` (timed states only): the time since which the job has been a
    running gang below its minimum — some pods occupying, none succeeded, and fewer than
    `min_member` occupying or (`state.subgroup_stale`: kai-es/v4 on) a leaf sub-group with
    fewer occupying than its own `min_member` (`Job.leaves_below_minimum`) — or 0 when it is
    not one (KAI's stale gang: `IsStale`).

    With `state.handover_stamps` (kai-es/v7 on) the PodGroup's stale timestamp, when set, is the
    time a gang turning stale is stale since, and a stale gang is moved to it when it names
    another second than the kept time (the annotation carries seconds: kai-es's own time written
    back and read again is the same second and changes nothing). A timestamp later than the
    event counts as the event's time, one at or before the epoch as 1 ns after it."""
    # (on the fold's hot path, once per event that changes a job's occupancy: `Job.min_member`
    # written out, and a job that is not stale and was not returns after a few comparisons)
    occupying, spec = job.occupying, job.spec
    stale = job.succeeded == 0 and 0 < occupying and (
        occupying < (spec.min_member if spec is not None else 1)
        or (state.subgroup_stale and spec is not None and bool(spec.subgroups) and bool(job.leaves_below_minimum())))
    if not stale and not job.stale_since_ns:
        return
    stamp = None
    if stale and state.handover_stamps and spec is not None and spec.stale_timestamp_ns is not None:
        stamp = max(1, min(spec.stale_timestamp_ns, state.event_ns))  # 0 is "not stale"
    if stale and not job.stale_since_ns:
        job.stale_since_ns = state.event_ns if stamp is None else stamp
        state.stale_jobs.add(job.key)
        state.gangs_below_minimum.add(job.key)
    elif stale and stamp is not None and stamp // 1_000_000_000 != job.stale_since_ns // 1_000_000_000:
        job.stale_since_ns = stamp
        state.stale_jobs.add(job.key)
    elif not stale and job.stale_since_ns:
        job.stale_since_ns = 0
        state.stale_jobs.add(job.key)
        state.gangs_below_minimum.discard(job.key)


def pod_queue(state: ClusterState, pod: PodState) -> str:
    job = state.jobs.get(pod.job_key)
    if job is not None and job.queue:
        return job.queue
    return pod.spec.queue


def set_pending(state: ClusterState, pod: PodState, pending: bool, job: Job | None = None) -> None:
    """Put the pod in (`pending`, when it is of kai-es's scheduler) or take it out of its job's
    pending pods, and the job in or out of its queue's pending jobs. `job`, when the caller has
    it at hand, must be the pod's job (`state.jobs[pod.job_key]`): it saves the lookup. A pod
    with scheduling gates is not pending where gates are honoured (`state.honours_gates`), nor
    a terminating one where `state.failed_binds_honour_deletion` (kai-es/v15 on; before, only
    the callers that observe the pod left terminating pods out: a failed bind put one back)."""
    old = pod.pending_key
    spec = pod.spec
    new = None
    if pending and spec.scheduler_name == state.scheduler_name and not (spec.scheduling_gates and state.honours_gates) \
            and not (spec.terminating and state.failed_binds_honour_deletion):
        # (built by tuple.__new__, without the NamedTuple's Python-level __new__: a hot path of the fold)
        new = tuple.__new__(PendingPod, (-spec.task_priority, spec.created_ns, spec.uid, pod.key))
        if new == old:
            return
    elif old is None:
        return  # the job's pending set is unchanged (job field changes reindex in refresh_job)
    if job is None:
        job = state.jobs[pod.job_key]
    state.stale_jobs.add(job.key)
    if old is not None:
        job.pending.remove(old)
    pod.pending_key = new
    if new is not None:
        insort(job.pending, new)
    _reindex_job(state, job)


def _reindex_job(state: ClusterState, job: Job) -> None:
    """Keep `state.pending_jobs[queue]` in step with the job's pending pods and sort key."""
    old = job.index_key
    new = None
    if job.pending:
        new = tuple.__new__(PendingJob, (-job.priority, job.created_ns, job.uid, job.queue, job.key))  # (as above)
        if new == old:
            return  # still pending under the same key
    elif old is None:
        return  # not pending, not indexed
    if old is not None:
        old_queue = old.queue
        bucket = state.pending_jobs.get(old_queue)
        state.stale_pending.add(old_queue)
        if bucket is not None:
            bucket.remove(old)
            if not bucket:
                del state.pending_jobs[old_queue]
    job.index_key = new
    if new is not None:
        state.stale_pending.add(job.queue)
        bucket = state.pending_jobs.get(job.queue)
        if bucket is None:
            bucket = state.pending_jobs[job.queue] = SortedOnRead()
        bucket.add(new)


def refresh_job(state: ClusterState, job: Job, *, changed: bool = True) -> None:
    """Recompute a job's queue, priority and age from its spec and members; move its usage.

    Each field is the PodGroup's when it sets one, else the first member's (by key), except the
    age, which is then the oldest member's. Marks the job stale: callers that change a job's
    members or spec call this (or `refresh_or_drop_job`) after. `changed=False` (the caller
    changed nothing of the job itself) marks it only if a recomputed field differs."""
    pods = state.pods
    members = sorted(job.members) if len(job.members) > 1 else list(job.members)
    created: int | None = 0
    queue, class_name, explicit, uid, mode = "", "", None, job.key, ""
    if members:
        first = pods[members[0]].spec
        queue, class_name, explicit, uid, mode = (
            first.queue, first.priority_class, first.priority, first.uid, first.preemptibility)
        created = first.created_ns if len(members) == 1 else None  # None: the oldest, if needed
    spec = job.spec
    if spec is not None:
        queue = spec.queue or queue
        class_name = spec.priority_class or class_name
        uid = spec.uid or uid
        mode = spec.preemptibility or mode
        created = spec.created_ns or created
    if created is None:
        created = min(pods[m].spec.created_ns for m in members)
    priority = resolve_priority(state, class_name, explicit)
    preemptible, semi = _preemptibility(mode, priority)
    if semi != job.semi:
        job.semi = semi
        if semi:
            state.semi_jobs.add(job.key)
        else:
            state.semi_jobs.discard(job.key)
    if job.occupying and (preemptible != job.preemptible or priority != job.priority or created != job.created_ns
                          or uid != job.uid):
        # where its pods run, the victims on offer changed: caches that follow node changes
        # (`scheduling.tables.changed_since`) look at those nodes again, and at its pods there
        for m in members:
            pod = pods[m]
            if pod.status in OCCUPYING and pod.node:
                state.dirty_nodes.add(pod.node)
                state.victim_order_changed.add(m)
    if queue != job.queue or preemptible != job.preemptible:
        # job.occupying counts the members that occupy: skip the scan when there are none
        occupying = [pods[m] for m in members if pods[m].status in OCCUPYING] if job.occupying else []
        for pod in occupying:
            queue_usage(state, pod, -1)
        changed = True
        job.queue = queue
        job.preemptible = preemptible
        for pod in occupying:
            queue_usage(state, pod, +1)
    if changed or priority != job.priority or created != job.created_ns or uid != job.uid:
        state.stale_jobs.add(job.key)
    if priority != job.priority and job.occupying and job.preemptible and job.queue:
        index_victim(state, job, job.priority, -1)
        index_victim(state, job, priority, +1)
    job.priority, job.created_ns, job.uid = priority, created, uid
    _reindex_job(state, job)


def _preemptibility(mode: str, priority: int) -> tuple[bool, bool]:
    """(preemptible, semi-preemptible) of a job of preemptibility `mode` ("" when neither its
    PodGroup nor its pod says) and `priority`. A semi-preemptible job is preemptible above its
    minimum shape: the reducer counts it as preemptible; the cycle's rule
    (`rules.semi_preemptible`) keeps its minimum in quota."""
    preemptible = (mode != "non-preemptible") if mode else priority < NON_PREEMPTIBLE_PRIORITY
    return preemptible, mode == "semi-preemptible"


def new_job(state: ClusterState, key: str, spec: p.PodObserved, member: str) -> Job:
    """Create and add the job `key` (not in `state.jobs`) of the pod `member` observed with `spec`,
    its only member, as `job_for` then `refresh_job` would make it. (Every implicit PodGroup is
    created so, nearly once per pod; refresh_job's outcome for a job without a PodGroup and with
    one pod, none occupying or pending, written out: its fields are the pod's, the age its
    creation time; its queue and mode count no usage yet and no index holds it.)"""
    priority = resolve_priority(state, spec.priority_class, spec.priority)
    preemptible, semi = _preemptibility(spec.preemptibility, priority)
    # positional: keyword calls to these many-field dataclasses cost measurably more per pod
    job = Job(key, spec.namespace, spec.podgroup, None, spec.implicit_podgroup, spec.queue, priority,
              spec.created_ns, spec.uid, {member}, [], 0, preemptible, semi)
    state.jobs[key] = job
    if semi:
        state.semi_jobs.add(key)
    state.stale_jobs.add(key)
    return job


def job_for(state: ClusterState, spec: p.PodObserved) -> Job:
    key = pod_key(spec.namespace, spec.podgroup)
    job = state.jobs.get(key)
    if job is None:
        # positional: keyword calls to these many-field dataclasses cost measurably more per pod
        job = Job(key, spec.namespace, spec.podgroup, None, spec.implicit_podgroup)
        state.jobs[key] = job  # marked by the refresh_job that follows a member's arrival
    return job


def refresh_or_drop_job(state: ClusterState, job: Job) -> None:
    """After a job lost a member or its spec: forget it when nothing holds it, else refresh it."""
    if not job.members and job.spec is None:
        if job.pending or job.index_key is not None:  # (else _reindex_job has nothing to do)
            _reindex_job(state, job)
        del state.jobs[job.key]
        state.stale_jobs.add(job.key)
        state.gangs_below_minimum.discard(job.key)
        if job.semi:
            state.semi_jobs.discard(job.key)
    else:
        refresh_job(state, job)


def podgroup_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.PodGroupObserved = env.data
    if bounds.duration_problem("preemptionDelay", spec.preemption_delay_ns) or \
            bounds.duration_problem("stalenessGracePeriod", spec.staleness_grace_ns, signed=True):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    key = pod_key(spec.namespace, spec.name)
    if state.resync_seen:
        mark_seen(state, "PodGroup", key)
    job = state.jobs.get(key)
    if job is None:
        job = Job(key=key, namespace=spec.namespace, name=spec.name, spec=spec, implicit=False)
        state.jobs[key] = job
    job.spec = spec
    job.implicit = False
    refresh_job(state, job)
    if state.timed:
        track_stale(state, job)


def podgroup_removed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    job = state.jobs.get(key)
    if job is None or job.spec is None:
        state.ignored_events += 1
        return
    had_subgroups = bool(job.spec.subgroups)
    job.spec = None
    refresh_or_drop_job(state, job)
    if state.subgroup_stale and had_subgroups:
        state.occupancy_changed.add(key)  # its sub-groups are gone: judged again (kai-es/v4 on)


def priorityclass_observed(state: ClusterState, env: Envelope) -> None:
    data: p.PriorityClassObserved = env.data
    if state.resync_seen:
        mark_seen(state, "PriorityClass", data.name)
    if state.priority_classes.get(data.name) != data.value:
        state.priority_classes[data.name] = data.value
        state.stale_priority_classes.add(data.name)
        refresh_all_jobs(state)


def priorityclass_removed(state: ClusterState, env: Envelope) -> None:
    if state.priority_classes.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_priority_classes.add(env.data.name)
    refresh_all_jobs(state)


def refresh_all_jobs(state: ClusterState) -> None:
    for key in sorted(state.jobs):
        refresh_job(state, state.jobs[key], changed=False)
