"""Snapshots of scheduler state (and the binder's progress) for the file log: one file per role
beside the log, replaced atomically.

``<log>.snapshot`` holds the newest snapshot (`kai_es.adapters.snapshot_codec.encode_stored`),
``<log>.binder-progress`` the binder's progress; a save writes a temp file, fsyncs it and
renames it over the old one, so a crash leaves either the old or the new blob, never a torn one.
Each scheduler snapshot is also kept as a checkpoint of the log (`adapters.file_checkpoints`,
up to `checkpoints` of them, 0: none), for replays to start from.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Self

import anyio

from kai_es.adapters.file_checkpoints import DEFAULT_KEEP, save_checkpoint
from kai_es.adapters.snapshot_codec import decode_stored, encode_stored
from kai_es.ports import StoredSnapshot


class FileBlobStore:
    """The newest blob of one role, in one file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def for_log(cls, log_path: str | Path, *, suffix: str = "snapshot") -> Self:
        return cls(Path(f"{log_path}.{suffix}"))

    def _save_sync(self, blob: bytes) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    async def save_blob(self, blob: bytes) -> None:
        await anyio.to_thread.run_sync(self._save_sync, blob)

    async def load_blob(self) -> bytes | None:
        if not self.path.exists():
            return None
        return self.path.read_bytes()

    async def close(self) -> None:
        return None


class FileSnapshotStore(FileBlobStore):
    """`kai_es.ports.SnapshotStore` in ``<log>.snapshot``, each snapshot also kept as one of
    up to `checkpoints` checkpoints of the log."""

    def __init__(self, path: str | Path, *, log_path: str | Path | None = None,
                 checkpoints: int = DEFAULT_KEEP) -> None:
        super().__init__(path)
        self.log_path = log_path
        self.checkpoints = checkpoints if log_path is not None else 0

    @classmethod
    def for_log(cls, log_path: str | Path, *, suffix: str = "snapshot",
                checkpoints: int = DEFAULT_KEEP) -> Self:
        return cls(Path(f"{log_path}.{suffix}"), log_path=log_path, checkpoints=checkpoints)

    async def save(self, snap: StoredSnapshot) -> None:
        blob = encode_stored(snap)
        await self.save_blob(blob)
        if self.checkpoints > 0:
            assert self.log_path is not None
            await anyio.to_thread.run_sync(functools.partial(save_checkpoint, self.log_path, snap.position, blob,
                                                             self.checkpoints, same_as=self.path))

    async def load_latest(self) -> StoredSnapshot | None:
        blob = await self.load_blob()
        return decode_stored(blob) if blob is not None else None
