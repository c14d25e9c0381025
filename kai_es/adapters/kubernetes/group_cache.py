"""The podgrouper's answer per pod, kept while nothing it reads has changed (the informer's
`PodGroupingSource`: most changes of a pod are status changes, which cannot change its group).

Contract:
- `inputs(pod, chain, related, pods_version)` is everything `podgrouper.group_pod` reads for a
  pod: the pod without `status` and without the metadata the API server rewrites on every
  write (`resourceVersion`, `managedFields`), its owner chain and the related objects as the
  caller read them, and the version of the live-pod index (`PodIndex`, read by an MPIJob's
  launcher rule; not for a pod without owners, whose rule reads no other pod). The pod's spec is compared whole (a LeaderWorkerSet's leader reads
  `spec.nodeName`), but for a pod without owners (KAI's default grouper, which does not read
  it): its binding is no change. An object read from the API server is compared by its identity and
  `resourceVersion` (the server gives every write a new one), one without a version (an
  owner known only by its reference) by value.
  `tests/test_group_cache.py` holds `group_pod` to never reading what `inputs` leaves out.
- `GroupCache.get(pod_key, inputs)` gives the answer `put` stored for that pod with equal
  inputs, else `MISS`. An answer is the PodGroup (the same object each time: it is compared
  by value downstream) and the sub-group, or None for a pod the podgrouper leaves ungrouped;
  the caller re-annotates the pod as it is now (`podgrouper.annotate`). Errors are never
  stored: a pod that could not be grouped is tried again on its next change.
- One entry per pod: `drop(pod_key)` when the pod is deleted, `keep_only(keys)` after a relist.
  Its size is bounded by the live pods, as the grouping source's other maps are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kai_es.ingest.object_digest import digest, stable_metadata

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Answer:
    """What the podgrouper said: the PodGroup and the pod's sub-group ("" for none), or no
    group at all (`podgroup` None: the pod is passed on unannotated)."""

    podgroup: dict[str, Any] | None
    subgroup: str = ""


#: `GroupCache.get` when the inputs are not those of the stored answer
MISS: Final = Answer(None, "\0miss")


def inputs(pod: Mapping[str, Any], chain: Sequence[Mapping[str, Any]],
           related: Mapping[tuple[str, str], Mapping[str, Any]], pods_version: int) -> bytes | None:
    """Everything the podgrouper reads for `pod` (see the module docstring), as the 128-bit
    BLAKE2b digest of its JSON bytes: equal bytes are equal inputs, types included (`1`, `1.0`
    and `true` differ), and the cache holds 16 bytes a pod, no reference to the objects. None
    when it cannot be encoded (not JSON): not cached."""
    stable = stable_metadata(pod.get("metadata"))
    rest = {k: v for k, v in pod.items() if k not in ("metadata", "status")}
    spec = rest.get("spec")
    if not chain and isinstance(spec, Mapping) and "nodeName" in spec:  # a bare pod: binding changes nothing
        rest["spec"] = {k: v for k, v in spec.items() if k != "nodeName"}
    return digest((stable, rest, [_version(o) for o in chain],
                   sorted([*k, _version(o)] for k, o in related.items()), pods_version if chain else 0))


def _version(obj: Mapping[str, Any]) -> Any:
    """An object read from the API server as its identity and resourceVersion; else itself."""
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if not isinstance(version, str) or not version or not isinstance(meta, Mapping):
        return obj
    return [str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("namespace")),
            str(meta.get("name")), str(meta.get("uid")), version]


class GroupCache:
    """The last answer per pod with the inputs it was given for (contract: module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[Key, tuple[bytes, Answer]] = {}
        self.hits = 0

    def get(self, pod_key: Key, key: bytes) -> Answer:
        entry = self._entries.get(pod_key)
        if entry is not None and entry[0] == key:
            self.hits += 1
            return entry[1]
        return MISS

    def put(self, pod_key: Key, key: bytes, answer: Answer) -> None:
        self._entries[pod_key] = (key, answer)

    def drop(self, pod_key: Key) -> None:
        self._entries.pop(pod_key, None)

    def keep_only(self, pod_keys: Iterable[Key]) -> None:
        keep = set(pod_keys)
        for gone in [k for k in self._entries if k not in keep]:
            del self._entries[gone]

    def __len__(self) -> int:
        return len(self._entries)
