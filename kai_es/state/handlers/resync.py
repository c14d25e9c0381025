"""Relists: ResyncStarted / ResyncCompleted (objects a relist did not see are removed) and
ObjectRejected.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.state.handlers.jobs import refresh_all_jobs, refresh_or_drop_job
from kai_es.state.handlers.nodes import remove_node
from kai_es.state.handlers.pods import drop_pod
from kai_es.state.model import ClusterState


def resync_started(state: ClusterState, env: Envelope) -> None:
    state.resync_seen[env.data.kind] = set()
    state.stale_resync.add(env.data.kind)


def resync_completed(state: ClusterState, env: Envelope) -> None:
    kind = env.data.kind
    seen = state.resync_seen.pop(kind, None)
    if seen is None:
        state.ignored_events += 1
        return
    state.stale_resync.add(kind)
    if kind == "Node":
        for name in [n for n in state.node_names if n not in seen]:
            remove_node(state, name)
    elif kind == "Pod":
        for key in [k for k in sorted(state.pods) if k not in seen]:
            drop_pod(state, state.pods[key])
    elif kind == "Queue":
        for name in [n for n in sorted(state.queues) if n not in seen]:
            del state.queues[name]
            state.stale_queues.add(name)
    elif kind == "PodGroup":
        for key in [k for k in sorted(state.jobs) if state.jobs[k].spec is not None and k not in seen]:
            job = state.jobs[key]
            had_subgroups = bool(job.spec is not None and job.spec.subgroups)
            job.spec = None
            refresh_or_drop_job(state, job)
            if state.subgroup_stale and had_subgroups:
                state.occupancy_changed.add(key)  # as in podgroup_removed
    elif kind == "PriorityClass":
        gone = [n for n in sorted(state.priority_classes) if n not in seen]
        for name in gone:
            del state.priority_classes[name]
            state.stale_priority_classes.add(name)
        if gone:
            refresh_all_jobs(state)
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


def object_rejected(state: ClusterState, env: Envelope) -> None:
    state.rejected_objects += 1
