"""State snapshots for a fast scheduler start: the validation that decides whether a stored
snapshot (`kai_es.ports.SnapshotStore`) may replace folding from the beginning.

Contract:
- A snapshot is taken at a cycle cut: `position` is the CycleStarted position, `data` the
  canonical snapshot bytes (`kai_es.state.snapshot.snapshot_bytes`) of the state folded exactly
  up to it, `completed_position` the position of that cycle's CycleCompleted, and `digest` the
  `statedigest` that CycleCompleted records: the state digest of its policy version
  (`kai_es.scheduling.policy`; under `kai-es/v1` and `kai-es/v2` it is ``sha256:`` of `data`).
- Snapshots are an optimisation, never the source of truth. `restore_validated` accepts one only
  if the log's CycleCompleted at `completed_position` is based on `position`, and (a) the state
  restored from the snapshot (every index recomputed) has, under that CycleCompleted's policy
  version, the stored digest, and (b) that CycleCompleted records that same digest. Otherwise it
  logs a warning naming the position and returns None: fold from 0.
"""

from __future__ import annotations

import hashlib
import logging

import msgspec

from kai_es.events import payloads as p
from kai_es.ports import EventLog, SnapshotStore
from kai_es.scheduling.policy import UnknownPolicy, state_digest
from kai_es.state import ClusterState
from kai_es.state.snapshot import load_snapshot, restore

log = logging.getLogger(__name__)


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def restore_validated(store: SnapshotStore, events: EventLog) -> ClusterState | None:
    """The newest stored snapshot restored, if it passes checks (a) and (b); else None."""
    try:
        snap = await store.load_latest()
    except ValueError as exc:  # the store could not decode what it holds
        log.warning("snapshot rejected: %s; folding the log from the beginning", exc)
        return None
    if snap is None:
        return None
    where = f"snapshot at position {snap.position} (cycle {snap.cycle})"
    try:
        state = restore(load_snapshot(snap.data))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, KeyError) as exc:
        log.warning("%s rejected: it does not restore (%s); folding the log from the beginning",
                    where, exc)
        return None
    recorded, version = None, ""
    records = events.read(snap.completed_position)
    try:
        async for record in records:
            if record.position == snap.completed_position:
                env = record.envelope
                if isinstance(env.data, p.CycleCompleted) and env.basedon == snap.position:
                    recorded, version = env.statedigest or "", env.policyversion or ""
            break
    finally:
        aclose = getattr(records, "aclose", None)
        if aclose is not None:
            await aclose()
    if recorded is None:
        log.warning("%s rejected: no CycleCompleted based on it at position %d in the log; "
                    "folding the log from the beginning", where, snap.completed_position)
        return None
    try:
        got = state_digest(version, state)
    except UnknownPolicy as exc:
        log.warning("%s rejected: its CycleCompleted at position %d has %s; folding the log from "
                    "the beginning", where, snap.completed_position, exc)
        return None
    if got != snap.digest or state.position != snap.position:
        log.warning("%s rejected: restored state digest %s != stored %s; folding the log from the "
                    "beginning", where, got, snap.digest)
        return None
    if recorded != snap.digest:
        log.warning("%s rejected: its digest %s != the statedigest %r the log recorded at "
                    "position %d; folding the log from the beginning", where, snap.digest,
                    recorded, snap.completed_position)
        return None
    log.info("restored %s (digest verified against the log at position %d)", where,
             snap.completed_position)
    return state


__all__ = ["restore_validated", "sha256_of"]
