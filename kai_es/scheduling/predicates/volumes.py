"""Volumes: a pod cannot start without its PersistentVolumeClaims and ConfigMaps, and a claim
bound to a volume with node affinity (a local volume) restricts the nodes. Pure.

Contract:
- `pod_problem(state, spec)` is the reason a pod can run on no node because of its volumes —
  a claim that does not exist or is Lost, a bound claim whose volume does not exist, a
  ConfigMap that does not exist (optional ConfigMaps are not listed by ingest) — or None.
- `volume_terms(state, spec)` lists (volume name, claim, required node terms) for each bound
  claim whose volume has node affinity; a node must satisfy every volume's terms. A claim still
  Pending (not bound yet: WaitForFirstConsumer) restricts nothing.
"""

from __future__ import annotations

from kai_es.events import payloads as p
from kai_es.events.payloads import Reason
from kai_es.state.model import ClusterState

CLAIM_NOT_FOUND = "PersistentVolumeClaimNotFound"
CLAIM_LOST = "PersistentVolumeClaimLost"
VOLUME_NOT_FOUND = "PersistentVolumeNotFound"
CONFIG_MAP_NOT_FOUND = "ConfigMapNotFound"
VOLUME_NODE_AFFINITY = "VolumeNodeAffinityConflict"


def pod_problem(state: ClusterState, spec: p.PodObserved) -> Reason | None:
    ns = spec.namespace
    for name in spec.claims:
        claim = state.claims.get(f"{ns}/{name}")
        if claim is None:
            return Reason(code=CLAIM_NOT_FOUND, message=f"PersistentVolumeClaim {ns}/{name} does not exist")
        if claim.phase == "Lost":
            return Reason(code=CLAIM_LOST, message=f"PersistentVolumeClaim {ns}/{name} lost its volume")
        if claim.volume and claim.volume not in state.volumes:
            return Reason(code=VOLUME_NOT_FOUND, message=(
                f"PersistentVolumeClaim {ns}/{name} is bound to volume {claim.volume}, which does not exist"))
    for name in spec.config_maps:
        if f"{ns}/{name}" not in state.config_maps:
            return Reason(code=CONFIG_MAP_NOT_FOUND, message=f"ConfigMap {ns}/{name} does not exist")
    return None


def volume_terms(state: ClusterState, spec: p.PodObserved) -> list[tuple[str, str, tuple[p.NodeSelectorTerm, ...]]]:
    out = []
    for name in spec.claims:
        claim = state.claims.get(f"{spec.namespace}/{name}")
        if claim is None or not claim.volume:
            continue
        volume = state.volumes.get(claim.volume)
        if volume is not None and volume.node_affinity:
            out.append((volume.name, f"{spec.namespace}/{name}", volume.node_affinity))
    return out
