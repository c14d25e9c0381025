"""Snapshots of the folded state and its digest.

Contract:
- `snapshot(state)` is canonical: every collection is sorted by a unique key, so two states
  that hold the same content give byte-identical snapshots whatever order they were built in.
- It includes the derived indexes (usage per node, device and queue; pending order), so that
  `digest(restore(snapshot(s))) == digest(s)` holds only if incremental maintenance is right.
- `restore` rebuilds every index from the base facts; it never trusts the derived numbers, and
  leaves the incremental digest's kept hashes marked incomplete (all recomputed when next asked).
- `digest` is the full digest (policy `kai-es/v1`): sha256 of the whole snapshot, O(state).
  `kai_es.state.incremental_digest` keeps a digest of the same content at O(changes).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from kai_es.events import payloads as p
from kai_es.events.codec import canonical
from kai_es.state import reducer as r
from kai_es.state.handlers import jobs, occupancy
from kai_es.state.model import OCCUPYING, ClusterState, Job, MoveHold, NodeState, PodState, QueueState
from kai_es.state.sorted_on_read import SortedOnRead

SNAPSHOT_FORMAT = 1


class NodeSnap(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    spec: p.NodeObserved
    used_milli_cpu: int
    used_memory_bytes: int
    used_pods: int
    releasing_milli_cpu: int
    releasing_memory_bytes: int
    releasing_pods: int
    device_used: list[int]
    device_releasing: list[int]
    device_sharers: list[int]
    group_holders: dict[str, dict[str, int]]
    pods: list[str]
    used_scalar: dict[str, int] = {}  # omitted when empty, as in every log before it existed


class PodSnap(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    spec: p.PodObserved
    job_key: str
    status: str
    node: str
    devices: list[int]
    gpu_groups: list[str]
    device_milli: int
    decision_id: str
    bind_failures: int
    backoff_until_ns: int
    started_ns: int
    last_unschedulable: str
    nominated_node: str = ""  # omitted when empty, as in every log before reservations
    bind_final_message: str = ""  # omitted when empty, as in every log before final bind failures
    eviction_refused_ns: int = 0  # omitted when 0, as in every log before policy kai-es/v3


class JobSnap(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    namespace: str
    name: str
    spec: p.PodGroupObserved | None
    implicit: bool
    queue: str
    priority: int
    created_ns: int
    uid: str
    occupying: int
    preemptible: bool
    members: list[str]
    pending: list[str]


class TimedJobSnap(JobSnap, frozen=True, kw_only=True, omit_defaults=True):
    """A job with times (timed states only). `job_snap` gives a plain JobSnap when every time is
    0, so that states without them encode (JSON and msgpack, hence digest) as before they
    existed; `job_form` brings a decoded one back to that form."""

    last_evicted_ns: int = 0
    stale_since_ns: int = 0
    succeeded: int = 0
    search_failures: int = 0
    search_retry_ns: int = 0


class QueueSnap(msgspec.Struct, frozen=True, kw_only=True):
    spec: p.QueueObserved
    allocated_milli_cpu: int
    allocated_memory_bytes: int
    allocated_milli_gpu: int
    nonpreemptible_milli_cpu: int
    nonpreemptible_memory_bytes: int
    nonpreemptible_milli_gpu: int


class UsageQueueSnap(QueueSnap, frozen=True, kw_only=True, omit_defaults=True):
    """A queue with time-based fair share's usage (kept only when configured; as TimedJobSnap,
    a plain QueueSnap when there is none): bucket -> integrals as decimal strings (they outgrow
    64-bit integers, which msgpack, hence the digest, cannot carry)."""

    usage: dict[str, list[str]] = {}
    usage_since_ns: int = 0


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    format: int
    position: int
    logicaltime: int
    records: int
    cycle: int
    completed_cycle: int
    config_digest: str
    config: dict[str, object]
    nodes: list[NodeSnap]
    pods: list[PodSnap]
    jobs: list[TimedJobSnap]
    queues: list[UsageQueueSnap]
    pending_jobs: dict[str, list[str]]
    priority_classes: dict[str, int]
    topologies: dict[str, list[str]]
    resync_seen: dict[str, list[str]]
    rejected_objects: int
    ignored_events: int
    # omitted when empty, so states without them digest as before they existed
    namespaces: dict[str, dict[str, str]] = {}
    claims: list[p.ClaimObserved] = []
    volumes: list[p.VolumeObserved] = []
    config_maps: list[str] = []
    capacity_usage: dict[str, list[str]] = {}
    capacity_since_ns: int = 0
    move_holds: dict[str, list[MoveHold]] = {}
    tried_order: list[str] = []
    tried_order_cycle: int = 0


def usage_form(buckets: dict[int, list[int]]) -> dict[str, list[str]]:
    """The canonical form of usage buckets (sorted by bucket; integers as decimal strings)."""
    return {str(b): [str(v) for v in buckets[b]] for b in sorted(buckets)}


def usage_of(form: dict[str, list[str]]) -> dict[int, list[int]]:
    return {int(b): [int(v) for v in values] for b, values in form.items()}


def job_form(j: JobSnap) -> JobSnap:
    """The canonical form of a decoded job snapshot (a plain JobSnap when it has no times)."""
    if isinstance(j, TimedJobSnap) and not (j.last_evicted_ns or j.stale_since_ns or j.succeeded
                                            or j.search_failures or j.search_retry_ns):
        return JobSnap(**{f: getattr(j, f) for f in JobSnap.__struct_fields__})
    return j


def queue_form(q: QueueSnap) -> QueueSnap:
    """The canonical form of a decoded queue snapshot (a plain QueueSnap without usage)."""
    if isinstance(q, UsageQueueSnap) and not (q.usage or q.usage_since_ns):
        return QueueSnap(**{f: getattr(q, f) for f in QueueSnap.__struct_fields__})
    return q


def node_snap(n: NodeState) -> NodeSnap:
    """The canonical form of one node (its facts and its derived usage)."""
    return NodeSnap(spec=n.spec, used_milli_cpu=n.used_milli_cpu, used_memory_bytes=n.used_memory_bytes,
                    used_pods=n.used_pods, releasing_milli_cpu=n.releasing_milli_cpu,
                    releasing_memory_bytes=n.releasing_memory_bytes, releasing_pods=n.releasing_pods,
                    device_used=list(n.device_used), device_releasing=list(n.device_releasing),
                    device_sharers=list(n.device_sharers),
                    group_holders={g: {str(d): c for d, c in sorted(h.items())}
                                   for g, h in sorted(n.group_holders.items())} if n.group_holders else {},
                    pods=sorted(n.pods), used_scalar=dict(sorted(n.used_scalar.items())) if n.used_scalar else {})


def pod_snap(x: PodState, spec: Any = None) -> PodSnap:
    """The canonical form of one pod (`spec`: its spec in another form, for a digest that hashes
    one: `kai_es.state.legacy_spec_form`)."""
    return PodSnap(spec=x.spec if spec is None else spec, job_key=x.job_key, status=x.status, node=x.node, devices=list(x.devices),
                   gpu_groups=list(x.gpu_groups), device_milli=x.device_milli, decision_id=x.decision_id,
                   bind_failures=x.bind_failures, backoff_until_ns=x.backoff_until_ns,
                   started_ns=x.started_ns, last_unschedulable=x.last_unschedulable,
                   nominated_node=x.nominated_node, bind_final_message=x.bind_final_message,
                   eviction_refused_ns=x.eviction_refused_ns)


def job_snap(j: Job) -> JobSnap:
    """The canonical form of one job (members sorted, pending pods in their order)."""
    if j.last_evicted_ns or j.stale_since_ns or j.succeeded or j.search_failures or j.search_retry_ns:
        return TimedJobSnap(**_job_fields(j), last_evicted_ns=j.last_evicted_ns,
                            stale_since_ns=j.stale_since_ns, succeeded=j.succeeded,
                            search_failures=j.search_failures, search_retry_ns=j.search_retry_ns)
    return JobSnap(**_job_fields(j))


def _job_fields(j: Job) -> dict[str, Any]:
    return {"key": j.key, "namespace": j.namespace, "name": j.name, "spec": j.spec, "implicit": j.implicit,
            "queue": j.queue, "priority": j.priority, "created_ns": j.created_ns, "uid": j.uid,
            "occupying": j.occupying, "preemptible": j.preemptible, "members": sorted(j.members),
            "pending": [e.pod_key for e in j.pending]}


def queue_snap(q: QueueState) -> QueueSnap:
    """The canonical form of one queue (its spec and derived allocation)."""
    fields: dict[str, Any] = {
        "spec": q.spec, "allocated_milli_cpu": q.allocated_milli_cpu,
        "allocated_memory_bytes": q.allocated_memory_bytes, "allocated_milli_gpu": q.allocated_milli_gpu,
        "nonpreemptible_milli_cpu": q.nonpreemptible_milli_cpu,
        "nonpreemptible_memory_bytes": q.nonpreemptible_memory_bytes,
        "nonpreemptible_milli_gpu": q.nonpreemptible_milli_gpu}
    if q.usage or q.usage_since_ns:
        return UsageQueueSnap(**fields, usage=usage_form(q.usage), usage_since_ns=q.usage_since_ns)
    return QueueSnap(**fields)


def pending_list(bucket: SortedOnRead) -> list[str]:
    """The canonical form of one queue's pending-jobs index: job keys in scheduling order."""
    return [r.job_key_of_index(e) for e in bucket]


