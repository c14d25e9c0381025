"""Queue accounting: a pod's usage moved onto its queue (and its job's victim index and
sub-group counts) as it starts or stops occupying, or its job's queue or priority changes.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.state import usage
from kai_es.state.model import ClusterState, Job, PodState


def index_victim(state: ClusterState, job: Job, priority: int, sign: int) -> None:
    """Add (+1) or remove (-1) the job under its queue and `priority` in `state.victim_jobs`."""
    buckets = state.victim_jobs.get(job.queue)
    if sign > 0:
        if buckets is None:
            buckets = state.victim_jobs[job.queue] = {}
        keys = buckets.get(priority)
        if keys is None:
            keys = buckets[priority] = set()
        keys.add(job.key)
    elif buckets is not None:
        keys = buckets.get(priority)
        if keys is not None:
            keys.discard(job.key)
            if not keys:
                del buckets[priority]
                if not buckets:
                    del state.victim_jobs[job.queue]


def count_subgroup(job: Job, name: str, sign: int) -> None:
    """Add `sign` to `job.subgroup_occupying[name]` (deleting the name when it drops to 0)."""
    counts = job.subgroup_occupying
    n = counts.get(name, 0) + sign
    if n:
        counts[name] = n
    else:
        del counts[name]


def queue_usage(state: ClusterState, pod: PodState, sign: int, job: Job | None = None) -> None:
    """Add (`sign` +1) the pod's usage to its job's queue, or take it back (-1) from the queue
    it was added to (`PodState.accounted_queue`): a queue label that changed in between (the
    pod observed again with another queue) must not take from a queue that never got it.
    `job`, when the caller has it at hand, must be the pod's job (`state.jobs[pod.job_key]`);
    None looks it up (and a pod whose job is gone moves only its queue's usage)."""
    if job is None:
        job = state.jobs.get(pod.job_key)
    spec = pod.spec
    if job is not None:
        occupying = job.occupying = job.occupying + sign
        if spec.subgroup:
            count_subgroup(job, spec.subgroup, sign)
        state.stale_jobs.add(job.key)
        if occupying == (1 if sign > 0 else 0) and job.preemptible and job.queue:
            index_victim(state, job, job.priority, sign)
        if state.timed:
            state.occupancy_changed.add(job.key)  # judged once the event is folded (`apply`)
    if sign > 0:
        name = spec.queue if job is None else (job.queue or spec.queue)
        pod.accounted_queue = name
    else:
        name, pod.accounted_queue = pod.accounted_queue, ""
    q = state.queues.get(name)
    if q is None:
        return
    state.stale_queues.add(name)
    state.allocation_changes += 1
    state.allocation_changed = name
    if state.usage_resolution_ns:
        usage.accrue_queue(state, name, q, state.event_ns)
    requests = spec.requests
    cpu, memory = sign * requests.milli_cpu, sign * requests.memory_bytes
    gpu = sign * pod.device_milli * len(pod.devices)  # pod.milli_gpu
    q.allocated_milli_cpu += cpu
    q.allocated_memory_bytes += memory
    q.allocated_milli_gpu += gpu
    if job is not None and not job.preemptible:
        q.nonpreemptible_milli_cpu += cpu
        q.nonpreemptible_memory_bytes += memory
        q.nonpreemptible_milli_gpu += gpu
