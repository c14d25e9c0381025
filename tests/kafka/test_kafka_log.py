"""KafkaEventLog against a REAL Kafka broker: the shared EventLog contract, plus what only Kafka
has — transactions (atomic appends), fencing, dead letters, non-dense positions — and the
wiring through `kai_es.app.open_log` and the `kai-es events` CLI."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import ProducerFenced

from kai_es.adapters.kafka_log import (
    DEFAULT_TOPIC,
    FencedError,
    KafkaEventLog,
    KafkaLogError,
    parse_url,
)
from kai_es.adapters.kafka_describe import current_holder
from kai_es.adapters.kafka_fetch import fetch_frames
from kai_es.adapters.kafka_tenure import Holder, WriterTenure
from kai_es.events import decode
from kai_es.ports import EventLog
from tests.log_contract import EventLogContract, collect, event

REPO = Path(__file__).resolve().parents[2]


class TestKafkaLog(EventLogContract):
    @pytest.fixture
    async def log(self, kafka_bootstrap: str, unique_name: str) -> AsyncIterator[EventLog]:
        log = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-w")
        try:
            yield log
        finally:
            await log.close()


@pytest.fixture
async def klog(kafka_bootstrap: str, unique_name: str) -> AsyncIterator[KafkaEventLog]:
    log = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-w")
    try:
        yield log
    finally:
        await log.close()


async def raw_records(bootstrap: str, topic: str, *, isolation: str,
                      timeout_s: float = 10.0) -> list[Any]:
    """Every record of partition 0 up to its current end, read with `isolation`."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                         enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        end = (await c.end_offsets([tp]))[tp]
        got: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while await c.position(tp) < end and time.monotonic() < deadline:
            got.extend((await c.getmany(tp, timeout_ms=200)).get(tp, []))
        return got
    finally:
        await c.stop()


@pytest.fixture
async def captured_loop_errors() -> AsyncIterator[list[BaseException | None]]:
    """Collect what the loop would report as "exception was never retrieved" (aiokafka leaves
    such futures behind in a fenced producer), and finalize them inside the test."""
    loop = asyncio.get_running_loop()
    seen: list[BaseException | None] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx.get("exception")))
    try:
        yield seen
        gc.collect()
    finally:
        loop.set_exception_handler(None)


# ------------------------------------------------------------------------------------------
# URL parsing


def test_parse_url_defaults_and_options() -> None:
    cfg = parse_url("kafka://broker:19092")
    assert (cfg.bootstrap, cfg.topic, cfg.transactional_id, cfg.create) == (
        "broker:19092", DEFAULT_TOPIC, None, True)
    cfg = parse_url("kafka://a:1,b/my.topic?transactional_id=kai-es-scheduler-0&create=false")
    assert (cfg.bootstrap, cfg.topic, cfg.transactional_id, cfg.create) == (
        "a:1,b:9092", "my.topic", "kai-es-scheduler-0", False)
    log = KafkaEventLog.from_url("kafka://h:1/t?transactional_id=x", transactional_id="y")
    assert (log.bootstrap, log.topic, log.transactional_id) == ("h:1", "t", "y")
    assert KafkaEventLog.from_url("kafka://h:1/t").transactional_id == "kai-es-writer.t"
    for bad in ("kafka:///t", "kafka://h:1/t?colour=red", "kafka://h:1/t?create=maybe", "file:///x"):
        with pytest.raises(KafkaLogError):
            parse_url(bad)


# ------------------------------------------------------------------------------------------
# topic layout