def snapshot(state: ClusterState) -> Snapshot:
    """The canonical snapshot of `state`."""
    return Snapshot(
        format=SNAPSHOT_FORMAT, position=state.position, logicaltime=state.logicaltime,
        records=state.records, cycle=state.cycle, completed_cycle=state.completed_cycle,
        config_digest=state.config_digest, config=state.config,
        nodes=[node_snap(state.nodes[name]) for name in state.node_names],
        pods=[pod_snap(state.pods[k]) for k in sorted(state.pods)],
        jobs=[job_snap(state.jobs[k]) for k in sorted(state.jobs)],  # type: ignore[misc]
        queues=[queue_snap(state.queues[k]) for k in sorted(state.queues)],  # type: ignore[misc]
        pending_jobs={q: pending_list(lst) for q, lst in sorted(state.pending_jobs.items())},
        priority_classes=dict(sorted(state.priority_classes.items())),
        topologies=dict(sorted(state.topologies.items())),
        resync_seen={k: sorted(v) for k, v in sorted(state.resync_seen.items())},
        rejected_objects=state.rejected_objects, ignored_events=state.ignored_events,
        namespaces={k: dict(sorted(v.items())) for k, v in sorted(state.namespaces.items())},
        claims=[state.claims[k] for k in sorted(state.claims)],
        volumes=[state.volumes[k] for k in sorted(state.volumes)],
        config_maps=sorted(state.config_maps),
        capacity_usage=usage_form(state.capacity_usage), capacity_since_ns=state.capacity_since_ns,
        move_holds={k: list(v) for k, v in sorted(state.move_holds.items())},
        tried_order=list(state.tried_order), tried_order_cycle=state.tried_order_cycle,
    )


