"""The other cluster objects the scheduler reads: topologies, namespaces, resource claims,
volumes, config maps.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.state.handlers.seen import mark_seen
from kai_es.state.keys import pod_key
from kai_es.state.model import ClusterState


def topology_observed(state: ClusterState, env: Envelope) -> None:
    data: p.TopologyObserved = env.data
    if state.resync_seen:
        mark_seen(state, "Topology", data.name)
    state.topologies[data.name] = list(data.levels)
    state.stale_topologies.add(data.name)


def topology_removed(state: ClusterState, env: Envelope) -> None:
    if state.topologies.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_topologies.add(env.data.name)


def namespace_observed(state: ClusterState, env: Envelope) -> None:
    data: p.NamespaceObserved = env.data
    if state.resync_seen:
        mark_seen(state, "Namespace", data.name)
    state.namespaces[data.name] = dict(data.labels)
    state.stale_namespaces.add(data.name)


def namespace_removed(state: ClusterState, env: Envelope) -> None:
    if state.namespaces.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_namespaces.add(env.data.name)


def claim_observed(state: ClusterState, env: Envelope) -> None:
    data: p.ClaimObserved = env.data
    key = pod_key(data.namespace, data.name)
    if state.resync_seen:
        mark_seen(state, "PersistentVolumeClaim", key)
    state.claims[key] = data
    state.stale_claims.add(key)


def claim_removed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    if state.claims.pop(key, None) is None:
        state.ignored_events += 1
        return
    state.stale_claims.add(key)


def volume_observed(state: ClusterState, env: Envelope) -> None:
    data: p.VolumeObserved = env.data
    if state.resync_seen:
        mark_seen(state, "PersistentVolume", data.name)
    state.volumes[data.name] = data
    state.stale_volumes.add(data.name)


def volume_removed(state: ClusterState, env: Envelope) -> None:
    if state.volumes.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_volumes.add(env.data.name)


def config_map_observed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    if state.resync_seen:
        mark_seen(state, "ConfigMap", key)
    state.config_maps.add(key)
    state.stale_config_maps.add(key)


def config_map_removed(state: ClusterState, env: Envelope) -> None:
    key = pod_key(env.data.namespace, env.data.name)
    if key not in state.config_maps:
        state.ignored_events += 1
    state.config_maps.discard(key)
    state.stale_config_maps.add(key)
