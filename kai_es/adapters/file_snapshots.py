"""Snapshots of scheduler state for the file log: one file beside the log, replaced atomically.

``<log>.snapshot`` holds the newest snapshot (`kai_es.services.snapshotting.encode_stored`);
a save writes a temp file, fsyncs it and renames it over the old one, so a crash leaves either
the old or the new snapshot, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from kai_es.services.snapshotting import StoredSnapshot, decode_stored, encode_stored


class FileSnapshotStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def for_log(cls, log_path: str | Path) -> FileSnapshotStore:
        return cls(Path(f"{log_path}.snapshot"))

    def _save_sync(self, blob: bytes) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    async def save(self, snap: StoredSnapshot) -> None:
        await anyio.to_thread.run_sync(self._save_sync, encode_stored(snap))

    async def load_latest(self) -> StoredSnapshot | None:
        if not self.path.exists():
            return None
        return decode_stored(self.path.read_bytes())

    async def close(self) -> None:
        return None