async def test_topic_is_created_with_one_partition_and_unlimited_retention(
        klog: KafkaEventLog, kafka_bootstrap: str) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    assert await klog.end_position() == 0
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        (desc,) = await admin.describe_topics([klog.topic])
        assert len(desc["partitions"]) == 1
        (resp,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, klog.topic,
                            dict.fromkeys(["retention.ms", "retention.bytes", "cleanup.policy"]))])
        (resource,) = resp.to_object()["resources"]
        configs = {c["config_names"]: c["config_value"] for c in resource["config_entries"]}
        assert configs == {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
        assert klog.deadletter_topic in await admin.list_topics()
    finally:
        await admin.close()


async def test_topic_with_more_than_one_partition_is_refused(
        kafka_bootstrap: str, unique_name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(unique_name, 3, 1)])
    finally:
        await admin.close()
    log = KafkaEventLog(kafka_bootstrap, unique_name)
    try:
        with pytest.raises(KafkaLogError, match="has 3 partitions.*exactly 1"):
            await log.end_position()
    finally:
        await log.close()


async def test_missing_topic_with_create_false_is_an_error(
        kafka_bootstrap: str, unique_name: str) -> None:
    log = KafkaEventLog.from_url(f"kafka://{kafka_bootstrap}/{unique_name}?create=false")
    try:
        with pytest.raises(KafkaLogError, match="does not exist"):
            await collect(log)
    finally:
        await log.close()


async def test_records_carry_subject_key_and_cloudevents_headers(
        klog: KafkaEventLog, kafka_bootstrap: str) -> None:
    await klog.append([event(7, subject="pod/default/a")])
    (rec,) = await raw_records(kafka_bootstrap, klog.topic, isolation="read_committed")
    assert rec.key == b"pod/default/a"
    assert decode(rec.value) == event(7, subject="pod/default/a")
    assert dict(rec.headers) == {"ce_type": b"kai.cluster.node.removed", "ce_id": b"id-7",
                                 "content-type": b"application/cloudevents+json"}


# ------------------------------------------------------------------------------------------
# (1) atomicity


