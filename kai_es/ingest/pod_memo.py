"""A pod's translation, reused across its watch events while what it is made of is unchanged.

Most events of a pod are its binding (`spec.nodeName`) and its status (phase, start time,
conditions, container states); translating the whole pod again for each cost the informer a
fifth of its CPU. Pure (no clock, no I/O); one per informer.

Contract:
- `PodMemo.translate(obj, ours=...)` returns exactly what `translate.translate(obj, ours=...)`
  returns, and raises exactly what it raises, for any object (`tests/test_pod_memo.py`).
- For a Pod it keeps, per pod (namespace/name), the last payload translated, keyed by (a
  128-bit digest of) the JSON bytes of everything the translation reads except the pod's node,
  phase and start time: the
  metadata without `resourceVersion` and `managedFields`, the spec without `nodeName`, and of
  the status only what the in-place-resize accounting reads (each container status's name,
  `resources` and `allocatedResources`; the `PodResizePending` conditions). A pod whose key is
  unchanged gets that payload with its node, phase and start time read again (validated as the
  translation validates them; any doubt — a bad phase or start time, a shared GPU of another
  scheduler whose node changed (`translate.unknown_devices`) — is translated afresh). Errors
  are never kept.
- `forget(namespace, name)` when the pod is deleted; at most `max_pods` pods are kept (the
  oldest entry goes first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from kai_es.events import payloads as p
from kai_es.ingest import translate as tr
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.object_digest import digest, stable_metadata


def _resizing(status: Mapping[str, Any]) -> Any:
    """What the resize accounting reads of the container statuses (`translate._container_statuses`:
    the first status of each name, from `containerStatuses` then `initContainerStatuses`), as
    [name, resources, allocatedResources] of those that report `resources` (one that does not
    counts as no status at all); a field that is not a list, as it is (the translation refuses it)."""
    first: dict[str, Mapping[str, Any]] = {}
    odd = []
    for field in ("containerStatuses", "initContainerStatuses"):
        raw = status.get(field)
        if raw is None:
            continue
        if not isinstance(raw, list):
            odd.append([field, raw])
            continue
        for cs in raw:
            if isinstance(cs, Mapping) and isinstance(cs.get("name"), str):
                first.setdefault(cs["name"], cs)
    return [odd, [[name, cs.get("resources"), cs.get("allocatedResources")]
                  for name, cs in first.items() if cs.get("resources") is not None]]


def _conditions(raw: Any) -> Any:
    """What the resize accounting reads of the pod's conditions: the `PodResizePending` ones'
    reasons (others are skipped; none at all is an empty list); not a list, as it is."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        return raw
    return [c.get("reason") for c in raw if isinstance(c, Mapping) and c.get("type") == "PodResizePending"]


def key_of(obj: Mapping[str, Any], ours: str) -> bytes | None:
    """The 128-bit BLAKE2b digest of the JSON bytes a pod's payload depends on, its node, phase
    and start time left out (see the module docstring): the bytes themselves would cost ~1.5 KB
    a pod kept. None when they cannot be encoded (not JSON): not memoised."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    status = obj.get("status")
    status = {} if status is None else status  # no status reads as an empty one
    stable = stable_metadata(meta)
    unplaced = {k: v for k, v in spec.items() if k != "nodeName"} if isinstance(spec, Mapping) else spec
    resize = [_resizing(status), _conditions(status.get("conditions"))] if isinstance(status, Mapping) else status
    rest = {k: v for k, v in obj.items() if k not in ("metadata", "spec", "status")}
    return digest((ours, rest, stable, unplaced, resize))


class PodMemo:
    """`translate.translate` with each pod's last payload kept (contract: module docstring)."""

    def __init__(self, max_pods: int = 200_000) -> None:
        self.max_pods = max_pods
        self._pods: dict[tuple[str, str], tuple[bytes, p.PodObserved]] = {}
        self.hits = 0

    def translate(self, obj: Mapping[str, Any], *, ours: str = SCHEDULER_NAME) -> p.Payload:
        if not isinstance(obj, Mapping) or obj.get("kind") != "Pod" or obj.get("apiVersion") != "v1":
            return tr.translate(obj, ours=ours)
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return tr.translate(obj, ours=ours)
        pod_id = (str(meta.get("namespace")), str(meta.get("name")))
        key = key_of(obj, ours)
        entry = self._pods.get(pod_id)
        if key is not None and entry is not None and entry[0] == key:
            reused = self._reuse(obj, entry[1], ours)
            if reused is not None:
                self.hits += 1
                return reused
        payload = tr.translate(obj, ours=ours)
        if key is not None and isinstance(payload, p.PodObserved):
            self._pods.pop(pod_id, None)
            self._pods[pod_id] = (key, payload)
            if len(self._pods) > self.max_pods:
                del self._pods[next(iter(self._pods))]
        return payload

    @staticmethod
    def _reuse(obj: Mapping[str, Any], last: p.PodObserved, ours: str) -> p.PodObserved | None:
        """`last` with `obj`'s node, phase and start time, or None when it must be translated."""
        try:
            phase = tr.pod_phase(obj)
            node_name = tr.pod_node_name(obj)
            started = tr.pod_started_ns(obj)
        except (tr.IngestError, TypeError, ValueError, AttributeError):
            return None  # translated afresh: the error is the translation's own
        gpu = last.gpu
        if node_name != last.node_name and last.scheduler_name != ours and (
                gpu.whole or gpu.fraction_milli or gpu.gpu_memory_mib):
            return None  # another scheduler's GPUs: what they count depends on the node (unknown_devices)
        return msgspec.structs.replace(last, node_name=node_name, phase=phase, started_ns=started)

    def forget(self, namespace: str, name: str) -> None:
        self._pods.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._pods)
