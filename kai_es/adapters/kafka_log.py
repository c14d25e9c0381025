"""The production EventLog: one single-partition Apache Kafka topic (ARCHITECTURE.md §3).

URL: ``kafka://host:port[,host:port...]/topic?transactional_id=ID&create=false``
(topic default ``kai-es.events``).

Contract (on top of `kai_es.ports.EventLog`):
- Position = Kafka offset of partition 0. Transaction markers occupy offsets, so positions are
  strictly increasing but NOT dense; readers stop on ``position >= end``, never on a count.
- Record value = canonical envelope bytes (`kai_es.events.encode`, CloudEvents structured mode),
  key = ``envelope.subject`` (UTF-8), headers ``ce_type``, ``ce_id`` and
  ``content-type: application/cloudevents+json`` for consumers that route on headers.
- `append` is one Kafka transaction (idempotent transactional producer): all or none of the batch
  becomes visible to ``read_committed`` readers. It returns only once the batch is visible (the
  last stable offset passed it), so a `read` or `end_position` that follows an `append` — from
  any instance — sees it (read-your-writes; needed by the cycle protocol's "fold up to the cut").
- Fencing: a producer's ``transactional_id`` names the *writer role*, and must be stable across
  restarts of the same service instance (e.g. a StatefulSet pod name), not per process. When a
  second instance with the same id starts writing, Kafka fences the first: its next `append`
  or `check_writer` raises `FencedError`, nothing of that append is visible, and the log refuses
  every later append. `check_writer` finds out without writing to the topic: it opens a
  transaction holding only an offset of the consumer group ``<topic>.writer-check`` (never
  used to consume) and aborts it, so the only trace is an abort marker in Kafka's internal
  offsets topic (with ACLs, the writer needs Read on that group). The default id is
  ``kai-es-writer.<topic>`` (so two default writers of one topic fence each other instead of
  interleaving); give each service its own id. A claim that follows one of ours — a producer
  made again after a fatal error, or the log of a later session given the same `WriterTenure`
  — first asks the coordinator whether another instance claimed the id since
  (`kafka_tenure`): if so it raises `FencedError` instead of fencing that instance back.
- `read` uses a ``read_committed`` consumer with manual assignment (no group, no commits).
  Without ``follow`` it stops at the last stable offset (LSO) as of the call. A record that does
  not decode is logged, copied to ``<topic>.deadletter`` (key = its offset as text, headers
  with the reason), recorded in `dead_letters` and skipped: it never stops a reader.
- `end_position` is the LSO of a ``read_committed`` consumer.
- Clients (producer, consumers, admin) are created lazily inside the running event loop.
  `close()` stops them; the object may be used again afterwards (new clients, possibly in a new
  event loop), as a CLI that calls `anyio.run` twice on one log does.
"""

from __future__ import annotations

import asyncio
import logging
import ipaddress
import re
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.client import AIOKafkaClient  # type: ignore[import-untyped]
from aiokafka.errors import (  # type: ignore[import-untyped]
    InvalidProducerEpoch,
    KafkaConnectionError,
    ProducerFenced,
    TopicAlreadyExistsError,
    for_code,
)

from kai_es.adapters.kafka_describe import DescribeUnsupported, current_holder
from kai_es.adapters.kafka_fetch import FetchError, fetch_frames
from kai_es.adapters.kafka_security import OPTIONS as SECURITY_OPTIONS
from kai_es.adapters.kafka_security import PLAINTEXT, KafkaSecurity, KafkaSecurityError, security_from_query
from kai_es.adapters.kafka_tenure import Holder, WriterTenure, taken_over
from kai_es.events import DecodeError, Envelope, Record, decode, encode
from kai_es.ports import SetupError

log = logging.getLogger(__name__)

DEFAULT_TOPIC: Final = "kai-es.events"
DEFAULT_PORT: Final = 9092
CONTENT_TYPE: Final = b"application/cloudevents+json"
TOPIC_CONFIG: Final = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
_UNKNOWN_TOPIC: Final = 3
_MAX_IDLE_CONSUMERS: Final = 2


