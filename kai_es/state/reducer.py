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
- One handler per event type, by entity: `kai_es.state.handlers` (nodes, pods, jobs, queues,
  cluster objects, config, decisions, binder outcomes, resyncs) over the shared bookkeeping
  (occupancy, queue accounting) and the domain's quantities and keys
  (`kai_es.state.quantities`, `kai_es.state.keys`).
- Every entity whose canonical form (`kai_es.state.snapshot`) a handler changes — created,
  changed or removed — is marked in `state.stale` (by the helper that changes it where there is
  one: `occupy`, `release`, `set_status`, `queue_usage`, `set_pending`, `reindex_job`,
  `refresh_job`), so the incremental digest (`kai_es.state.incremental_digest`) re-hashes it;
  the property tests compare that digest with a recomputation from scratch after every event
  and catch a forgotten mark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.state.handlers.binder import pod_bind_failed, pod_bound, pod_evicted, pod_eviction_failed
from kai_es.state.handlers.cluster import (
    claim_observed,
    claim_removed,
    config_map_observed,
    config_map_removed,
    namespace_observed,
    namespace_removed,
    topology_observed,
    topology_removed,
    volume_observed,
    volume_removed,
)
from kai_es.state.handlers.config import config_applied, derive_config_flags
from kai_es.state.handlers.decisions import (
    binding_decided,
    cycle_completed,
    cycle_started,
    eviction_decided,
    pod_pipelined,
    pod_unschedulable,
    reasons_fingerprint,
)
from kai_es.state.handlers.jobs import (
    podgroup_observed,
    podgroup_removed,
    priorityclass_observed,
    priorityclass_removed,
    track_stale,
)
from kai_es.state.handlers.nodes import node_observed, node_removed
from kai_es.state.handlers.pods import pod_observed, pod_removed
from kai_es.state.handlers.queues import queue_observed, queue_removed
from kai_es.state.handlers.resync import object_rejected, resync_completed, resync_started
from kai_es.state.keys import job_key_of_index, pod_key
from kai_es.state.model import ClusterState
from kai_es.state.quantities import device_count, device_milli_on, gpu_memory_milli

__all__ = [
    "HANDLERS", "Handler", "apply", "derive_config_flags", "device_count", "device_milli_on",
    "fold", "gpu_memory_milli", "job_key_of_index", "pod_key", "reasons_fingerprint", "track_stale",
]


Handler = Callable[[ClusterState, Envelope], None]


HANDLERS: Final[dict[type[p.Payload], Handler]] = {
    p.NodeObserved: node_observed,
    p.NodeRemoved: node_removed,
    p.PodObserved: pod_observed,
    p.PodRemoved: pod_removed,
    p.QueueObserved: queue_observed,
    p.QueueRemoved: queue_removed,
    p.PodGroupObserved: podgroup_observed,
    p.PodGroupRemoved: podgroup_removed,
    p.TopologyObserved: topology_observed,
    p.TopologyRemoved: topology_removed,
    p.PriorityClassObserved: priorityclass_observed,
    p.PriorityClassRemoved: priorityclass_removed,
    p.NamespaceObserved: namespace_observed,
    p.NamespaceRemoved: namespace_removed,
    p.ClaimObserved: claim_observed,
    p.ClaimRemoved: claim_removed,
    p.VolumeObserved: volume_observed,
    p.VolumeRemoved: volume_removed,
    p.ConfigMapObserved: config_map_observed,
    p.ConfigMapRemoved: config_map_removed,
    p.ResyncStarted: resync_started,
    p.ResyncCompleted: resync_completed,
    p.ObjectRejected: object_rejected,
    p.ConfigApplied: config_applied,
    p.CycleStarted: cycle_started,
    p.CycleCompleted: cycle_completed,
    p.BindingDecided: binding_decided,
    p.PodPipelined: pod_pipelined,
    p.EvictionDecided: eviction_decided,
    p.PodUnschedulable: pod_unschedulable,
    p.PodBound: pod_bound,
    p.PodBindFailed: pod_bind_failed,
    p.PodEvicted: pod_evicted,
    p.PodEvictionFailed: pod_eviction_failed,
}


def apply(state: ClusterState, record: Record) -> ClusterState:
    """Fold one record into `state` (in place) and return it. The one fold step: everything
    that folds records (fold, the scheduler service, replay, reports) goes through here."""
    env = record.envelope
    position = record.position
    if position <= state.position:
        raise ValueError(
            f"record at position {position} is not after the state's position {state.position}"
        )
    t = env.logicaltime
    state.event_ns = t
    HANDLERS[type(env.data)](state, env)
    changed = state.occupancy_changed
    if changed:
        # whether a gang runs short is judged on the event's outcome, not on the passing counts
        # of a pod re-seated within it (released and occupied again); one job (a pod's event,
        # nearly every time) needs no sort, and track_stale does not touch the set
        jobs = state.jobs
        for key in sorted(changed) if len(changed) > 1 else changed:
            job = jobs.get(key)
            if job is not None:
                track_stale(state, job)
        changed.clear()
    state.position = position
    state.records += 1
    if t > state.logicaltime:
        state.logicaltime = t
    return state


def fold(records: Iterable[Record], state: ClusterState | None = None) -> ClusterState:
    """Fold `records` into `state` (a new empty state when None)."""
    st = state if state is not None else ClusterState()
    for record in records:
        apply(st, record)
    return st
