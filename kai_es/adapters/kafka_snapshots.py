"""Scheduler state snapshots (and the binder's progress) in a compacted Kafka side topic
``<events topic>.snapshots``.

Contract:
- One partition, ``cleanup.policy=compact``, record key = the writer role (``scheduler``, or
  ``binder`` for the binder's progress), value = the newest blob of that role; for a snapshot,
  `kai_es.adapters.snapshot_codec.encode_stored` (a JSON header line + zlib'd canonical
  snapshot bytes). Compaction keeps the newest snapshot per key; older ones may linger until
  the cleaner runs, so `load_latest` reads the whole partition and keeps the last one.
- `max.message.bytes` of the topic is raised (64 MiB) so a large state fits in one record.
- Writes use an idempotent (non-transactional) producer: a snapshot is checked against the
  event log before use, so even a fenced scheduler's late snapshot cannot corrupt a start.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final, Self

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import TopicAlreadyExistsError  # type: ignore[import-untyped]

from kai_es.adapters.kafka_security import PLAINTEXT, KafkaSecurity
from kai_es.adapters.snapshot_codec import decode_stored, encode_stored
from kai_es.ports import StoredSnapshot

if TYPE_CHECKING:  # (that module builds on this one)
    from kai_es.adapters.kafka_checkpoints import KafkaCheckpointStore

log = logging.getLogger(__name__)

MAX_BYTES: Final = 64 * 1024 * 1024
TOPIC_CONFIG: Final = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_BYTES),
                       "min.cleanable.dirty.ratio": "0.1", "segment.bytes": str(128 * 1024 * 1024)}
_UNKNOWN_TOPIC: Final = 3


class KafkaBlobStore:
    """The newest blob of one role (`key`) in the side topic."""

    def __init__(self, bootstrap: str, events_topic: str, *, key: str = "scheduler",
                 request_timeout_ms: int = 30_000, security: KafkaSecurity = PLAINTEXT,
                 suffix: str = "snapshots", create: bool = True) -> None:
        self.bootstrap = bootstrap
        #: whether a missing topic is created (else it reads as empty: a read-only caller's)
        self.create = create
        self._missing = False
        self.security = security
        self._client_kwargs = security.client_kwargs()
        self.topic = f"{events_topic}.{suffix}"
        self.key = key.encode()
        self.request_timeout_ms = request_timeout_ms
        self._tp = TopicPartition(self.topic, 0)
        self._producer: Any = None
        self._ready = False

    @classmethod
    def for_log(cls, events: Any, *, key: str = "scheduler") -> Self:
        """The store beside a `KafkaEventLog` (reached with its security settings)."""
        return cls(events.bootstrap, events.topic, key=key, security=events.security)

    async def _ensure_topic(self) -> None:
        if self._ready:
            return
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="kai-es-snapshots",
                                    request_timeout_ms=self.request_timeout_ms, **self._client_kwargs)
        await admin.start()
        try:
            deadline = time.monotonic() + self.request_timeout_ms / 1000
            created = False
            while True:
                (desc,) = await admin.describe_topics([self.topic])
                if desc["error_code"] == 0 and desc["partitions"] and all(
                        part["leader"] >= 0 for part in desc["partitions"]):
                    break
                if desc["error_code"] == _UNKNOWN_TOPIC and not self.create:
                    self._missing = True
                    break
                if desc["error_code"] == _UNKNOWN_TOPIC and not created:
                    resp = await admin.create_topics([NewTopic(self.topic, 1, 1,
                                                               topic_configs=TOPIC_CONFIG)])
                    (err,) = resp.to_object()["topic_errors"]
                    if err["error_code"] not in (0, TopicAlreadyExistsError.errno):
                        raise RuntimeError(f"cannot create snapshot topic {self.topic}: "
                                           f"{err['error_message']}")
                    created = True
                if time.monotonic() > deadline:
                    raise RuntimeError(f"snapshot topic {self.topic} not ready")
                await anyio.sleep(0.05)
        finally:
            await admin.close()
        self._ready = True

    async def save_blob(self, blob: bytes) -> None:
        await self.send(self.key, blob)

    async def load_blob(self) -> bytes | None:
        found = await self.load_keyed()
        return found.get(self.key)

    async def load_keyed(self, *, values: bool = True) -> dict[bytes, bytes]:
        """The newest value of every key in the topic, tombstoned keys (None) left out: a
        compacted topic's state, read from its beginning (the cleaner may not have run).
        `values=False`: the keys only (each value b""), whatever the size of the values read."""
        await self._ensure_topic()
        if self._missing:
            return {}
        consumer = AIOKafkaConsumer(**self._client_kwargs, bootstrap_servers=self.bootstrap,
                                    client_id="kai-es-snapshots",
                                    group_id=None, enable_auto_commit=False,
                                    isolation_level="read_committed",
                                    request_timeout_ms=self.request_timeout_ms,
                                    fetch_max_wait_ms=10, max_partition_fetch_bytes=MAX_BYTES,
                                    fetch_max_bytes=MAX_BYTES)
        await consumer.start()
        found: dict[bytes, bytes] = {}
        try:
            consumer.assign([self._tp])
            end = (await consumer.end_offsets([self._tp]))[self._tp]
            begin = (await consumer.beginning_offsets([self._tp]))[self._tp]
            if end <= begin:
                return found
            consumer.seek(self._tp, begin)
            while await consumer.position(self._tp) < end:
                batches = await consumer.getmany(self._tp, timeout_ms=500)
                for msg in batches.get(self._tp, ()):
                    if msg.offset >= end:
                        break
                    if msg.key is None:
                        continue
                    if msg.value is None:
                        found.pop(msg.key, None)
                    else:
                        found[msg.key] = msg.value if values else b""
        finally:
            await consumer.stop()
        return found

    async def send(self, key: bytes, value: bytes | None) -> None:
        """`value` (None: a tombstone) under `key`."""
        await self._ensure_topic()
        if self._missing:
            raise RuntimeError(f"topic {self.topic} does not exist and this store may not create it")
        if self._producer is None:
            producer = AIOKafkaProducer(**self._client_kwargs, bootstrap_servers=self.bootstrap,
                                        client_id="kai-es-snapshots", enable_idempotence=True,
                                        acks="all", max_request_size=MAX_BYTES,
                                        request_timeout_ms=self.request_timeout_ms)
            await producer.start()
            self._producer = producer
        await self._producer.send_and_wait(self.topic, value=value, key=key, partition=0)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await producer.stop()
                except Exception:
                    log.debug("stopping the snapshot producer failed", exc_info=True)


class KafkaSnapshotStore(KafkaBlobStore):
    """`kai_es.ports.SnapshotStore` in the side topic (key ``scheduler``), each snapshot also
    kept by `checkpoints` (`adapters.kafka_checkpoints`; None: no checkpoints)."""

    def __init__(self, bootstrap: str, events_topic: str, *, checkpoints: KafkaCheckpointStore | None = None,
                 **kwargs: Any) -> None:
        super().__init__(bootstrap, events_topic, **kwargs)
        self.checkpoints = checkpoints

    @classmethod
    def for_log(cls, events: Any, *, key: str = "scheduler", checkpoints: KafkaCheckpointStore | None = None) -> Self:
        return cls(events.bootstrap, events.topic, key=key, security=events.security, checkpoints=checkpoints)

    async def save(self, snap: StoredSnapshot) -> None:
        blob = encode_stored(snap)
        await self.save_blob(blob)
        log.info("snapshot of position %d (cycle %d, %d bytes stored) written to %s",
                 snap.position, snap.cycle, len(blob), self.topic)
        if self.checkpoints is not None:
            await self.checkpoints.save(snap.position, blob)

    async def load_latest(self) -> StoredSnapshot | None:
        blob = await self.load_blob()
        return decode_stored(blob) if blob is not None else None

    async def close(self) -> None:
        await super().close()
        if self.checkpoints is not None:
            await self.checkpoints.close()