class KafkaLogError(RuntimeError):
    """The Kafka log cannot be used as configured (bad URL, wrong topic layout, closed)."""


class _ConnectFailures(logging.Filter):
    """Why aiokafka's client could not connect to each address. Its bootstrap logs the cause
    ('Unable connect to "host:port": SaslAuthenticationFailed: ...', a TLS verification error)
    on the "aiokafka" logger and raises a bare "Unable to bootstrap": this filter keeps the cause
    for our error message and drops that line (re-logged here at DEBUG), so a CLI says it once.
    Every other aiokafka record passes."""

    _LINE = re.compile(r'Unable connect to "([^"]+)": (.*)', re.S)

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, str] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        found = self._LINE.match(message)
        if found is None:
            return True
        self.last[found.group(1)] = found.group(2).strip()
        log.debug("aiokafka: %s", message)
        return False

    def reason(self, bootstrap: str) -> str | None:
        reasons = [self.last[hp] for hp in bootstrap.split(",") if hp in self.last]
        return "; ".join(dict.fromkeys(reasons)) or None


_CONNECT_FAILURES: Final = _ConnectFailures()
logging.getLogger("aiokafka").addFilter(_CONNECT_FAILURES)


#: when a writer learnt it was fenced: at an append, checking its role, or before claiming it again
FencedWhen = Literal["append", "check", "claim"]


class FencedError(RuntimeError):
    """Another instance with the same transactional_id took over; this one must stop writing."""

    CONSEQUENCES: Final[dict[FencedWhen, str]] = {
        "append": "its last append is not visible",
        "check": "it found out while checking, with nothing to write",
        "claim": "it found out before claiming the role again",
    }

    def __init__(self, transactional_id: str, topic: str, *, when: FencedWhen = "append") -> None:
        consequence = self.CONSEQUENCES[when]
        super().__init__(
            f"another instance with transactional_id {transactional_id!r} took over writing to "
            f"Kafka topic {topic!r}; this one stops ({consequence})")
        self.transactional_id = transactional_id
        self.topic = topic


class DeadLetter(NamedTuple):
    """A record that could not be decoded: its offset and why (compares equal to the tuple)."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class KafkaLogConfig:
    bootstrap: str
    topic: str = DEFAULT_TOPIC
    transactional_id: str | None = None
    create: bool = True
    security: KafkaSecurity = PLAINTEXT


class KafkaUrlError(KafkaLogError, SetupError):
    """A `kafka://` URL that cannot name a log: permanent, so no process retries it (exit 2)."""


#: Kafka's own rule for topic names
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def redacted(url: str) -> str:
    """`url` with any userinfo (``user:password@``) replaced by ``***@``: what messages show."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{sep}{netloc}{slash}{tail}"