def snapshot_bytes(state: ClusterState) -> bytes:
    """Canonical JSON bytes of the snapshot."""
    return canonical(snapshot(state))


def snapshot_sha256(snap: Snapshot) -> str:
    """sha256 of the canonical bytes of `snap`, as `sha256:<hex>`."""
    return "sha256:" + hashlib.sha256(canonical(snap)).hexdigest()


def digest(state: ClusterState) -> str:
    """The full digest: sha256 of the canonical snapshot, as `sha256:<hex>`."""
    return "sha256:" + hashlib.sha256(snapshot_bytes(state)).hexdigest()


def load_snapshot(data: bytes) -> Snapshot:
    """Decode snapshot bytes (raises msgspec errors on malformed input)."""
    return msgspec.json.decode(data, type=Snapshot)


def restore(snap: Snapshot) -> ClusterState:
    """A state rebuilt from the base facts of `snap`, every index recomputed."""
    if snap.format != SNAPSHOT_FORMAT:
        raise ValueError(f"snapshot format {snap.format} is not {SNAPSHOT_FORMAT}")
    st = ClusterState(
        position=snap.position, logicaltime=snap.logicaltime, records=snap.records,
        cycle=snap.cycle, completed_cycle=snap.completed_cycle, config_digest=snap.config_digest,
        config=dict(snap.config), priority_classes=dict(snap.priority_classes),
        topologies={k: list(v) for k, v in snap.topologies.items()},
        resync_seen={k: set(v) for k, v in snap.resync_seen.items()},
        rejected_objects=snap.rejected_objects, ignored_events=snap.ignored_events,
        namespaces={k: dict(v) for k, v in snap.namespaces.items()},
        claims={r.pod_key(c.namespace, c.name): c for c in snap.claims},
        volumes={v.name: v for v in snap.volumes}, config_maps=set(snap.config_maps),
        capacity_usage=usage_of(snap.capacity_usage), capacity_since_ns=snap.capacity_since_ns,
        move_holds={k: list(v) for k, v in snap.move_holds.items()},
        tried_order=list(snap.tried_order), tried_order_cycle=snap.tried_order_cycle,
    )
    r.derive_config_flags(st)
    for q in snap.queues:
        st.queues[q.spec.name] = QueueState(spec=q.spec)
        if isinstance(q, UsageQueueSnap):
            st.queues[q.spec.name].usage = usage_of(q.usage)
            st.queues[q.spec.name].usage_since_ns = q.usage_since_ns
    for n in snap.nodes:
        g = n.spec.gpus
        st.nodes[n.spec.name] = NodeState(spec=n.spec, device_used=[0] * g,
                                          device_releasing=[0] * g, device_sharers=[0] * g)
        st.node_names.add(n.spec.name)
    for j in snap.jobs:
        st.jobs[j.key] = Job(key=j.key, namespace=j.namespace, name=j.name, spec=j.spec,
                             implicit=j.implicit)
        if isinstance(j, TimedJobSnap):
            job = st.jobs[j.key]
            job.last_evicted_ns, job.stale_since_ns, job.succeeded = j.last_evicted_ns, j.stale_since_ns, j.succeeded
            job.search_failures, job.search_retry_ns = j.search_failures, j.search_retry_ns
            if job.stale_since_ns:
                st.gangs_below_minimum.add(j.key)
    for ps in snap.pods:
        pod = PodState(key=r.pod_key(ps.spec.namespace, ps.spec.name), spec=ps.spec,
                       job_key=ps.job_key, decision_id=ps.decision_id,
                       bind_failures=ps.bind_failures, backoff_until_ns=ps.backoff_until_ns,
                       started_ns=ps.started_ns, last_unschedulable=ps.last_unschedulable,
                       nominated_node=ps.nominated_node, bind_final_message=ps.bind_final_message,
                       eviction_refused_ns=ps.eviction_refused_ns)
        st.pods[pod.key] = pod
        if pod.nominated_node:
            st.nominated.add(pod.key)
        st.jobs[pod.job_key].members.add(pod.key)
        occupancy.index_labels(st, pod, +1)
    for key in sorted(st.jobs):
        jobs.refresh_job(st, st.jobs[key])
    for ps in snap.pods:
        pod = st.pods[r.pod_key(ps.spec.namespace, ps.spec.name)]
        if ps.status in OCCUPYING:
            occupancy.occupy(st, pod, ps.node, ps.devices, ps.gpu_groups, ps.status, trust_devices=True)
            if st.nodes.get(ps.node) is None:
                pod.device_milli = ps.device_milli
        elif not ps.spec.terminating:
            jobs.set_pending(st, pod, True)
    st.hashes.complete = False  # built here, not only by the reducer: the next digest re-hashes all
    return st
