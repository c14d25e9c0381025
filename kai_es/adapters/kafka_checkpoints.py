"""Checkpoints of a Kafka log: past scheduler snapshots kept in a compacted side topic
``<events topic>.checkpoints``, so that `kai-es replay kafka://...` can start its later shares
from them (`kai_es.replay_parallel`), as it does from a file log's (`adapters.file_checkpoints`).

Why a topic of their own: the snapshot topic keeps one record per role (the newest snapshot,
which a restarting scheduler reads whole); checkpoints are many, and only a replay reads them.

Contract:
- Key = the cut's position in (at least) 12 digits, value = the stored snapshot (`snapshot_codec`: a JSON
  header line, then the compressed state); compaction keeps the newest value per key. At most
  `keep` are kept, thinned as a file log's are (`file_checkpoints.thinned`: the one whose
  removal leaves the smallest gap goes, the newest always stays); a thinned one gets a tombstone.
- A checkpoint is a hint, never the source of truth: the replay validates each one it uses
  against the log (`replay_parallel`). A record whose key is not such a position, or whose
  header does not decode or names another position, is skipped with a warning.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Final

from kai_es.adapters.file_checkpoints import DEFAULT_KEEP, thinned
from kai_es.adapters.kafka_snapshots import KafkaBlobStore
from kai_es.adapters.snapshot_codec import SnapshotFormatError, decode_header, decode_stored
from kai_es.ports import StoredSnapshot

log = logging.getLogger(__name__)

SUFFIX: Final = "checkpoints"
#: a checkpoint's key: its position in (at least) 12 digits (as `file_checkpoints` names them)
_KEY = re.compile(rb"^\d{12,}$")


@dataclass(frozen=True, slots=True)
class KafkaCheckpoint:
    """One checkpoint as `replay_parallel` uses it (as `file_checkpoints.Checkpoint`), its
    stored snapshot in hand."""

    position: int
    completed_position: int
    cycle: int
    digest: str
    where: str
    blob: bytes

    def load(self) -> StoredSnapshot:
        """The whole stored snapshot (raises SnapshotFormatError)."""
        return decode_stored(self.blob)


class KafkaCheckpointStore(KafkaBlobStore):
    """The checkpoints topic of one events topic."""

    def __init__(self, bootstrap: str, events_topic: str, *, keep: int = DEFAULT_KEEP, **kwargs: Any) -> None:
        # (no blob key of its own: `save` and `checkpoints` key each record by its position)
        super().__init__(bootstrap, events_topic, key="", suffix=SUFFIX, **kwargs)
        self.keep = keep
        #: the positions kept in the topic, as this store last read or wrote them (None: unread)
        self._kept: list[int] | None = None

    @classmethod
    def for_events(cls, events: Any, *, keep: int = DEFAULT_KEEP) -> KafkaCheckpointStore:
        """The checkpoints beside a `KafkaEventLog` (reached with its security settings)."""
        return cls(events.bootstrap, events.topic, keep=keep, security=events.security)

    async def save(self, position: int, blob: bytes) -> None:
        """`blob`, the stored snapshot at cut `position`, as a checkpoint; the topic thinned to
        `keep` (module contract)."""
        if self._kept is None:
            self._kept = sorted(int(key) for key in await self.load_keyed(values=False) if _KEY.match(key))
        await self.send(_key(position), blob)
        kept = sorted({*self._kept, position})
        for gone in thinned(kept, self.keep):
            await self.send(_key(gone), None)
            kept.remove(gone)
        self._kept = kept

    async def checkpoints(self) -> list[KafkaCheckpoint]:
        """The readable checkpoints, by position (module contract)."""
        found = []
        for key, blob in (await self.load_keyed()).items():
            where = f"{self.topic}[{key.decode(errors='replace')}]"
            if not _KEY.match(key):
                log.warning("checkpoint %s skipped: its key is not a position of 12 digits or more", where)
                continue
            try:
                header = decode_header(blob.partition(b"\n")[0])
            except SnapshotFormatError as exc:
                log.warning("checkpoint %s skipped: %s", where, exc)
                continue
            if header.position != int(key):
                log.warning("checkpoint %s skipped: its header says position %d", where, header.position)
                continue
            found.append(KafkaCheckpoint(header.position, header.completedposition, header.cycle,
                                         header.digest, where, blob))
        return sorted(found, key=lambda cp: cp.position)


def _key(position: int) -> bytes:
    return f"{position:012d}".encode()