def _broker(hp: str, shown: str) -> str:
    """One ``host[:port]`` of a URL's broker list, checked, as ``host:port``."""
    if hp.startswith("["):
        host, close, rest = hp[1:].partition("]")
        if not close:
            raise KafkaUrlError(f"{shown}: broker {hp!r}: an IPv6 address needs its closing ']'")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise KafkaUrlError(f"{shown}: broker {hp!r}: {host!r} is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise KafkaUrlError(f"{shown}: broker {hp!r}: expected [address]:port")
        port_text = rest[1:] if rest else str(DEFAULT_PORT)
        host = f"[{host}]"
    else:
        host, colon, port_text = hp.partition(":")
        if not colon:
            port_text = str(DEFAULT_PORT)
        if ":" in port_text:
            raise KafkaUrlError(f"{shown}: broker {hp!r}: an IPv6 address goes in brackets ([::1]:9092)")
        if not _HOST.fullmatch(host):
            raise KafkaUrlError(f"{shown}: broker {hp!r}: {host!r} is not a host name or address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise KafkaUrlError(f"{shown}: broker {hp!r}: the port must be a number from 1 to 65535, got {port_text!r}")
    return f"{host}:{int(port_text)}"


def parse_url(url: str) -> KafkaLogConfig:
    """``kafka://host:port[,host2:port2]/topic?transactional_id=X&create=false`` plus the TLS and
    SASL options of `kai_es.adapters.kafka_security` (credentials from the environment).

    Everything is checked here, once (`KafkaUrlError`, a SetupError: never retried): the broker
    addresses (host or IPv4, bracketed IPv6, port 1..65535), the topic (Kafka's characters, at
    most 249), the options. A URL with userinfo is refused, and no message repeats it."""
    shown = redacted(url)
    scheme, sep, rest = url.partition("://")
    if scheme != "kafka" or not sep:
        raise KafkaUrlError(f"{shown}: not a kafka:// URL")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    if "@" in netloc:
        raise KafkaUrlError(f"{shown}: a kafka:// URL carries no user or password (they would be shown in "
                            "logs and process lists): set $KAI_ES_KAFKA_SASL_USERNAME and "
                            "$KAI_ES_KAFKA_SASL_PASSWORD, and security_protocol / sasl_mechanism in the query")
    hosts = [_broker(hp.strip(), shown) for hp in netloc.split(",") if hp.strip()]
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise KafkaUrlError(f"{shown}: not a valid URL ({exc})") from None
    if parts.fragment:
        raise KafkaUrlError(f"{shown}: a kafka:// URL has no #fragment")
    if not hosts:
        raise KafkaUrlError(f"{shown}: no broker address (expected kafka://host:port/topic)")
    topic = unquote(parts.path.lstrip("/")) or DEFAULT_TOPIC
    if "/" in topic:
        raise KafkaUrlError(f"{shown}: topic name {topic!r} may not contain '/'")
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise KafkaUrlError(f"{shown}: topic name {topic!r} is not one Kafka accepts (letters, digits, "
                            "'.', '_' and '-', at most 249)")
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    txn = query.pop("transactional_id", None) or None
    create_s = query.pop("create", "true").lower()
    if create_s not in ("true", "false", "1", "0", "yes", "no"):
        raise KafkaUrlError(f"{shown}: create={create_s!r} is not a boolean")
    security_options: dict[str, str] = {name: query.pop(name) for name in SECURITY_OPTIONS if name in query}
    secrets: dict[str, str] = {name: query.pop(name) for name in ("sasl_password", "sasl_plain_password")
                               if name in query}
    if query:
        raise KafkaUrlError(f"{shown}: unknown option(s) {', '.join(sorted(query))} "
                            f"(known: transactional_id, create, {', '.join(SECURITY_OPTIONS)})")
    try:
        security = security_from_query({**security_options, **secrets})
    except KafkaSecurityError as exc:
        raise KafkaSecurityError(f"{parts.scheme}://{parts.netloc}{parts.path}: {exc}") from None
    return KafkaLogConfig(bootstrap=",".join(hosts), topic=topic, transactional_id=txn,
                          create=create_s in ("true", "1", "yes"), security=security)


class KafkaEventLog:
    """EventLog over a single-partition Kafka topic (see the module docstring)."""

    def __init__(self, bootstrap: str, topic: str = DEFAULT_TOPIC, *,
                 transactional_id: str | None = None, create: bool = True,
                 security: KafkaSecurity = PLAINTEXT,
                 transaction_timeout_ms: int = 15_000, request_timeout_ms: int = 30_000,
                 visibility_timeout_s: float = 30.0, fetch_max_wait_ms: int = 500,
                 client_id: str = "kai-es", tenure: WriterTenure | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security
        self._client_kwargs = security.client_kwargs()
        self.deadletter_topic = f"{topic}.deadletter"
        self.transactional_id = transactional_id or f"kai-es-writer.{topic}"
        self.create = create
        self.transaction_timeout_ms = transaction_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.visibility_timeout_s = visibility_timeout_s
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.client_id = client_id
        self.dead_letters: list[DeadLetter] = []
        self._tp = TopicPartition(topic, 0)
        self._producer: Any = None
        self._dlq_producer: Any = None
        self._consumers: set[Any] = set()
        self._idle: list[Any] = []
        self._meta: Any = None
        self._topic_ready = False
        self._dlq_exists = False
        self._fenced = False
        #: what this log's producers held of the transactional id (shared with the logs of the
        #: process's later sessions when it is given: see `_check_tenure`)
        self.tenure = tenure if tenure is not None else WriterTenure()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead_offsets: set[int] = set()
        self._setup_lock: anyio.Lock | None = None
        self._append_lock: anyio.Lock | None = None

    @classmethod
    def from_url(cls, url: str, *, transactional_id: str | None = None,
                 create: bool | None = None, tenure: WriterTenure | None = None) -> KafkaEventLog:
        """A log for `url`; keyword arguments override the URL's query options (a read-only
        opener may pass ``create=False`` so that a mistyped topic is an error, not a new topic)."""
        cfg = parse_url(url)
        return cls(cfg.bootstrap, cfg.topic, transactional_id=transactional_id or cfg.transactional_id,
                   create=cfg.create if create is None else create, security=cfg.security,
                   tenure=tenure)

    def __repr__(self) -> str:
        return (f"KafkaEventLog(bootstrap={self.bootstrap!r}, topic={self.topic!r}, "
                f"transactional_id={self.transactional_id!r})")

    # -- lazy setup (always inside the running loop) --------------------------------------------

    def _check_open(self) -> None:
        """Bind the log to the running event loop. aiokafka clients belong to the loop that
        started them: a log used from a new loop without `close()` in the previous one
        abandons its old clients (with a warning) and starts new ones."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and (self._producer is not None or self._consumers
                                       or self._dlq_producer is not None):
            log.warning("%r is used from a new event loop without close() in the previous one; "
                        "its Kafka clients there are abandoned", self)
        self._producer = self._dlq_producer = self._meta = None
        self._idle = []
        self._consumers = set()
        self._setup_lock = self._append_lock = None
        self._loop = loop

    def _lock(self) -> anyio.Lock:
        if self._setup_lock is None:
            self._setup_lock = anyio.Lock()
        return self._setup_lock

    async def _reaching(self, connecting: Awaitable[Any]) -> None:
        """Await a client's first connection; a broker that cannot be reached is a
        `KafkaLogError` naming the address and why (aiokafka's own line for it is filtered)."""
        try:
            await connecting
        except KafkaConnectionError as exc:
            why = _CONNECT_FAILURES.reason(self.bootstrap) or str(exc)
            raise KafkaLogError(f"cannot reach Kafka at {self.bootstrap}: {why}") from exc

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[Any]:
        """A bootstrapped `AIOKafkaClient` with this log's settings, closed after: for the
        requests aiokafka's producer and consumer do not make (`kafka_fetch`, `kafka_describe`)."""
        client = AIOKafkaClient(bootstrap_servers=self.bootstrap, client_id=self.client_id,
                                request_timeout_ms=self.request_timeout_ms, **self._client_kwargs)
        try:
            await self._reaching(client.bootstrap())
            yield client
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    async def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        async with self._lock():
            if self._topic_ready:
                return
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=self.client_id,
                                        request_timeout_ms=self.request_timeout_ms, **self._client_kwargs)
            try:
                await self._reaching(admin.start())
                await self._ensure_one_topic(admin, self.topic, required=True)
                self._dlq_exists = await self._ensure_one_topic(admin, self.deadletter_topic,
                                                                required=False)
            finally:
                await admin.close()
            self._topic_ready = True

    async def _ensure_one_topic(self, admin: Any, topic: str, *, required: bool) -> bool:
        """Create `topic` if missing (and allowed); False if it is missing and may not be."""
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        created = False
        while True:
            (desc,) = await admin.describe_topics([topic])
            code = desc["error_code"]
            if code == 0 and desc["partitions"]:
                n = len(desc["partitions"])
                if topic == self.topic and n != 1:
                    raise KafkaLogError(
                        f"Kafka topic {topic!r} has {n} partitions; the kai-es event log needs "
                        "exactly 1 (the offset is the total order). Use another topic, or one "
                        "topic per shard.")
                if all(p["leader"] >= 0 for p in desc["partitions"]):
                    return True
            elif code == _UNKNOWN_TOPIC and not created:
                if not self.create:
                    if required:
                        raise KafkaLogError(f"Kafka topic {topic!r} does not exist on "
                                            f"{self.bootstrap} (and create=false)")
                    return False
                resp = await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=TOPIC_CONFIG)])
                (err,) = resp.to_object()["topic_errors"]
                if err["error_code"] not in (0, TopicAlreadyExistsError.errno):
                    raise KafkaLogError(f"cannot create Kafka topic {topic!r}: "
                                        f"{for_code(err['error_code']).__name__} {err['error_message']}")
                if err["error_code"] == 0:
                    log.info("created Kafka topic %s (1 partition, unlimited retention)", topic)
                created = True
            elif code not in (0, _UNKNOWN_TOPIC):
                raise KafkaLogError(f"cannot describe Kafka topic {topic!r}: "
                                    f"{for_code(code).__name__}")
            if time.monotonic() > deadline:
                raise KafkaLogError(f"Kafka topic {topic!r} has no partition leader after "
                                    f"{self.request_timeout_ms} ms")
            await anyio.sleep(0.05)

    async def _new_consumer(self, *, assign: bool, fetch_max_wait_ms: int,
                            partition_fetch_bytes: int = 8 * 1024 * 1024) -> Any:
        consumer = AIOKafkaConsumer(
            **self._client_kwargs,
            bootstrap_servers=self.bootstrap, client_id=self.client_id, group_id=None,
            isolation_level="read_committed", enable_auto_commit=False,
            auto_offset_reset="earliest", request_timeout_ms=self.request_timeout_ms,
            fetch_max_wait_ms=fetch_max_wait_ms, max_partition_fetch_bytes=partition_fetch_bytes,
            fetch_max_bytes=32 * 1024 * 1024, max_poll_records=10_000)
        await _started(consumer)
        self._consumers.add(consumer)
        if assign:
            consumer.assign([self._tp])
        return consumer

    async def _acquire_reader(self, *, follow: bool) -> Any:
        """A consumer assigned to the partition. Non-follow readers are pooled (paused while
        idle, so they hold no long-poll fetch); follow readers long-poll and are not pooled."""
        self._check_open()
        await self._ensure_topic()
        if follow:
            return await self._new_consumer(assign=True, fetch_max_wait_ms=self.fetch_max_wait_ms)
        if self._idle:
            return self._idle.pop()
        return await self._new_consumer(assign=True, fetch_max_wait_ms=10)

    async def _release_reader(self, consumer: Any, *, follow: bool) -> None:
        if not follow and consumer in self._consumers and len(self._idle) < _MAX_IDLE_CONSUMERS:
            consumer.pause(self._tp)
            self._idle.append(consumer)
            return
        self._consumers.discard(consumer)
        await consumer.stop()

    async def _lso(self) -> int:
        """The last stable offset, asked of a consumer that never fetches (a ListOffsets
        request queued behind a long-poll Fetch on the same connection would wait for it)."""
        self._check_open()
        await self._ensure_topic()
        if self._meta is None:
            self._meta = await self._new_consumer(assign=False, fetch_max_wait_ms=10)
        offsets = await self._meta.end_offsets([self._tp])
        return int(offsets[self._tp])

    async def _ensure_producer(self) -> Any:
        if self._producer is not None and self._producer._txn_manager.is_fatal_error():
            await self._drop_producer("it is in a fatal state")
        if self._producer is None:
            await self._check_tenure()
            producer = AIOKafkaProducer(
                **self._client_kwargs,
                bootstrap_servers=self.bootstrap, client_id=self.client_id,
                transactional_id=self.transactional_id, enable_idempotence=True, acks="all",
                transaction_timeout_ms=self.transaction_timeout_ms,
                request_timeout_ms=self.request_timeout_ms,
                max_batch_size=1024 * 1024, max_request_size=4 * 1024 * 1024, linger_ms=0)
            await _started(producer)  # InitProducerId: fences older producers with this id
            self._producer = producer
            txn = producer._txn_manager
            self.tenure.held = Holder(int(txn.producer_id), int(txn.producer_epoch))
        return self._producer

    async def _check_tenure(self) -> None:
        """Before a claim that follows one of ours (a new producer in this log, or the log of a
        later session sharing our `tenure`): raise `FencedError` if another instance claimed
        the transactional id since (`kafka_tenure.taken_over`), so that this claim does not
        fence it; `TenureUnknown` if the coordinator cannot say, `KafkaLogError` if no broker
        can be reached to ask it (either way the session starts again)."""
        held = self.tenure.held
        if held is None:
            return
        try:
            async with self._client() as client:
                now = await current_holder(client, self.transactional_id,
                                           timeout_s=self.request_timeout_ms / 1000)
        except DescribeUnsupported:
            log.warning("the brokers at %s do not answer DescribeTransactions (Kafka before 3.0): "
                        "claiming %r again without checking that no other instance took it over",
                        self.bootstrap, self.transactional_id)
            return
        if taken_over(held, now):
            self._fenced = True
            log.error("Kafka transactional_id %r was claimed by another instance (producer %s) "
                      "since this one held it (%s); it does not claim it back",
                      self.transactional_id, now, held)
            raise FencedError(self.transactional_id, self.topic, when="claim")

    # -- EventLog ---------------------------------------------------------------------------------

    async def claim_writer(self) -> None:
        """InitProducerId now: fences an older producer with our transactional_id and settles
        any transaction of ours still in flight, so a read that follows sees its outcome."""
        self._check_open()
        await self._ensure_topic()
        await self._ensure_producer()

    @asynccontextmanager
    async def _writing(self, *, when: FencedWhen) -> AsyncIterator[Any]:
        """The producer, held under the append lock for one transaction of ours; fencing met
        before or inside it becomes `FencedError` (and the log refuses every later write), and
        a producer left in a fatal state is dropped (the next write makes a new one)."""
        if self._append_lock is None:
            self._append_lock = anyio.Lock()
        async with self._append_lock:
            self._check_open()
            if self._fenced:
                raise FencedError(self.transactional_id, self.topic, when=when)
            await self._ensure_topic()
            producer = await self._ensure_producer()
            try:
                yield producer
            except (ProducerFenced, InvalidProducerEpoch) as exc:
                await self._on_fenced()
                raise FencedError(self.transactional_id, self.topic, when=when) from exc
            except BaseException:
                if self._producer is not None and self._producer._txn_manager.is_fatal_error():
                    await self._drop_producer("its transaction failed fatally")
                raise

    async def check_writer(self) -> None:
        """Raise `FencedError` when another producer with our transactional_id took over (see
        the module's "Fencing"); otherwise return having written nothing to the topic."""
        self._check_open()
        if self._fenced:
            raise FencedError(self.transactional_id, self.topic, when="check")
        async with self._writing(when="check") as producer:
            await producer.begin_transaction()
            try:
                await producer.send_offsets_to_transaction({self._tp: 0}, f"{self.topic}.writer-check")
            except BaseException:
                if not producer._txn_manager.is_fatal_error():
                    with anyio.CancelScope(shield=True):
                        await producer.abort_transaction()
                raise
            await producer.abort_transaction()

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        self._check_open()
        if self._fenced:
            raise FencedError(self.transactional_id, self.topic)
        if not events:
            return []
        payloads = [(encode(e), e.subject.encode(), [("ce_type", e.type.encode()),
                                                      ("ce_id", e.id.encode()),
                                                      ("content-type", CONTENT_TYPE)])
                    for e in events]
        async with self._writing(when="append") as producer:
            positions = await self._transaction(producer, payloads)
        await self._wait_visible(positions[-1])
        return positions

    async def _transaction(self, producer: Any,
                           payloads: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> list[int]:
        await producer.begin_transaction()
        futures: list[asyncio.Future[Any]] = []
        try:
            for value, key, headers in payloads:
                futures.append(await producer.send(self.topic, value=value, key=key, partition=0,
                                                   headers=headers))
            metas = await asyncio.gather(*futures)
            await producer.commit_transaction()
        except BaseException:
            # Retrieve every send result, so no future is left holding an unread exception.
            if futures:
                with anyio.CancelScope(shield=True):
                    await asyncio.gather(*futures, return_exceptions=True)
            if not producer._txn_manager.is_fatal_error():
                with anyio.CancelScope(shield=True):
                    try:
                        await producer.abort_transaction()
                    except (ProducerFenced, InvalidProducerEpoch):
                        raise
                    except Exception:  # the original error is the one worth reporting
                        log.exception("aborting a Kafka transaction on %s failed", self.topic)
            raise
        return [int(m.offset) for m in metas]

    async def _on_fenced(self) -> None:
        self._fenced = True
        log.error("Kafka producer with transactional_id %r was fenced on topic %s: another "
                  "instance took over; this log refuses further appends",
                  self.transactional_id, self.topic)
        await self._drop_producer("it was fenced")

    async def _drop_producer(self, why: str) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        log.info("replacing the Kafka producer of %s: %s", self.topic, why)
        with anyio.CancelScope(shield=True):
            try:
                await producer.stop()
            except Exception:
                log.debug("stopping the Kafka producer failed", exc_info=True)

    async def _wait_visible(self, offset: int) -> None:
        """Return once read_committed readers see `offset` (the coordinator writes the commit
        marker after answering EndTxn, so the LSO can trail a successful commit briefly)."""
        deadline = time.monotonic() + self.visibility_timeout_s
        delay = 0.0005
        while await self._lso() <= offset:
            if time.monotonic() > deadline:
                log.warning("committed offset %d of %s not visible to read_committed "
                            "readers after %.1f s", offset, self.topic, self.visibility_timeout_s)
                return
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        async for batch in self._batches(from_position, None, follow=follow):
            for msg in batch:
                offset = msg.offset
                try:
                    env = decode(msg.value)
                except DecodeError as exc:
                    await self._dead_letter(offset, msg.key, msg.value, str(exc))
                    continue
                yield Record(offset, env)

    async def read_raw(self, from_position: int = 0, end: int | None = None
                       ) -> AsyncIterator[list[tuple[int, bytes | None]]]:
        """The records from `from_position` up to `end` (default: the LSO as of the call) as
        batches of (offset, value), undecoded and unchecked: for a reader that decodes them
        itself (`kafka_frames`) and so owns what `read` does with one that does not decode.
        Read from Fetch answers directly (`kafka_fetch`), not through a consumer."""
        self._check_open()
        if end is None:
            end = await self._lso()
        else:
            await self._ensure_topic()
        start = max(0, from_position)
        if start >= end:
            return
        try:
            async with self._client() as client:
                async for batch in fetch_frames(client, self.topic, start, end):
                    yield batch
        except FetchError as exc:
            raise KafkaLogError(str(exc)) from exc

    async def read_at(self, positions: Iterable[int]) -> dict[int, bytes | None]:
        """The value of the record at each of `positions` that has one (a transaction marker, or
        an offset past the end, has none), by one consumer seeking to each, fetching little at a
        time (about the record batch holding the position, not megabytes after it)."""
        end = await self._lso()
        found: dict[int, bytes | None] = {}
        wanted = {p for p in positions if 0 <= p < end}
        if not wanted:
            return found
        consumer = await self._new_consumer(assign=True, fetch_max_wait_ms=10, partition_fetch_bytes=64 * 1024)
        tp = self._tp
        try:
            for position in sorted(wanted):
                if position in found:
                    continue
                consumer.seek(tp, position)
                while await consumer.position(tp) <= position:
                    for msg in (await consumer.getmany(tp, timeout_ms=200)).get(tp, ()):
                        if msg.offset in wanted:
                            found[msg.offset] = msg.value
        finally:
            with anyio.CancelScope(shield=True):
                self._consumers.discard(consumer)
                await consumer.stop()
        return found

    async def _batches(self, from_position: int, end: int | None, *, follow: bool) -> AsyncIterator[list[Any]]:
        """The consumer's batches of messages from `from_position`: for ever with `follow`, else
        those before `end` (default: the LSO as of the call)."""
        tp = self._tp
        pos = max(0, from_position)
        if not follow:
            if end is None:
                end = await self._lso()
            if pos >= end:
                return
        consumer = await self._acquire_reader(follow=follow)
        try:
            consumer.seek(tp, pos)
            consumer.resume(tp)
            while True:
                batches = await consumer.getmany(tp, timeout_ms=500 if follow else 200)
                batch = batches.get(tp, [])
                if end is not None and batch and batch[-1].offset >= end:
                    batch = [msg for msg in batch if msg.offset < end]
                    if batch:
                        yield batch
                    return
                if batch:
                    yield batch
                if end is not None and await consumer.position(tp) >= end:
                    return
        finally:
            with anyio.CancelScope(shield=True):
                await self._release_reader(consumer, follow=follow)

    async def dead_letter(self, offset: int, value: bytes | None, reason: str) -> None:
        """What `read` does with a record that does not decode, for a reader of `read_raw`:
        logged, copied to the dead-letter topic (without its key), recorded in `dead_letters`."""
        self._check_open()
        await self._ensure_topic()
        await self._dead_letter(offset, None, value, reason)

    async def end_position(self) -> int:
        return await self._lso()

    async def close(self) -> None:
        """Stop every client. The log stays usable: a later call (in this or another event
        loop) starts new clients, so one object can serve successive `anyio.run` calls. A
        fenced log stays fenced."""
        if self._loop is not asyncio.get_running_loop():
            self._check_open()  # clients of another loop cannot be stopped from here: drop them
        clients = [self._producer, self._dlq_producer, *self._consumers]
        self._producer = self._dlq_producer = self._meta = None
        self._idle = []
        self._consumers = set()
        self._loop = None
        with anyio.CancelScope(shield=True):
            for client in clients:
                if client is None:
                    continue
                try:
                    await client.stop()
                except Exception:
                    log.warning("stopping Kafka client %r failed", client, exc_info=True)

    # -- dead letters -------------------------------------------------------------------------------

    async def _dead_letter(self, offset: int, key: bytes | None, value: bytes | None,
                           reason: str) -> None:
        log.warning("%s: skipping undecodable record at offset %d (%s)", self.topic, offset, reason)
        if offset in self._dead_offsets:
            return
        self._dead_offsets.add(offset)
        self.dead_letters.append(DeadLetter(offset, reason))
        if not self._dlq_exists:
            log.error("%s: dead-letter topic %s does not exist (create=false): record at offset "
                      "%d is only reported, not copied", self.topic, self.deadletter_topic, offset)
            return
        try:
            if self._dlq_producer is None:
                producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap,
                                            client_id=self.client_id, enable_idempotence=True,
                                            acks="all", request_timeout_ms=self.request_timeout_ms,
                                            **self._client_kwargs)
                await _started(producer)
                self._dlq_producer = producer
            headers = [("kai_es_reason", reason.encode()),
                       ("kai_es_source_topic", self.topic.encode()),
                       ("kai_es_source_offset", str(offset).encode())]
            if key is not None:
                headers.append(("kai_es_source_key", key))
            await self._dlq_producer.send_and_wait(self.deadletter_topic, value=value or b"",
                                                   key=str(offset).encode(), headers=headers)
            log.info("%s: record at offset %d copied to %s", self.topic, offset,
                     self.deadletter_topic)
        except Exception as exc:  # a reader never dies of a dead letter
            log.error("%s: could not copy record at offset %d to %s: %s", self.topic, offset,
                      self.deadletter_topic, exc)


async def _started(client: Any) -> None:
    """Start an aiokafka client; stop it again if starting fails (no half-open leftovers)."""
    try:
        await client.start()
    except BaseException:
        with anyio.CancelScope(shield=True):
            try:
                await client.stop()
            except Exception:
                log.debug("stopping a client that failed to start failed", exc_info=True)
        raise


__all__ = ["DEFAULT_TOPIC", "DeadLetter", "FencedError", "KafkaEventLog", "KafkaLogError",
           "parse_url"]
