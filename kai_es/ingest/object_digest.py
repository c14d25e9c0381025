"""What the informer's caches key a Kubernetes object's reading by (`pod_memo`: a pod's
translation; `adapters.kubernetes.group_cache`: its PodGroup): a digest of the JSON of what was
read, with the metadata the API server rewrites on every write left out.

Contract: `stable_metadata(meta)` is `meta` without `resourceVersion` and `managedFields` (what
is not a map, as it is); `digest(value)` the 128-bit BLAKE2b digest of `value`'s JSON bytes —
equal bytes are equal inputs, types included (`1`, `1.0` and `true` differ), and a cache keeps
16 bytes an object, no reference to it — or None when `value` is not JSON (not cached).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import msgspec

#: metadata the API server changes on every write of any field: never read by the translation
#: nor by the podgrouper
VOLATILE_METADATA: Final = frozenset({"resourceVersion", "managedFields"})
_ENCODE: Final = msgspec.json.Encoder().encode


def stable_metadata(meta: Any) -> Any:
    """`meta` without the volatile fields (module docstring)."""
    return {k: v for k, v in meta.items() if k not in VOLATILE_METADATA} if isinstance(meta, Mapping) else meta


def digest(value: Any) -> bytes | None:
    """The 128-bit digest of `value`'s JSON bytes; None when it cannot be encoded."""
    try:
        encoded = _ENCODE(value)
    except (TypeError, ValueError):  # msgspec's EncodeError is a ValueError
        return None
    return hashlib.blake2b(encoded, digest_size=16).digest()
