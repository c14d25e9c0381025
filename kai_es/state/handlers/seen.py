"""Resync bookkeeping shared by every observation handler: what a relist has seen.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.state.model import ClusterState


def mark_seen(state: ClusterState, kind: str, key: str) -> None:
    seen = state.resync_seen.get(kind)
    if seen is not None:
        seen.add(key)
        state.stale_resync.add(kind)