async def test_transaction_failing_mid_batch_leaves_nothing_visible(
        klog: KafkaEventLog, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = await klog.append([event(0)])
    producer = klog._producer
    real_send = producer.send
    calls = 0

    async def send_then_fail(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("injected failure after two sends")
        fut = await real_send(*args, **kwargs)
        await fut  # the record really is in the partition before the failure
        return fut

    monkeypatch.setattr(producer, "send", send_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        await klog.append([event(1), event(2), event(3), event(4)])
    monkeypatch.undo()

    # The two records reached the broker, inside a transaction that was aborted ...
    dirty = await raw_records(kafka_bootstrap, klog.topic, isolation="read_uncommitted")
    assert [decode(r.value).id for r in dirty] == ["id-0", "id-1", "id-2"]
    # ... so a read_committed reader (and this log) sees none of them.
    assert [r.envelope.id for r in await collect(klog)] == ["id-0"]

    # The log still works after the aborted transaction.
    later = await klog.append([event(5), event(6)])
    records = await collect(klog)
    assert [r.envelope.id for r in records] == ["id-0", "id-5", "id-6"]
    assert [r.position for r in records] == first + later
    assert later[0] > dirty[-1].offset


async def test_read_raw_sees_what_a_read_committed_consumer_sees(kafka_bootstrap: str,
                                                                 unique_name: str) -> None:
    """`read_raw` reads Fetch answers itself (`kafka_fetch`): on a partition where two producers'
    transactions interleave, one of them aborted while the other committed, plus transaction
    markers and a producer without transactions, it returns exactly the records (offsets and
    bytes) aiokafka's read_committed consumer returns — from any start, up to any end, in
    answers small enough to split batches across fetches."""
    log = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-w")
    await log.append([event(0), event(1)])
    first = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-a")
    second = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-b")
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    for producer in (first, second, plain):
        await producer.start()
    try:
        async def send(producer: AIOKafkaProducer, *values: bytes) -> None:
            for value in values:
                await (await producer.send(unique_name, value, partition=0))

        await first.begin_transaction()
        await second.begin_transaction()
        await send(first, b"aborted-1", b"aborted-2")
        await send(second, b"committed-1")
        await send(plain, b"plain-1")
        await send(first, b"aborted-3")
        await send(second, b"committed-2", b"committed-3")
        await first.abort_transaction()
        await second.commit_transaction()
        await first.begin_transaction()
        await send(first, b"later-1", b"later-2")
        await first.commit_transaction()
    finally:
        for producer in (first, second, plain):
            await producer.stop()
    await log.append([event(2)])
    end = await log.end_position()
    consumed = [(r.offset, r.value) for r in await raw_records(kafka_bootstrap, unique_name,
                                                               isolation="read_committed")]
    assert [v for _, v in consumed][2:-1] == [b"committed-1", b"plain-1", b"committed-2",
                                              b"committed-3", b"later-1", b"later-2"]
    try:
        got = [frame for batch in [b async for b in log.read_raw(0)] for frame in batch]
        assert got == consumed
        offsets = [o for o, _ in consumed]
        for start in range(0, end + 1):
            for stop in sorted({start, min(start + 1, end), min(start + 3, end), end}):
                part = [f for batch in [b async for b in log.read_raw(start, stop)] for f in batch]
                assert part == [f for f in consumed if start <= f[0] < stop], (start, stop)
        assert offsets[-1] < end
        # one record batch per answer (a broker answers with the first batch whatever the size
        # asked): an aborted transaction's batches and its marker come in different answers
        client = AIOKafkaClient(bootstrap_servers=kafka_bootstrap)
        await client.bootstrap()
        try:
            one_by_one = [b async for b in fetch_frames(client, unique_name, 0, end, max_bytes=1)]
        finally:
            await client.close()
        assert [f for batch in one_by_one for f in batch] == consumed and len(one_by_one) > 5
    finally:
        await log.close()


async def test_cancelled_append_is_aborted_and_the_log_stays_usable(
        klog: KafkaEventLog, monkeypatch: pytest.MonkeyPatch) -> None:
    await klog.append([event(0)])
    producer = klog._producer
    real_send = producer.send
    calls = 0

    async def send_then_hang(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            await anyio.sleep_forever()
        fut = await real_send(*args, **kwargs)
        await fut
        return fut

    monkeypatch.setattr(producer, "send", send_then_hang)
    with anyio.move_on_after(0.5) as scope:
        await klog.append([event(1), event(2)])
    assert scope.cancelled_caught
    monkeypatch.undo()
    await klog.append([event(3)])
    assert [r.envelope.id for r in await collect(klog)] == ["id-0", "id-3"]


# ------------------------------------------------------------------------------------------
# (2) fencing


async def test_second_instance_with_same_transactional_id_fences_the_first(
        kafka_bootstrap: str, unique_name: str,
        captured_loop_errors: list[BaseException | None]) -> None:
    txn_id = f"{unique_name}-scheduler-0"
    old = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    new = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    try:
        await old.append([event(0)])
        await new.append([event(1)])  # the new instance starts: InitProducerId fences `old`
        with pytest.raises(FencedError, match=f"transactional_id '{txn_id}' took over.*stops"):
            await old.append([event(2), event(3)])
        with pytest.raises(FencedError):  # refuses for good, without touching Kafka
            await old.append([event(4)])
        await new.append([event(5)])
        assert [r.envelope.id for r in await collect(new)] == ["id-0", "id-1", "id-5"]
        assert [r.envelope.id for r in await collect(old)] == ["id-0", "id-1", "id-5"]
    finally:
        await old.close()
        await new.close()
    gc.collect()
    assert all(isinstance(e, ProducerFenced) for e in captured_loop_errors), captured_loop_errors


async def test_check_writer_finds_a_takeover_without_writing_to_the_topic(
        kafka_bootstrap: str, unique_name: str,
        captured_loop_errors: list[BaseException | None]) -> None:
    """A writer with nothing to append learns from `check_writer` that it was fenced; while it
    is still the writer, checking leaves no record and no marker in the topic."""
    txn_id = f"{unique_name}-scheduler-0"
    old = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    new = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    try:
        await old.claim_writer()
        await old.append([event(0)])
        end = await old.end_position()
        for _ in range(3):
            await old.check_writer()
        assert await old.end_position() == end  # no abort marker took an offset of the topic
        assert len(await raw_records(kafka_bootstrap, unique_name, isolation="read_uncommitted")) == 1
        await old.append([event(1)])  # checking left the producer able to append
        await new.claim_writer()  # the takeover: nothing appended by `new` yet
        with pytest.raises(FencedError, match=f"'{txn_id}' took over.*nothing to write"):
            await old.check_writer()
        with pytest.raises(FencedError):  # and it stays fenced
            await old.append([event(2)])
        await new.check_writer()
        await new.append([event(3)])
        assert [r.envelope.id for r in await collect(new)] == ["id-0", "id-1", "id-3"]
    finally:
        await old.close()
        await new.close()
    gc.collect()
    assert all(isinstance(e, ProducerFenced) for e in captured_loop_errors), captured_loop_errors


async def holder_of(bootstrap: str, txn_id: str) -> Holder | None:
    """`kafka_describe.current_holder` over a client of its own."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        return await current_holder(client, txn_id, timeout_s=10)
    finally:
        await client.close()


async def test_a_later_session_does_not_claim_back_a_role_another_instance_took(
        kafka_bootstrap: str, unique_name: str,
        captured_loop_errors: list[BaseException | None]) -> None:
    """A process's session ended on some error (the log closed, its producer gone) while another
    instance took over; the process's next session shares its `WriterTenure`, so its claim
    first asks the coordinator, finds the takeover and stops — the instance that took over
    keeps writing (a claim without the check would have fenced it)."""
    txn_id = f"{unique_name}-scheduler-0"
    tenure = WriterTenure()
    first = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id, tenure=tenure)
    other = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    again = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id, tenure=tenure)
    try:
        await first.append([event(0)])
        held = tenure.held
        await first.close()
        await other.claim_writer()
        await other.append([event(1)])
        with pytest.raises(FencedError, match=f"'{txn_id}' took over.*before claiming the role again"):
            await again.claim_writer()
        with pytest.raises(FencedError):  # and it refuses every later write
            await again.append([event(2)])
        assert tenure.held == held  # it claimed nothing
        await other.append([event(3)])
        assert [r.envelope.id for r in await collect(other)] == ["id-0", "id-1", "id-3"]
    finally:
        for log in (first, other, again):
            await log.close()
    gc.collect()
    assert all(isinstance(e, ProducerFenced) for e in captured_loop_errors), captured_loop_errors


async def test_a_producer_made_again_in_one_log_does_not_fence_the_instance_that_took_over(
        kafka_bootstrap: str, unique_name: str) -> None:
    """Within one log: a producer dropped after a fatal error (aiokafka's answer to a commit
    it did not understand) is made again for the next append — which finds the takeover."""
    txn_id = f"{unique_name}-scheduler-0"
    first = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    other = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id)
    try:
        await first.append([event(0)])
        await other.claim_writer()
        await first._drop_producer("a test: as after a fatal error")
        with pytest.raises(FencedError, match="before claiming the role again"):
            await first.append([event(1)])
        await other.append([event(2)])
        assert [r.envelope.id for r in await collect(other)] == ["id-0", "id-2"]
    finally:
        await first.close()
        await other.close()


async def test_a_later_session_claims_again_when_nobody_took_over(kafka_bootstrap: str,
                                                                 unique_name: str) -> None:
    """Without a takeover — the role idle, or its transaction aborted by the coordinator when it
    timed out (which moves the epoch too) — the next session claims the role and appends."""
    txn_id = f"{unique_name}-scheduler-0"
    tenure = WriterTenure()
    first = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id, tenure=tenure)
    try:
        await first.append([event(0)])
    finally:
        await first.close()
    assert tenure.held is not None
    again = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id, tenure=tenure)
    try:
        await again.append([event(1)])
        assert tenure.held.epoch == 1  # its own claim moved the epoch: the next check expects it
        # a transaction left open past its timeout: the coordinator aborts it, epoch + 1
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=txn_id,
                                    transaction_timeout_ms=1000)
        await producer.start()
        try:
            txn = producer._txn_manager
            tenure.held = Holder(txn.producer_id, txn.producer_epoch)  # as if ours
            await producer.begin_transaction()
            await (await producer.send(unique_name, b"left open", partition=0))
            deadline = time.monotonic() + 30
            while (await holder_of(kafka_bootstrap, txn_id) or Holder(-1, -1)).state != "CompleteAbort":
                assert time.monotonic() < deadline, "the coordinator never aborted the transaction"
                await anyio.sleep(0.2)
        finally:
            with contextlib.suppress(Exception):
                await producer.stop()
        await again._drop_producer("a test: the session ended")
        await again.append([event(2)])
        assert [r.envelope.id for r in await collect(again)] == ["id-0", "id-1", "id-2"]
    finally:
        await again.close()


async def test_the_coordinator_says_who_holds_a_transactional_id(kafka_bootstrap: str,
                                                                unique_name: str) -> None:
    """DescribeTransactions on a real broker: nobody before the first claim, then the claiming
    producer's id and epoch, then the epoch of each later claim."""
    txn_id = f"{unique_name}-scheduler-0"

    async def ask() -> Holder | None:
        return await holder_of(kafka_bootstrap, txn_id)

    assert await ask() is None
    tenure = WriterTenure()
    log = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=txn_id, tenure=tenure)
    try:
        await log.claim_writer()
        assert tenure.held is not None
        assert await ask() == Holder(tenure.held.producer_id, tenure.held.epoch, "Empty")
        await log.append([event(0)])
        assert await ask() == Holder(tenure.held.producer_id, tenure.held.epoch, "CompleteCommit")
    finally:
        await log.close()


# ------------------------------------------------------------------------------------------
# (3) dead letters


async def test_undecodable_record_is_dead_lettered_and_skipped(
        klog: KafkaEventLog, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    await klog.append([event(0)])
    raw = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await raw.start()
    try:
        meta = await raw.send_and_wait(klog.topic, b"not json", key=b"k", partition=0)
    finally:
        await raw.stop()
    bad = meta.offset
    await klog.append([event(2)])

    with caplog.at_level(logging.WARNING, logger="kai_es.adapters.kafka_log"):
        records = await collect(klog)
    assert [r.envelope.id for r in records] == ["id-0", "id-2"]
    assert records[1].position > bad
    assert len(klog.dead_letters) == 1
    assert klog.dead_letters[0][0] == bad
    assert "not a kai-es envelope" in klog.dead_letters[0][1]
    assert any(f"offset {bad}" in r.getMessage() for r in caplog.records)

    # A second read skips it again without a second copy; reads from after it are unaffected.
    assert [r.envelope.id for r in await collect(klog)] == ["id-0", "id-2"]
    assert [r.envelope.id for r in await collect(klog, bad + 1)] == ["id-2"]
    assert len(klog.dead_letters) == 1

    (dead,) = await raw_records(kafka_bootstrap, klog.deadletter_topic, isolation="read_committed")
    assert dead.key == str(bad).encode()
    assert dead.value == b"not json"
    headers = dict(dead.headers)
    assert b"not a kai-es envelope" in headers["kai_es_reason"]
    assert headers["kai_es_source_offset"] == str(bad).encode()


async def test_follow_reader_skips_an_undecodable_record(
        klog: KafkaEventLog, kafka_bootstrap: str) -> None:
    seen: list[str] = []

    async def reader() -> None:
        async for record in klog.read(0, follow=True):
            seen.append(record.envelope.id)
            if len(seen) == 2:
                return

    raw = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await raw.start()
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                await klog.append([event(0)])
                tg.start_soon(reader)
                meta = await raw.send_and_wait(klog.topic, b"\xff\xfe", partition=0)
                await klog.append([event(1)])
    finally:
        await raw.stop()
    assert seen == ["id-0", "id-1"]
    assert [d.offset for d in klog.dead_letters] == [meta.offset]


# ------------------------------------------------------------------------------------------
# (4) positions are offsets: increasing, not dense


async def test_positions_are_not_dense_but_read_and_end_position_agree(klog: KafkaEventLog) -> None:
    batches = [await klog.append([event(3 * b + i) for i in range(3)]) for b in range(4)]
    flat = [p for batch in batches for p in batch]
    # inside a transaction offsets are consecutive; each commit marker takes one offset
    for batch in batches:
        assert batch == list(range(batch[0], batch[0] + 3))
    for prev, nxt in zip(batches, batches[1:], strict=False):
        assert nxt[0] == prev[-1] + 2
    end = await klog.end_position()
    assert end == flat[-1] + 2

    assert [r.position for r in await collect(klog)] == flat
    # from a marker's offset: the next records; from the end: nothing
    assert [r.position for r in await collect(klog, batches[1][-1] + 1)] == flat[6:]
    assert await collect(klog, end) == []
    assert await collect(klog, end + 100) == []
    # a reader started at the end sees exactly what is appended later
    later = await klog.append([event(99)])
    assert [r.position for r in await collect(klog, end)] == later
    assert later[0] >= end


async def test_appends_from_another_instance_are_visible_when_append_returns(
        kafka_bootstrap: str, unique_name: str) -> None:
    writer = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-w")
    reader = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-r")
    try:
        for i in range(20):
            [pos] = await writer.append([event(i)])
            assert await reader.end_position() > pos
            records = await collect(reader, pos)
            assert [r.envelope.id for r in records] == [f"id-{i}"]
    finally:
        await writer.close()
        await reader.close()


def test_one_log_serves_successive_event_loops(kafka_bootstrap: str, unique_name: str) -> None:
    """The CLI pattern: `anyio.run` to write, later `anyio.run` to read, the same object."""
    log = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-w")

    async def write(i: int) -> list[int]:
        try:
            return await log.append([event(i)])
        finally:
            await log.close()

    async def read_all() -> list[str]:
        try:
            return [r.envelope.id for r in await collect(log)]
        finally:
            await log.close()

    anyio.run(write, 0)
    assert anyio.run(read_all) == ["id-0"]
    anyio.run(write, 1)
    assert anyio.run(read_all) == ["id-0", "id-1"]


# ------------------------------------------------------------------------------------------
# (5) wiring: open_log and the CLI


async def test_open_log_and_cli_events_read_a_kafka_log(kafka_bootstrap: str, unique_name: str) -> None:
    from kai_es.app import open_log

    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    log = open_log(f"{url}?transactional_id={unique_name}-w")
    assert isinstance(log, KafkaEventLog)
    assert (log.topic, log.transactional_id) == (unique_name, f"{unique_name}-w")
    try:
        positions = await log.append([event(0, "node/a"), event(1, "node/b")])
        positions += await log.append([event(2, "node/c")])
    finally:
        await log.close()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await anyio.run_process([sys.executable, "-m", "kai_es", "events", url, "-o", "json"],
                                   cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [(x["position"], x["event"]["id"], x["event"]["subject"]) for x in lines] == [
        (positions[0], "id-0", "node/a"), (positions[1], "id-1", "node/b"),
        (positions[2], "id-2", "node/c")]

    proc = await anyio.run_process([sys.executable, "-m", "kai_es", "events", url,
                                    "--from", str(positions[2])],
                                   cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    (line,) = proc.stdout.decode().splitlines()
    assert "kai.cluster.node.removed" in line and "node/c" in line
