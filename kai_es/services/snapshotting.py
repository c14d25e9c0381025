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
from collections.abc import Sequence

import msgspec

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.codec import canonical
from kai_es.ports import EventLog, SnapshotStore, StoredSnapshot
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.policy import UnknownPolicy, policy_for, state_digest
from kai_es.state import ClusterState
from kai_es.state.snapshot import load_snapshot, restore, snapshot

log = logging.getLogger(__name__)


def cut_snapshot(state: ClusterState, config: SchedulerConfig, decisions: Sequence[Envelope]) -> bytes | None:
    """The canonical snapshot bytes of `state`, folded exactly to a cycle's cut, for a stored
    snapshot of that cycle, whose `decisions` (run under `config`) end with its CycleCompleted:
    None when that records no state digest, or (logged as an error) when the snapshot's own
    digest is not the one it records."""
    recorded = decisions[-1].statedigest if decisions else None
    if not recorded:
        return None
    snap = snapshot(state)
    if policy_for(config.policy_version).snapshot_digest(snap) != recorded:
        log.error("the snapshot at position %d does not match the cycle's statedigest; "
                  "not saving it", state.position)
        return None
    return canonical(snap)


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
    completed = None
    records = events.read(snap.completed_position)
    try:
        async for record in records:
            if record.position == snap.completed_position:
                completed = record.envelope
            break
    finally:
        aclose = getattr(records, "aclose", None)
        if aclose is not None:
            await aclose()
    return validated(snap, completed)


def validated(snap: StoredSnapshot, completed: Envelope | None) -> ClusterState | None:
    """`snap`'s state restored, if it passes checks (a) and (b) against `completed`, the log's
    record at `snap.completed_position` (None: the log has none); else None, with a warning
    naming the position and the reason."""
    where = f"snapshot at position {snap.position} (cycle {snap.cycle})"
    try:
        state = restore(load_snapshot(snap.data))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, KeyError) as exc:
        log.warning("%s rejected: it does not restore (%s); folding the log from the beginning",
                    where, exc)
        return None
    recorded, version = None, ""
    if completed is not None and isinstance(completed.data, p.CycleCompleted) and completed.basedon == snap.position:
        recorded, version = completed.statedigest or "", completed.policyversion or ""
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


__all__ = ["cut_snapshot", "restore_validated", "sha256_of", "validated"]
