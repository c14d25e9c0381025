"""The incremental state digest (policy `kai-es/v2`): a multiset hash over the state's entities.

Definition — a function of the state's content alone, not of the order it was built in:

    digest = "mset-sha256:" + 64 hex digits of
             ( H("state", "", header) + sum of H(kind, key, form) over every entity ) mod 2**256

where H(...) is the sha256 of the triple's deterministic msgpack encoding (msgspec's
`order="deterministic"`: struct fields in declaration order, map keys sorted; twice as fast as
the canonical JSON and as unambiguous), read as a big-endian integer.
The entities are every node, pod, job and queue, each queue's pending-jobs index, each priority
class, topology, resync seen-set, namespace, PersistentVolumeClaim, PersistentVolume and
ConfigMap, and each owner's move holds (kai-es/v8), each in the canonical form a snapshot holds (`kai_es.state.snapshot`); the header holds the rest of the snapshot (format, position, logical
time, record and cycle counters, config and its digest, rejected and ignored counts). So it
covers exactly what the full digest covers, derived indexes included: states with equal
snapshots have equal digests, and states whose snapshots differ have different ones unless
sha256 sums collide.

Contract:
- `incremental_digest(state)` re-hashes only the entities the reducer marked in the state's
  stale sets (`ClusterState.stale_*`) since the last call (and the small header), keeping each entity's hash and the running sum in
  `state.hashes`: O(changes), not O(state). It updates that bookkeeping and nothing else;
  `refresh_hashes(state)` does the same without the header (a scheduler's upkeep between cycles).
- `snapshot_digest(snap)` computes the same value from scratch over a snapshot, and
  `recomputed_digest(state)` over the snapshot of `state`, ignoring the bookkeeping: the
  reference the tests hold the incremental one to (a missed mark in the reducer shows as a
  difference), and the check the scheduler makes before it stores a snapshot.
- A state whose `hashes.complete` is False (restored from a snapshot) has every hash recomputed
  on the next call.

Why a sum: addition mod 2**256 is commutative and invertible, so one entity's hash is replaced
without touching the others, and the order entities are visited in cannot change the result.
Like the full digest it replaces, this is a consistency check of a state against its log, not a
defence against an adversary choosing entities: sums of hashes are easier to collide on purpose
than a single hash of everything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any, Final

import msgspec

from kai_es.events import payloads as p
from kai_es.state.legacy_spec_form import legacy_spec, twin
from kai_es.state.model import ClusterState
from kai_es.state.reducer import pod_key
from kai_es.state.snapshot import (
    SNAPSHOT_FORMAT,
    JobSnap,
    Snapshot,
    job_form,
    job_snap,
    node_snap,
    pending_list,
    pod_snap,
    queue_form,
    queue_snap,
    snapshot,
    usage_form,
)
from kai_es.state.versions import fold_rules

PREFIX: Final = "mset-sha256:"
MOD: Final = 2**256
_ENCODE: Final = msgspec.msgpack.Encoder(order="deterministic").encode

FormOf = Callable[[ClusterState, str], object | None]


def _node(state: ClusterState, key: str) -> object | None:
    n = state.nodes.get(key)
    return None if n is None else node_snap(n)


def _pod(state: ClusterState, key: str) -> object | None:
    x = state.pods.get(key)
    if x is None:
        return None
    return pod_snap(x) if state.name_ordered_specs else pod_snap(x, legacy_spec(x.spec))


#: PodGroupObserved's fields before schema version 5 added the handover times. msgspec gives a
#: struct of more than 15 fields a map16 header even when it omits the rest, so a spec that sets
#: none of the newer fields is hashed as this 15-field struct: its bytes, and every older log's
#: digest, stay what they were. (The JSON snapshot and the full digest have no such header.)
_SPEC_FIELDS_V4: Final = p.PodGroupObserved.__struct_fields__[:15]
_NEWER_SPEC_FIELDS: Final = p.PodGroupObserved.__struct_fields__[15:]
assert _NEWER_SPEC_FIELDS == ("stale_timestamp_ns", "last_eviction_timestamp_ns"), _NEWER_SPEC_FIELDS
_PodGroupFormV4: Final[Any] = twin(p.PodGroupObserved, _SPEC_FIELDS_V4, "PodGroupFormV4")


def job_digest_form(snap: JobSnap) -> JobSnap:
    """`snap` as the digest hashes it: its PodGroup spec in the older 15-field form when the
    spec sets none of the newer fields (`_PodGroupFormV4`)."""
    spec = snap.spec
    if spec is None or any(getattr(spec, name) is not None for name in _NEWER_SPEC_FIELDS):
        return snap
    form = _PodGroupFormV4(**{name: getattr(spec, name) for name in _SPEC_FIELDS_V4})
    return msgspec.structs.replace(snap, spec=form)


def _job(state: ClusterState, key: str) -> object | None:
    j = state.jobs.get(key)
    return None if j is None else job_digest_form(job_snap(j))


def _queue(state: ClusterState, key: str) -> object | None:
    q = state.queues.get(key)
    return None if q is None else queue_snap(q)


def _pending(state: ClusterState, key: str) -> object | None:
    bucket = state.pending_jobs.get(key)
    return None if bucket is None else pending_list(bucket)


def _priority_class(state: ClusterState, key: str) -> object | None:
    return state.priority_classes.get(key)


def _topology(state: ClusterState, key: str) -> object | None:
    return state.topologies.get(key)


def _resync(state: ClusterState, key: str) -> object | None:
    seen = state.resync_seen.get(key)
    return None if seen is None else sorted(seen)


def _namespace(state: ClusterState, key: str) -> object | None:
    return state.namespaces.get(key)  # its labels (a map: encoded with sorted keys)


def _claim(state: ClusterState, key: str) -> object | None:
    return state.claims.get(key)


def _volume(state: ClusterState, key: str) -> object | None:
    return state.volumes.get(key)


def _config_map(state: ClusterState, key: str) -> object | None:
    return True if key in state.config_maps else None


def _move_hold(state: ClusterState, key: str) -> object | None:
    return state.move_holds.get(key)  # the holds of one owner, in decision order


#: (kind, the `ClusterState` stale set marking it, its canonical form by key (None: absent),
#: all its keys)
KINDS: Final[tuple[tuple[str, str, FormOf, Callable[[ClusterState], Iterable[str]]], ...]] = (
    ("node", "stale_nodes", _node, lambda s: s.nodes),
    ("pod", "stale_pods", _pod, lambda s: s.pods),
    ("job", "stale_jobs", _job, lambda s: s.jobs),
    ("queue", "stale_queues", _queue, lambda s: s.queues),
    ("pending", "stale_pending", _pending, lambda s: s.pending_jobs),
    ("priorityclass", "stale_priority_classes", _priority_class, lambda s: s.priority_classes),
    ("topology", "stale_topologies", _topology, lambda s: s.topologies),
    ("resync", "stale_resync", _resync, lambda s: s.resync_seen),
    ("namespace", "stale_namespaces", _namespace, lambda s: s.namespaces),
    ("claim", "stale_claims", _claim, lambda s: s.claims),
    ("volume", "stale_volumes", _volume, lambda s: s.volumes),
    ("configmap", "stale_config_maps", _config_map, lambda s: s.config_maps),
    ("movehold", "stale_move_holds", _move_hold, lambda s: s.move_holds),
)
#: the names of the stale sets, one per kind
STALE_SETS: Final = tuple(k[1] for k in KINDS)
assert sorted(STALE_SETS) == sorted(f.name for f in fields(ClusterState) if f.name.startswith("stale_"))


#: msgpack carries integers in [-2**63, 2**64 - 1]; a form holding one outside that range (a sum
#: of many large quantities, a usage integral) is encoded with each such integer as this
#: extension type, its decimal digits as the data
BIG_INT_EXT: Final = 1
_MSGPACK_MIN: Final = -(2**63)
_MSGPACK_MAX: Final = 2**64 - 1


def _big_ints_tagged(value: object) -> object:
    """`value` (plain builtins) with every integer msgpack cannot carry as a BIG_INT_EXT."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if _MSGPACK_MIN <= value <= _MSGPACK_MAX:
            return value
        return msgspec.msgpack.Ext(BIG_INT_EXT, str(value).encode())
    if isinstance(value, dict):
        return {k: _big_ints_tagged(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_big_ints_tagged(v) for v in value]
    return value


def encode_form(value: object) -> bytes:
    """The deterministic msgpack encoding of `value`, whatever the size of its integers.

    Forms whose integers all fit msgpack encode exactly as they always did (so digests of
    existing logs do not change); the rare form with a larger one is converted to builtins
    (structs become maps) with those integers tagged, which no form without one can produce."""
    try:
        return _ENCODE(value)
    except OverflowError:
        return _ENCODE(_big_ints_tagged(msgspec.to_builtins(value, builtin_types=(msgspec.msgpack.Ext,))))


def entity_hash(kind: str, key: str, form: object) -> int:
    """H(kind, key, form) as an integer; any integer in `form` is accepted (`encode_form`)."""
    return int.from_bytes(hashlib.sha256(encode_form((kind, key, form))).digest(), "big")


def _header_hash(src: ClusterState | Snapshot) -> int:
    """H of what is not an entity; `src` is a state or its snapshot (same field names)."""
    header: dict[str, object] = {
        "format": SNAPSHOT_FORMAT, "position": src.position, "logicaltime": src.logicaltime,
        "records": src.records, "cycle": src.cycle, "completed_cycle": src.completed_cycle,
        "config_digest": src.config_digest, "config": src.config,
        "rejected_objects": src.rejected_objects, "ignored_events": src.ignored_events,
    }
    # the capacity's usage (time-based fair share) only when kept, so other states digest as before
    if src.capacity_since_ns:
        header["capacity_since_ns"] = src.capacity_since_ns
        header["capacity_usage"] = (src.capacity_usage if isinstance(src, Snapshot)
                                    else usage_form(src.capacity_usage))
    # the last cycle's tried order (kai-es/v13 on) only when kept, so other states digest as before
    if src.tried_order_cycle:
        header["tried_order_cycle"] = src.tried_order_cycle
        header["tried_order"] = src.tried_order
    return entity_hash("state", "", header)


def _render(total: int) -> str:
    return f"{PREFIX}{total % MOD:064x}"


def _all_hashes(state: ClusterState, kind: str, form_of: FormOf,
                keys_of: Callable[[ClusterState], Iterable[str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in sorted(keys_of(state)):
        form = form_of(state, key)
        if form is not None:
            out[key] = entity_hash(kind, key, form)
    return out


def snapshot_digest(snap: Snapshot) -> str:
    """The digest of the state `snap` is a snapshot of, from scratch over the snapshot itself."""
    if snap.format != SNAPSHOT_FORMAT:
        raise ValueError(f"snapshot format {snap.format} is not {SNAPSHOT_FORMAT}")
    h = entity_hash
    total = _header_hash(snap)
    total += sum(h("node", n.spec.name, n) for n in snap.nodes)
    if fold_rules(snap.config.get("policyVersion")).name_ordered_specs:
        total += sum(h("pod", pod_key(x.spec.namespace, x.spec.name), x) for x in snap.pods)
    else:  # (the spec as policies before kai-es/v16 hash it)
        total += sum(h("pod", pod_key(x.spec.namespace, x.spec.name),
                       msgspec.structs.replace(x, spec=legacy_spec(x.spec))) for x in snap.pods)
    total += sum(h("job", j.key, job_digest_form(job_form(j))) for j in snap.jobs)
    total += sum(h("queue", q.spec.name, queue_form(q)) for q in snap.queues)
    total += sum(h("pending", q, keys) for q, keys in snap.pending_jobs.items())
    total += sum(h("priorityclass", name, v) for name, v in snap.priority_classes.items())
    total += sum(h("topology", name, levels) for name, levels in snap.topologies.items())
    total += sum(h("resync", kind, seen) for kind, seen in snap.resync_seen.items())
    total += sum(h("namespace", name, labels) for name, labels in snap.namespaces.items())
    total += sum(h("claim", pod_key(c.namespace, c.name), c) for c in snap.claims)
    total += sum(h("volume", v.name, v) for v in snap.volumes)
    total += sum(h("configmap", key, True) for key in snap.config_maps)
    total += sum(h("movehold", key, holds) for key, holds in snap.move_holds.items())
    return _render(total)


def recomputed_digest(state: ClusterState) -> str:
    """The digest computed from scratch, through a snapshot (does not read or touch
    `state.hashes` or `state.stale`)."""
    return snapshot_digest(snapshot(state))


def incremental_digest(state: ClusterState) -> str:
    """The digest, re-hashing only the entities marked stale since the last call."""
    refresh_hashes(state)
    return _render(state.hashes.total + _header_hash(state))


def refresh_hashes(state: ClusterState) -> None:
    """Bring `state.hashes` up to date: re-hash the entities marked stale since the last call
    (every entity when `hashes.complete` is False) and clear the marks. `incremental_digest` is
    this plus the header's hash; a scheduler calls it alone before a cycle is due
    (`kai_es.scheduling.upkeep`), so the cycle's digest hashes only what arrived after."""
    hashes = state.hashes
    if not hashes.complete:
        hashes.parts = {kind: _all_hashes(state, kind, form_of, keys_of)
                        for kind, _, form_of, keys_of in KINDS}
        hashes.total = sum(sum(parts.values()) for parts in hashes.parts.values()) % MOD
        hashes.complete = True
        for name in STALE_SETS:
            getattr(state, name).clear()
    else:
        # the keys in the set's order: each entity's hash is replaced in a sum, which no order
        # of the additions can change
        total = hashes.total
        for kind, field, form_of, _ in KINDS:
            keys: set[str] = getattr(state, field)
            if not keys:
                continue
            parts = hashes.parts.setdefault(kind, {})
            for key in keys:
                old = parts.pop(key, None)
                if old is not None:
                    total -= old
                form = form_of(state, key)
                if form is not None:
                    h = entity_hash(kind, key, form)
                    parts[key] = h
                    total += h
            keys.clear()
        hashes.total = total % MOD


