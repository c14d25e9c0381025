"""The reducer: a deterministic fold of log records into `ClusterState`, one handler per type.

Contract:
- `apply(state, record)` mutates `state` in place and returns it. Its effect depends only on the
  state and the record: no clock, randomness, I/O or unordered iteration.
- It is total: an event that refers to something unknown (a bind for a removed pod, a second
  bind) changes nothing but `state.ignored_events`; an observation whose quantities are outside
  `kai_es.ingest.bounds` changes nothing but `state.rejected_objects`; it never raises on a
  valid envelope.
- Indexes (node usage, per-device milli-GPU, queue usage, pending jobs per queue, pending pods
  per job) are maintained incrementally; `kai_es.state.invariants` checks them against a
  recomputation from scratch.
- Every entity whose canonical form (`kai_es.state.snapshot`) a handler changes — created,
  changed or removed — is marked in `state.stale` (by the helper that changes it where there is
  one: `_occupy`, `_release`, `_set_status`, `_queue_usage`, `_set_pending`, `_reindex_job`,
  `_refresh_job`), so the incremental digest (`kai_es.state.incremental_digest`) re-hashes it;
  the property tests compare that digest with a recomputation from scratch after every event
  and catch a forgotten mark.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable
from typing import Final

from sortedcontainers import SortedList

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.timefmt import parse_duration
from kai_es.ingest import bounds
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.state import usage
from kai_es.state.versions import fold_rules
from kai_es.state.model import (
    BIND_BACKOFF_BASE_NS,
    BIND_BACKOFF_CAP_NS,
    DEFAULT_PRIORITY_CLASSES,
    NON_PREEMPTIBLE_PRIORITY,
    OCCUPYING,
    ClusterState,
    Job,
    NodeState,
    PodState,
    QueueState,
)


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def gpu_memory_milli(gpu_memory_mib: int, device_memory_mib: int) -> int:
    """Milli-GPU a gpu-memory request takes on a device of `device_memory_mib` (rounded up,
    at most a whole device; a whole device when the device's memory is unknown)."""
    if device_memory_mib <= 0:
        return 1000
    return min(1000, -(-gpu_memory_mib * 1000 // device_memory_mib))


def device_milli_on(node: p.NodeObserved, gpu: p.GpuRequest) -> int:
    """Milli-GPU per device that `gpu` takes on `node` (0 for a CPU-only pod).

    A gpu-memory request converts by the node's per-device memory, rounding up; on a node whose
    GPU memory is unknown it takes a whole device.
    """
    if gpu.whole:
        return 1000
    if gpu.fraction_milli:
        return gpu.fraction_milli
    if gpu.gpu_memory_mib:
        return gpu_memory_milli(gpu.gpu_memory_mib, node.gpu_memory_mib)
    return 0


def device_count(gpu: p.GpuRequest) -> int:
    """How many devices a pod holds."""
    if gpu.whole:
        return gpu.whole
    if gpu.fraction_milli or gpu.gpu_memory_mib:
        return max(1, gpu.fraction_devices)
    return 0


def resolve_priority(state: ClusterState, class_name: str, explicit: int | None) -> int:
    """Priority of a PriorityClass name: the observed object, else KAI's defaults, else 0."""
    if class_name:
        if class_name in state.priority_classes:
            return state.priority_classes[class_name]
        if class_name in DEFAULT_PRIORITY_CLASSES:
            return DEFAULT_PRIORITY_CLASSES[class_name]
    return explicit if explicit is not None else 0


# --- occupancy ------------------------------------------------------------------------------


def _assign_devices(node: NodeState, pod: PodState, milli: int, count: int) -> tuple[int, ...]:
    """Devices for an observed running pod whose devices the cluster did not state."""
    if count == 0:
        return ()
    n = len(node.device_used)
    known = node.group_device(pod.spec.gpu_group) if pod.spec.gpu_group else None
    if known is not None and count == 1:
        return (known,)
    chosen = [i for i in range(n) if node.device_used[i] + milli <= 1000][:count]
    if len(chosen) < count:  # the cluster over-committed: record the truth, invariants flag it
        chosen += [i for i in range(n) if i not in chosen][: count - len(chosen)]
    return tuple(chosen)


def _occupy(state: ClusterState, pod: PodState, node_name: str, devices: Iterable[int],
            groups: Iterable[str], status: str, *, trust_devices: bool = False) -> None:
    node = state.nodes.get(node_name)
    spec = pod.spec
    state.stale_pods.add(pod.key)
    pod.node = node_name
    pod.status = status  # type: ignore[assignment]
    pod.nominated_node = ""
    if node is None:  # bound to a node we do not know (yet): tracked, not counted
        pod.devices = tuple(devices)
        pod.gpu_groups = tuple(groups)
        pod.device_milli = 0
        _queue_usage(state, pod, +1)
        return
    gpu = spec.gpu
    shared = bool(gpu.fraction_milli or gpu.gpu_memory_mib)
    milli = device_milli_on(node.spec, gpu)
    count = device_count(gpu)
    device_used = node.device_used
    devs = tuple(devices)
    if devs and (min(devs) < 0 or max(devs) >= len(device_used)):  # indexes the node does not have
        devs = tuple(d for d in devs if 0 <= d < len(device_used))
    if len(devs) != count and not (trust_devices and devs):
        devs = _assign_devices(node, pod, milli, count)
    if not devs:
        milli = 0
    pod.devices, pod.device_milli = devs, milli
    grp = tuple(groups)
    if not grp and devs and shared:
        grp = (spec.gpu_group,) if spec.gpu_group else tuple(f"{node_name}/gpu{d}" for d in devs)
    pod.gpu_groups = grp
    requests = spec.requests
    node.used_milli_cpu += requests.milli_cpu
    node.used_memory_bytes += requests.memory_bytes
    node.used_pods += 1
    if spec.scalar_requests:
        _scalar_usage(node, spec, +1)
    if shared:
        for i, d in enumerate(devs):
            device_used[d] += milli
            node.device_sharers[d] += 1
            if i < len(grp) and grp[i]:
                held = node.group_holders.setdefault(grp[i], {})
                held[d] = held.get(d, 0) + 1
    else:
        for d in devs:
            device_used[d] += milli
    node.pods.add(pod.key)
    state.dirty_nodes.add(node_name)
    state.stale_nodes.add(node_name)
    if status == "Releasing":
        _releasing(node, pod, +1)
    _queue_usage(state, pod, +1)


def _release(state: ClusterState, pod: PodState) -> None:
    if pod.status not in OCCUPYING:
        return
    state.stale_pods.add(pod.key)
    _queue_usage(state, pod, -1)
    node = state.nodes.get(pod.node)
    if node is not None and pod.key in node.pods:
        spec = pod.spec
        if pod.status == "Releasing":
            _releasing(node, pod, -1)
        requests = spec.requests
        node.used_milli_cpu -= requests.milli_cpu
        node.used_memory_bytes -= requests.memory_bytes
        node.used_pods -= 1
        if spec.scalar_requests:
            _scalar_usage(node, spec, -1)
        device_used, milli = node.device_used, pod.device_milli
        if spec.gpu.fraction_milli or spec.gpu.gpu_memory_mib:
            groups = pod.gpu_groups
            for i, d in enumerate(pod.devices):
                device_used[d] -= milli
                node.device_sharers[d] -= 1
                if i < len(groups) and groups[i]:
                    held = node.group_holders.get(groups[i])
                    if held is not None and d in held:
                        held[d] -= 1
                        if held[d] == 0:
                            del held[d]
                        if not held:
                            del node.group_holders[groups[i]]
        else:
            for d in pod.devices:
                device_used[d] -= milli
        node.pods.discard(pod.key)
        state.dirty_nodes.add(pod.node)
        state.stale_nodes.add(pod.node)
    pod.status = "Pending"
    pod.node = ""
    pod.devices = ()
    pod.gpu_groups = ()
    pod.device_milli = 0


def _scalar_usage(node: NodeState, spec: p.PodObserved, sign: int) -> None:
    used = node.used_scalar
    for resource, amount in spec.scalar_requests.items():
        total = used.get(resource, 0) + sign * amount
        if total:
            used[resource] = total
        else:
            used.pop(resource, None)


def _index_labels(state: ClusterState, pod: PodState, sign: int) -> None:
    """Add (+1) or remove (-1) the pod in the label and affinity-holder indexes."""
    spec, key = pod.spec, pod.key
    index = state.pods_by_label
    for label, value in spec.labels.items():
        if sign > 0:
            index.setdefault(label, {}).setdefault(value, set()).add(key)
        else:
            values = index.get(label)
            if values is not None and value in values:
                values[value].discard(key)
                if not values[value]:
                    del values[value]
                    if not values:
                        del index[label]
    if spec.pod_affinity or spec.pod_anti_affinity or spec.preferred_pod_affinity or \
            spec.preferred_pod_anti_affinity:
        if sign > 0:
            state.affinity_pods.add(key)
        else:
            state.affinity_pods.discard(key)


def _releasing(node: NodeState, pod: PodState, sign: int) -> None:
    spec = pod.spec
    node.releasing_milli_cpu += sign * spec.requests.milli_cpu
    node.releasing_memory_bytes += sign * spec.requests.memory_bytes
    node.releasing_pods += sign
    for d in pod.devices:
        node.device_releasing[d] += sign * pod.device_milli


def _index_victim(state: ClusterState, job: Job, priority: int, sign: int) -> None:
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


def _count_subgroup(job: Job, name: str, sign: int) -> None:
    """Add `sign` to `job.subgroup_occupying[name]` (deleting the name when it drops to 0)."""
    counts = job.subgroup_occupying
    n = counts.get(name, 0) + sign
    if n:
        counts[name] = n
    else:
        del counts[name]


def _queue_usage(state: ClusterState, pod: PodState, sign: int) -> None:
    """Add (`sign` +1) the pod's usage to its job's queue, or take it back (-1) from the queue
    it was added to (`PodState.accounted_queue`): a queue label that changed in between (the
    pod observed again with another queue) must not take from a queue that never got it."""
    job = state.jobs.get(pod.job_key)
    spec = pod.spec
    if job is not None:
        job.occupying += sign
        if spec.subgroup:
            _count_subgroup(job, spec.subgroup, sign)
        state.stale_jobs.add(job.key)
        if job.preemptible and job.queue and job.occupying == (1 if sign > 0 else 0):
            _index_victim(state, job, job.priority, sign)
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


def track_stale(state: ClusterState, job: Job) -> None:
    """Keep `job.stale_since_ns` (timed states only): the time since which the job has been a
    running gang below its minimum — some pods occupying, none succeeded, and fewer than
    `min_member` occupying or (`state.subgroup_stale`: kai-es/v4 on) a leaf sub-group with
    fewer occupying than its own `min_member` (`Job.leaves_below_minimum`) — or 0 when it is
    not one (KAI's stale gang: `IsStale`)."""
    stale = job.succeeded == 0 and 0 < job.occupying and (
        job.occupying < job.min_member or (state.subgroup_stale and bool(job.leaves_below_minimum())))
    if stale and not job.stale_since_ns:
        job.stale_since_ns = state.event_ns
        state.stale_jobs.add(job.key)
        state.gangs_below_minimum.add(job.key)
    elif not stale and job.stale_since_ns:
        job.stale_since_ns = 0
        state.stale_jobs.add(job.key)
        state.gangs_below_minimum.discard(job.key)


def derive_config_flags(state: ClusterState) -> None:
    """Set the state's flags derived from its config (`timed`, `subgroup_stale`, the usage
    resolution and window).
    A config whose durations do not parse keeps usage off (the scheduler rejects such a config
    before it is ever applied)."""
    config = state.config
    rules = fold_rules(config.get("policyVersion"))  # the version's fold rules (`state.versions`)
    state.timed = rules.keeps_times
    state.subgroup_stale = rules.stale_subgroups
    fairshare = config.get("fairshare")
    resolution = window = 0
    if state.timed and isinstance(fairshare, dict) and fairshare.get("timeBased") is True:
        try:
            resolution = parse_duration(str(fairshare.get("usageResolution", "1m")))
            window = parse_duration(str(fairshare.get("windowSize", "168h")))
        except ValueError:
            resolution = window = 0
    if resolution <= 0 or window <= 0:
        resolution = window = 0
    state.usage_resolution_ns, state.usage_window_ns = resolution, window


def _pod_queue(state: ClusterState, pod: PodState) -> str:
    job = state.jobs.get(pod.job_key)
    if job is not None and job.queue:
        return job.queue
    return pod.spec.queue


# --- pending indexes ------------------------------------------------------------------------


def _set_pending(state: ClusterState, pod: PodState, pending: bool) -> None:
    old = pod.pending_key
    spec = pod.spec
    new = None
    if pending and spec.scheduler_name == SCHEDULER_NAME:
        new = (-spec.task_priority, spec.created_ns, spec.uid, pod.key)
        if new == old:
            return
    elif old is None:
        return  # the job's pending set is unchanged (job field changes reindex in _refresh_job)
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
        new = (-job.priority, job.created_ns, job.uid, f"{job.queue}\x00{job.key}")
        if new == old:
            return  # still pending under the same key
    elif old is None:
        return  # not pending, not indexed
    if old is not None:
        old_queue = old[3].split("\x00", 1)[0]
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
            bucket = state.pending_jobs[job.queue] = SortedList()
        bucket.add(new)


def job_key_of_index(index_key: tuple[int, int, str, str]) -> str:
    """The job key stored in a `pending_jobs` entry."""
    return index_key[3].split("\x00", 1)[1]


def _refresh_job(state: ClusterState, job: Job, *, changed: bool = True) -> None:
    """Recompute a job's queue, priority and age from its spec and members; move its usage.

    Each field is the PodGroup's when it sets one, else the first member's (by key), except the
    age, which is then the oldest member's. Marks the job stale: callers that change a job's
    members or spec call this (or `_refresh_or_drop_job`) after. `changed=False` (the caller
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
    preemptible = (mode == "preemptible") if mode else priority < NON_PREEMPTIBLE_PRIORITY
    if queue != job.queue or preemptible != job.preemptible:
        # job.occupying counts the members that occupy: skip the scan when there are none
        occupying = [pods[m] for m in members if pods[m].status in OCCUPYING] if job.occupying else []
        for pod in occupying:
            _queue_usage(state, pod, -1)
        changed = True
        job.queue = queue
        job.preemptible = preemptible
        for pod in occupying:
            _queue_usage(state, pod, +1)
    if changed or priority != job.priority or created != job.created_ns or uid != job.uid:
        state.stale_jobs.add(job.key)
    if priority != job.priority and job.occupying and job.preemptible and job.queue:
        _index_victim(state, job, job.priority, -1)
        _index_victim(state, job, priority, +1)
    job.priority, job.created_ns, job.uid = priority, created, uid
    _reindex_job(state, job)


def _job_for(state: ClusterState, spec: p.PodObserved) -> Job:
    key = pod_key(spec.namespace, spec.podgroup)
    job = state.jobs.get(key)
    if job is None:
        # positional: keyword calls to these many-field dataclasses cost measurably more per pod
        job = Job(key, spec.namespace, spec.podgroup, None, spec.implicit_podgroup)
        state.jobs[key] = job  # marked by the _refresh_job that follows a member's arrival
    return job


# --- handlers -------------------------------------------------------------------------------

Handler = Callable[[ClusterState, Envelope], None]


def _out_of_bounds_node(spec: p.NodeObserved) -> bool:
    return not (0 <= spec.gpus <= bounds.MAX_NODE_GPUS and 0 <= spec.milli_cpu <= bounds.MAX_QUANTITY
                and 0 <= spec.memory_bytes <= bounds.MAX_QUANTITY and 0 <= spec.max_pods <= bounds.MAX_NODE_PODS
                and 0 <= spec.gpu_memory_mib <= bounds.MAX_GPU_MEMORY_MIB
                and all(0 <= v <= bounds.MAX_QUANTITY for v in spec.scalar_resources.values()))


def _out_of_bounds_pod(spec: p.PodObserved) -> bool:
    # on every pod observation: written to cost a few comparisons (no generator unless needed)
    g, r = spec.gpu, spec.requests
    if not (0 <= r.milli_cpu <= _MAX_QUANTITY and 0 <= r.memory_bytes <= _MAX_QUANTITY):
        return True
    if g.whole or g.fraction_milli or g.gpu_memory_mib or g.fraction_devices != 1:
        if not (0 <= g.whole <= bounds.MAX_POD_GPUS and 0 <= g.fraction_milli < 1000
                and 0 <= g.gpu_memory_mib <= bounds.MAX_GPU_MEMORY_MIB
                and 1 <= g.fraction_devices <= bounds.MAX_POD_GPUS):
            return True
    if spec.scalar_requests and not all(0 <= v <= _MAX_QUANTITY for v in spec.scalar_requests.values()):
        return True
    return (spec.preemption_delay_ns is not None or spec.staleness_grace_ns is not None) and bool(
        bounds.duration_problem("preemption delay", spec.preemption_delay_ns)
        or bounds.duration_problem("staleness grace period", spec.staleness_grace_ns, signed=True))


_MAX_QUANTITY: Final = bounds.MAX_QUANTITY


def _node_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.NodeObserved = env.data
    if _out_of_bounds_node(spec):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    if state.resync_seen:
        _mark_seen(state, "Node", spec.name)
    node = state.nodes.get(spec.name)
    if node is None or node.spec != spec:
        state.node_set_version += 1
        state.stale_nodes.add(spec.name)
        if state.usage_resolution_ns:
            usage.accrue_capacity(state, state.event_ns)
    if node is None:
        state.nodes[spec.name] = NodeState(
            spec=spec, device_used=[0] * spec.gpus, device_releasing=[0] * spec.gpus,
            device_sharers=[0] * spec.gpus)
        state.node_names.add(spec.name)
        for pod in [state.pods[k] for k in sorted(state.pods) if state.pods[k].node == spec.name
                    and state.pods[k].status in OCCUPYING]:
            status, devices, groups = pod.status, pod.devices, pod.gpu_groups
            _queue_usage(state, pod, -1)
            pod.status = "Pending"
            _occupy(state, pod, spec.name, devices, groups, status)
        return
    if spec.gpus != len(node.device_used) or spec.gpu_memory_mib != node.spec.gpu_memory_mib:
        # device count or size changed: re-seat the node's pods on the new device list
        resident = [state.pods[k] for k in sorted(node.pods)]
        saved = [(pod, pod.status, pod.devices, pod.gpu_groups) for pod in resident]
        for pod in resident:
            _release(state, pod)
        node.spec = spec
        node.device_used = [0] * spec.gpus
        node.device_releasing = [0] * spec.gpus
        node.device_sharers = [0] * spec.gpus
        node.group_holders = {}
        for pod, status, devices, groups in saved:
            _occupy(state, pod, spec.name, devices, groups, status)
            _set_pending(state, pod, False)
        return
    node.spec = spec


def _node_removed(state: ClusterState, env: Envelope) -> None:
    _remove_node(state, env.data.name)


def _remove_node(state: ClusterState, name: str) -> None:
    if state.usage_resolution_ns and name in state.nodes:
        usage.accrue_capacity(state, state.event_ns)
    node = state.nodes.pop(name, None)
    if node is None:
        state.ignored_events += 1
        return
    state.node_names.remove(name)
    state.node_set_version += 1
    state.stale_nodes.add(name)
    for key in sorted(node.pods):
        pod = state.pods[key]
        state.stale_pods.add(key)
        status, devices, groups = pod.status, pod.devices, pod.gpu_groups
        _queue_usage(state, pod, -1)
        pod.status = "Pending"
        # still bound to a node that is gone: tracked as occupying nothing until it goes
        pod.node = name
        pod.status = status
        pod.devices, pod.gpu_groups, pod.device_milli = devices, groups, 0
        _queue_usage(state, pod, +1)


def _pod_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.PodObserved = env.data
    key = pod_key(spec.namespace, spec.name)
    pod = state.pods.get(key)
    if pod is not None:
        old_spec = pod.spec
        same_shape = old_spec.requests == spec.requests and old_spec.gpu == spec.gpu \
            and old_spec.scalar_requests == spec.scalar_requests
    else:
        same_shape = False
    # quantities already accepted for this pod need no second look (phase-only observations)
    if not same_shape and _out_of_bounds_pod(spec):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    if state.resync_seen:
        _mark_seen(state, "Pod", key)
    state.stale_pods.add(key)
    if spec.phase in ("Succeeded", "Failed"):
        if state.timed and spec.phase == "Succeeded":
            # a gang with a succeeded pod is finishing, not stale (the pod need not have been seen
            # before: a relist reports finished pods too)
            job = state.jobs.get(pod.job_key if pod is not None else pod_key(spec.namespace, spec.podgroup))
            if job is not None:
                job.succeeded += 1
                state.stale_jobs.add(job.key)
                track_stale(state, job)
        if pod is not None:
            _drop_pod(state, pod)
        return
    if pod is not None and pod.spec.uid != spec.uid:
        _drop_pod(state, pod)  # same name, new incarnation
        pod = None
        same_shape = False
    if pod is not None and pod.bind_final_message and pod.spec != spec:
        pod.bind_final_message = ""  # the pod changed: the binder's final verdict may not hold
        pod.bind_failures = 0
    if pod is None:
        job = _job_for(state, spec)
        pod = PodState(key, spec, job.key)  # positional, as in _job_for
        state.pods[key] = pod
        job.members.add(key)
        _refresh_job(state, job)
        if spec.labels or spec.pod_affinity or spec.pod_anti_affinity or spec.preferred_pod_affinity \
                or spec.preferred_pod_anti_affinity:
            _index_labels(state, pod, +1)
    elif not same_shape or _moved_job(pod, spec):
        status, node, devices, groups = pod.status, pod.node, pod.devices, pod.gpu_groups
        _release(state, pod)
        _set_pending(state, pod, False)
        old_job = state.jobs[pod.job_key]
        old_job.members.discard(key)
        _index_labels(state, pod, -1)
        pod.spec = spec
        _index_labels(state, pod, +1)
        job = _job_for(state, spec)
        job.members.add(key)
        pod.job_key = job.key
        _refresh_or_drop_job(state, old_job)
        _refresh_job(state, job)
        if status in OCCUPYING and not spec.node_name:
            _occupy(state, pod, node, devices, groups, status)
    else:
        old = pod.spec
        if old.labels != spec.labels or ((old.pod_affinity or old.pod_anti_affinity or old.preferred_pod_affinity
                                          or old.preferred_pod_anti_affinity or spec.pod_affinity
                                          or spec.pod_anti_affinity or spec.preferred_pod_affinity
                                          or spec.preferred_pod_anti_affinity)
                                         and (old.pod_affinity, old.pod_anti_affinity, old.preferred_pod_affinity,
                                              old.preferred_pod_anti_affinity)
                                         != (spec.pod_affinity, spec.pod_anti_affinity,
                                             spec.preferred_pod_affinity, spec.preferred_pod_anti_affinity)):
            _index_labels(state, pod, -1)
            pod.spec = spec
            _index_labels(state, pod, +1)
        pod.spec = spec
        if old.subgroup != spec.subgroup and pod.status in OCCUPYING:
            job = state.jobs[pod.job_key]
            if old.subgroup:
                _count_subgroup(job, old.subgroup, -1)
            if spec.subgroup:
                _count_subgroup(job, spec.subgroup, +1)
            if state.subgroup_stale and job.spec is not None and job.spec.subgroups:
                state.occupancy_changed.add(job.key)  # an occupying pod moved between sub-groups
        if old.queue != spec.queue or old.priority_class != spec.priority_class or \
                old.priority != spec.priority or old.created_ns != spec.created_ns:
            _refresh_job(state, state.jobs[pod.job_key])  # a field the job takes from its pods
    _reconcile_placement(state, pod, spec, env.logicaltime)


def _reconcile_placement(state: ClusterState, pod: PodState, spec: p.PodObserved, now: int) -> None:
    """Make the pod's placement agree with what the cluster reports.

    A pod with a node is bound (Running), or Releasing when terminating or when an eviction was
    decided. A pod without a node keeps an in-flight Binding or Releasing; a Running pod the
    cluster no longer places goes back to Pending.
    """
    if spec.node_name:
        status = "Releasing" if spec.terminating or pod.status == "Releasing" else "Running"
        if pod.status in OCCUPYING and pod.node == spec.node_name:
            if status != pod.status:
                _set_status(state, pod, status)
        else:
            _release(state, pod)
            _occupy(state, pod, spec.node_name, spec.gpu_devices,
                    (spec.gpu_group,) if spec.gpu_group else (), status)
        if not pod.started_ns:
            # the pod's own start time when the cluster reports one (a pod running before it was
            # first observed), else the time it was observed running
            pod.started_ns = spec.started_ns if 0 < spec.started_ns <= now else now
        if pod.pending_key is not None:
            _set_pending(state, pod, False)
    elif pod.status in ("Binding", "Releasing"):
        if pod.pending_key is not None:
            _set_pending(state, pod, False)
    else:
        if pod.status == "Running":
            _release(state, pod)
        _set_pending(state, pod, not spec.terminating)


def _moved_job(pod: PodState, new: p.PodObserved) -> bool:
    """Whether observing `new` moves the pod to another job (then it is re-seated from
    scratch, as when its resource shape changed). `pod.job_key` is always the key of
    `pod.spec`'s namespace and podgroup, so the new key is built only when one of those differs."""
    old = pod.spec
    if old.podgroup == new.podgroup and old.namespace == new.namespace:
        return False
    return pod.job_key != pod_key(new.namespace, new.podgroup)


def _set_status(state: ClusterState, pod: PodState, status: str) -> None:
    node = state.nodes.get(pod.node)
    state.stale_pods.add(pod.key)
    if node is not None:
        state.dirty_nodes.add(pod.node)
        state.stale_nodes.add(pod.node)
        if pod.status == "Releasing":
            _releasing(node, pod, -1)
        if status == "Releasing":
            _releasing(node, pod, +1)
    pod.status = status  # type: ignore[assignment]


def _drop_pod(state: ClusterState, pod: PodState) -> None:
    _release(state, pod)
    if pod.pending_key is not None:
        _set_pending(state, pod, False)
    spec = pod.spec
    if spec.labels or spec.pod_affinity or spec.pod_anti_affinity or spec.preferred_pod_affinity \
            or spec.preferred_pod_anti_affinity:
        _index_labels(state, pod, -1)
    del state.pods[pod.key]
    state.stale_pods.add(pod.key)
    job = state.jobs[pod.job_key]
    job.members.discard(pod.key)
    _refresh_or_drop_job(state, job)
    if len(state.stale_pods) + len(state.stale_jobs) > 2 * (len(state.pods) + len(state.jobs)) + 4096:
        _forget_hashes(state)


def _forget_hashes(state: ClusterState) -> None:
    """Drop the marks and have the next digest re-hash everything. Bounds the stale sets when
    nothing asks for the incremental digest (a log of a policy with another digest, a long cold
    fold): else they would keep the key of every pod that ever existed. Only removals make them
    outgrow the live state, so `_drop_pod` checks."""
    state.hashes.complete = False
    for marks in (state.stale_nodes, state.stale_pods, state.stale_jobs, state.stale_queues,
                  state.stale_pending, state.stale_priority_classes, state.stale_topologies,
                  state.stale_resync, state.stale_namespaces, state.stale_claims, state.stale_volumes,
                  state.stale_config_maps):
        marks.clear()


def _refresh_or_drop_job(state: ClusterState, job: Job) -> None:
    """After a job lost a member or its spec: forget it when nothing holds it, else refresh it."""
    if not job.members and job.spec is None:
        _reindex_job(state, job)
        del state.jobs[job.key]
        state.stale_jobs.add(job.key)
        state.gangs_below_minimum.discard(job.key)
    else:
        _refresh_job(state, job)


def _pod_removed(state: ClusterState, env: Envelope) -> None:
    data: p.PodRemoved = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or (data.uid and pod.spec.uid != data.uid):
        state.ignored_events += 1
        return
    _drop_pod(state, pod)


def _queue_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.QueueObserved = env.data
    if bounds.duration_problem("preemptMinRuntime", spec.preempt_min_runtime_ns) or \
            bounds.duration_problem("reclaimMinRuntime", spec.reclaim_min_runtime_ns):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    if state.resync_seen:
        _mark_seen(state, "Queue", spec.name)
    q = state.queues.get(spec.name)
    state.stale_queues.add(spec.name)
    if q is None:
        state.queues[spec.name] = q = QueueState(spec=spec)
        if state.usage_resolution_ns:
            q.usage_since_ns = state.event_ns
        for key in sorted(state.pods):
            pod = state.pods[key]
            if pod.status in OCCUPYING and _pod_queue(state, pod) == spec.name:
                job = state.jobs.get(pod.job_key)
                if job is not None:
                    job.occupying -= 1  # _queue_usage counts it again
                    if pod.spec.subgroup:
                        _count_subgroup(job, pod.spec.subgroup, -1)
                _queue_usage(state, pod, +1)
    else:
        q.spec = spec


def _queue_removed(state: ClusterState, env: Envelope) -> None:
    if state.queues.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_queues.add(env.data.name)


def _podgroup_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.PodGroupObserved = env.data
    if bounds.duration_problem("preemptionDelay", spec.preemption_delay_ns) or \
            bounds.duration_problem("stalenessGracePeriod", spec.staleness_grace_ns, signed=True):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    key = pod_key(spec.namespace, spec.name)
    if state.resync_seen:
        _mark_seen(state, "PodGroup", key)
    job = state.jobs.get(key)
    if job is None:
        job = Job(key=key, namespace=spec.namespace, name=spec.name, spec=spec, implicit=False)
        state.jobs[key] = job
    job.spec = spec
    job.implicit = False
    _refresh_job(state, job)
    if state.timed:
        track_stale(state, job)


def _podgroup_removed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    job = state.jobs.get(key)
    if job is None or job.spec is None:
        state.ignored_events += 1
        return
    had_subgroups = bool(job.spec.subgroups)
    job.spec = None
    _refresh_or_drop_job(state, job)
    if state.subgroup_stale and had_subgroups:
        state.occupancy_changed.add(key)  # its sub-groups are gone: judged again (kai-es/v4 on)


def _priorityclass_observed(state: ClusterState, env: Envelope) -> None:
    data: p.PriorityClassObserved = env.data
    if state.resync_seen:
        _mark_seen(state, "PriorityClass", data.name)
    if state.priority_classes.get(data.name) != data.value:
        state.priority_classes[data.name] = data.value
        state.stale_priority_classes.add(data.name)
        _refresh_all_jobs(state)


def _priorityclass_removed(state: ClusterState, env: Envelope) -> None:
    if state.priority_classes.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_priority_classes.add(env.data.name)
    _refresh_all_jobs(state)


def _refresh_all_jobs(state: ClusterState) -> None:
    for key in sorted(state.jobs):
        _refresh_job(state, state.jobs[key], changed=False)


def _topology_observed(state: ClusterState, env: Envelope) -> None:
    data: p.TopologyObserved = env.data
    if state.resync_seen:
        _mark_seen(state, "Topology", data.name)
    state.topologies[data.name] = list(data.levels)
    state.stale_topologies.add(data.name)


def _topology_removed(state: ClusterState, env: Envelope) -> None:
    if state.topologies.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_topologies.add(env.data.name)


def _namespace_observed(state: ClusterState, env: Envelope) -> None:
    data: p.NamespaceObserved = env.data
    if state.resync_seen:
        _mark_seen(state, "Namespace", data.name)
    state.namespaces[data.name] = dict(data.labels)
    state.stale_namespaces.add(data.name)


def _namespace_removed(state: ClusterState, env: Envelope) -> None:
    if state.namespaces.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_namespaces.add(env.data.name)


def _claim_observed(state: ClusterState, env: Envelope) -> None:
    data: p.ClaimObserved = env.data
    key = pod_key(data.namespace, data.name)
    if state.resync_seen:
        _mark_seen(state, "PersistentVolumeClaim", key)
    state.claims[key] = data
    state.stale_claims.add(key)


def _claim_removed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    if state.claims.pop(key, None) is None:
        state.ignored_events += 1
        return
    state.stale_claims.add(key)


def _volume_observed(state: ClusterState, env: Envelope) -> None:
    data: p.VolumeObserved = env.data
    if state.resync_seen:
        _mark_seen(state, "PersistentVolume", data.name)
    state.volumes[data.name] = data
    state.stale_volumes.add(data.name)


def _volume_removed(state: ClusterState, env: Envelope) -> None:
    if state.volumes.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_volumes.add(env.data.name)


def _config_map_observed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    if state.resync_seen:
        _mark_seen(state, "ConfigMap", key)
    state.config_maps.add(key)
    state.stale_config_maps.add(key)


def _config_map_removed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    if key not in state.config_maps:
        state.ignored_events += 1
    state.config_maps.discard(key)
    state.stale_config_maps.add(key)


def _mark_seen(state: ClusterState, kind: str, key: str) -> None:
    seen = state.resync_seen.get(kind)
    if seen is not None:
        seen.add(key)
        state.stale_resync.add(kind)


def _resync_started(state: ClusterState, env: Envelope) -> None:
    state.resync_seen[env.data.kind] = set()
    state.stale_resync.add(env.data.kind)


def _resync_completed(state: ClusterState, env: Envelope) -> None:
    kind = env.data.kind
    seen = state.resync_seen.pop(kind, None)
    if seen is None:
        state.ignored_events += 1
        return
    state.stale_resync.add(kind)
    if kind == "Node":
        for name in [n for n in state.node_names if n not in seen]:
            _remove_node(state, name)
    elif kind == "Pod":
        for key in [k for k in sorted(state.pods) if k not in seen]:
            _drop_pod(state, state.pods[key])
    elif kind == "Queue":
        for name in [n for n in sorted(state.queues) if n not in seen]:
            del state.queues[name]
            state.stale_queues.add(name)
    elif kind == "PodGroup":
        for key in [k for k in sorted(state.jobs) if state.jobs[k].spec is not None and k not in seen]:
            job = state.jobs[key]
            had_subgroups = bool(job.spec is not None and job.spec.subgroups)
            job.spec = None
            _refresh_or_drop_job(state, job)
            if state.subgroup_stale and had_subgroups:
                state.occupancy_changed.add(key)  # as in _podgroup_removed
    elif kind == "PriorityClass":
        gone = [n for n in sorted(state.priority_classes) if n not in seen]
        for name in gone:
            del state.priority_classes[name]
            state.stale_priority_classes.add(name)
        if gone:
            _refresh_all_jobs(state)
    elif kind == "Topology":
        for name in [n for n in sorted(state.topologies) if n not in seen]:
            del state.topologies[name]
            state.stale_topologies.add(name)
    elif kind == "Namespace":
        for name in [n for n in sorted(state.namespaces) if n not in seen]:
            del state.namespaces[name]
            state.stale_namespaces.add(name)
    elif kind == "PersistentVolumeClaim":
        for key in [k for k in sorted(state.claims) if k not in seen]:
            del state.claims[key]
            state.stale_claims.add(key)
    elif kind == "PersistentVolume":
        for name in [n for n in sorted(state.volumes) if n not in seen]:
            del state.volumes[name]
            state.stale_volumes.add(name)
    elif kind == "ConfigMap":
        gone = sorted(state.config_maps - seen)
        state.config_maps -= set(gone)
        state.stale_config_maps.update(gone)


def _object_rejected(state: ClusterState, env: Envelope) -> None:
    state.rejected_objects += 1


def _config_applied(state: ClusterState, env: Envelope) -> None:
    data: p.ConfigApplied = env.data
    state.config = dict(data.config)
    state.config_digest = data.config_digest
    was_kept, judged_subgroups = state.usage_resolution_ns, state.subgroup_stale
    derive_config_flags(state)
    if state.subgroup_stale != judged_subgroups and state.timed:
        # the rule changed (only a config of kai-es/v4 or later turns it on): jobs with
        # sub-groups are judged again by the new one, as of this event
        state.occupancy_changed.update(k for k, j in state.jobs.items() if j.spec is not None and j.spec.subgroups)
    if state.usage_resolution_ns and not was_kept:
        usage.start_all(state, env.logicaltime)
    elif was_kept and not state.usage_resolution_ns:
        usage.stop_all(state)


def _cycle_started(state: ClusterState, env: Envelope) -> None:
    state.cycle = env.data.cycle


def _cycle_completed(state: ClusterState, env: Envelope) -> None:
    state.completed_cycle = env.data.cycle


def _binding_decided(state: ClusterState, env: Envelope) -> None:
    data: p.BindingDecided = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status != "Pending":
        state.ignored_events += 1
        return
    pod.decision_id = env.id  # the pod is marked by _occupy
    pod.last_unschedulable = ""
    _occupy(state, pod, data.node, data.gpu_devices, data.gpu_groups, "Binding")
    _set_pending(state, pod, False)


def _pod_pipelined(state: ClusterState, env: Envelope) -> None:
    data: p.PodPipelined = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    state.stale_pods.add(pod.key)
    pod.last_unschedulable = ""
    # (logs written before reservations existed must fold to the state they recorded)
    if fold_rules(env.policyversion).pipelined_nominates and pod.status == "Pending":
        pod.nominated_node = data.node


def _eviction_decided(state: ClusterState, env: Envelope) -> None:
    data: p.EvictionDecided = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status not in ("Binding", "Running"):
        state.ignored_events += 1
        return
    pod.decision_id = env.id  # the pod is marked by _set_status
    _set_status(state, pod, "Releasing")
    if state.timed:
        job = state.jobs[pod.job_key]
        job.last_evicted_ns = env.logicaltime
        state.stale_jobs.add(job.key)


def _pod_unschedulable(state: ClusterState, env: Envelope) -> None:
    data: p.PodUnschedulable = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    state.stale_pods.add(pod.key)
    pod.last_unschedulable = reasons_fingerprint(data.reasons)


def reasons_fingerprint(reasons: list[p.Reason]) -> str:
    """What makes two unschedulable verdicts 'the same' (so an unchanged one is not re-announced)."""
    return "|".join(
        r.code + ":" + ",".join(f"{k}={v}" for k, v in sorted(r.numbers.items())) for r in reasons
    )


def _pod_bound(state: ClusterState, env: Envelope) -> None:
    data: p.PodBound = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    state.stale_pods.add(pod.key)
    pod.bind_failures = 0
    pod.backoff_until_ns = 0
    if pod.status == "Binding" and pod.node == data.node:
        _set_status(state, pod, "Running")
    elif pod.status in OCCUPYING and pod.node == data.node:
        pass
    else:
        _release(state, pod)
        _occupy(state, pod, data.node, data.gpu_devices, (), "Running")
        _set_pending(state, pod, False)
    if not pod.started_ns:
        pod.started_ns = env.logicaltime


def _pod_bind_failed(state: ClusterState, env: Envelope) -> None:
    data: p.PodBindFailed = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status != "Binding":
        state.ignored_events += 1
        return
    _release(state, pod)  # marks the pod (it was Binding)
    pod.bind_failures += 1
    if data.final:  # the binder gave up: no back-off to wait for, the pod is not picked again
        pod.bind_final_message = data.message or "bind failed"
        pod.backoff_until_ns = 0
    else:
        backoff = min(BIND_BACKOFF_CAP_NS, BIND_BACKOFF_BASE_NS << min(pod.bind_failures - 1, 20))
        pod.backoff_until_ns = env.logicaltime + backoff
    _set_pending(state, pod, True)


def _pod_evicted(state: ClusterState, env: Envelope) -> None:
    data: p.PodEvicted = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    if pod.status in ("Binding", "Running"):
        _set_status(state, pod, "Releasing")


def _pod_eviction_failed(state: ClusterState, env: Envelope) -> None:
    """The cluster refused the eviction: a pod still Releasing for that decision (and not
    terminating of its own accord) is Running again, so its capacity no longer counts as freeing."""
    data: p.PodEvictionFailed = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status != "Releasing" \
            or pod.decision_id != data.decision_id or pod.spec.terminating:
        state.ignored_events += 1
        return
    _set_status(state, pod, "Running")
    if state.timed:  # kai-es/v3 on: for the victim search's back-off (v1/v2 digests unchanged)
        pod.eviction_refused_ns = env.logicaltime
        state.stale_pods.add(pod.key)


HANDLERS: Final[dict[type[p.Payload], Handler]] = {
    p.NodeObserved: _node_observed,
    p.NodeRemoved: _node_removed,
    p.PodObserved: _pod_observed,
    p.PodRemoved: _pod_removed,
    p.QueueObserved: _queue_observed,
    p.QueueRemoved: _queue_removed,
    p.PodGroupObserved: _podgroup_observed,
    p.PodGroupRemoved: _podgroup_removed,
    p.TopologyObserved: _topology_observed,
    p.TopologyRemoved: _topology_removed,
    p.PriorityClassObserved: _priorityclass_observed,
    p.PriorityClassRemoved: _priorityclass_removed,
    p.NamespaceObserved: _namespace_observed,
    p.NamespaceRemoved: _namespace_removed,
    p.ClaimObserved: _claim_observed,
    p.ClaimRemoved: _claim_removed,
    p.VolumeObserved: _volume_observed,
    p.VolumeRemoved: _volume_removed,
    p.ConfigMapObserved: _config_map_observed,
    p.ConfigMapRemoved: _config_map_removed,
    p.ResyncStarted: _resync_started,
    p.ResyncCompleted: _resync_completed,
    p.ObjectRejected: _object_rejected,
    p.ConfigApplied: _config_applied,
    p.CycleStarted: _cycle_started,
    p.CycleCompleted: _cycle_completed,
    p.BindingDecided: _binding_decided,
    p.PodPipelined: _pod_pipelined,
    p.EvictionDecided: _eviction_decided,
    p.PodUnschedulable: _pod_unschedulable,
    p.PodBound: _pod_bound,
    p.PodBindFailed: _pod_bind_failed,
    p.PodEvicted: _pod_evicted,
    p.PodEvictionFailed: _pod_eviction_failed,
}


def apply(state: ClusterState, record: Record) -> ClusterState:
    """Fold one record into `state` (in place) and return it. The one fold step: everything
    that folds records (fold, the scheduler service, replay, reports) goes through here."""
    env = record.envelope
    if record.position <= state.position:
        raise ValueError(
            f"record at position {record.position} is not after the state's position {state.position}"
        )
    state.event_ns = env.logicaltime
    HANDLERS[type(env.data)](state, env)
    if state.occupancy_changed:
        # whether a gang runs short is judged on the event's outcome, not on the passing counts
        # of a pod re-seated within it (released and occupied again)
        jobs = state.jobs
        for key in sorted(state.occupancy_changed):
            job = jobs.get(key)
            if job is not None:
                track_stale(state, job)
        state.occupancy_changed.clear()
    state.position = record.position
    state.records += 1
    if env.logicaltime > state.logicaltime:
        state.logicaltime = env.logicaltime
    return state


def fold(records: Iterable[Record], state: ClusterState | None = None) -> ClusterState:
    """Fold `records` into `state` (a new empty state when None)."""
    st = state if state is not None else ClusterState()
    for record in records:
        apply(st, record)
    return st
