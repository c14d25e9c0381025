"""Smoke tests against a REAL Kafka broker (tools/kafka/broker.py, one per session).

They prove the pieces the event log relies on work end to end with aiokafka 0.14:
admin topic creation, idempotent produce with keys/headers, transactions whose isolation is
real (read_committed vs read_uncommitted), producer fencing, and consume->process->produce with
send_offsets_to_transaction.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import ProducerFenced, TopicAlreadyExistsError, for_code

RECEIVE_TIMEOUT_S = 20.0


# ------------------------------------------------------------------------------------------
# helpers


async def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resp = await admin.create_topics([NewTopic(name, partitions, 1)])
        errors = {t["topic"]: t["error_code"] for t in resp.to_object()["topic_errors"]}
        assert errors == {name: 0}, resp.to_object()
    finally:
        await admin.close()


def consumer(bootstrap: str, *topics: str, **kw: Any) -> AIOKafkaConsumer:
    kw.setdefault("auto_offset_reset", "earliest")
    kw.setdefault("enable_auto_commit", False)
    return AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, **kw)


async def receive(
    c: AIOKafkaConsumer, n: int, *, until: bytes | None = None, timeout_s: float = RECEIVE_TIMEOUT_S
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read until n records arrived (or a record with value `until` arrived), or time out.

    Returns what was read; callers assert on it, so a timeout shows what was missing.
    """
    got: list[ConsumerRecord[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        batches = await c.getmany(timeout_ms=200)
        for records in batches.values():
            got.extend(records)
        if until is not None and any(r.value == until for r in got):
            break
    return got


@pytest.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    a = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await a.start()
    try:
        yield a
    finally:
        await a.close()


# ------------------------------------------------------------------------------------------
# (a) admin


async def test_admin_creates_single_partition_topic(
    admin: AIOKafkaAdminClient, unique_name: str
) -> None:
    topic = f"{unique_name}-t"
    resp = await admin.create_topics([NewTopic(topic, 1, 1)])
    assert resp.to_object()["topic_errors"] == [
        {"topic": topic, "error_code": 0, "error_message": None}
    ]

    (desc,) = await admin.describe_topics([topic])
    assert desc["error_code"] == 0
    assert desc["topic"] == topic
    assert [(p["partition"], p["leader"], p["replicas"]) for p in desc["partitions"]] == [
        (0, 1, [1])
    ]
    assert topic in await admin.list_topics()

    # Creating it again is refused by the broker (the response carries the error code).
    again = (await admin.create_topics([NewTopic(topic, 1, 1)])).to_object()["topic_errors"]
    assert for_code(again[0]["error_code"]) is TopicAlreadyExistsError


# ------------------------------------------------------------------------------------------
# (b) idempotent producer


async def test_idempotent_producer_roundtrip_keys_headers_in_order(
    kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"{unique_name}-t"
    await create_topic(kafka_bootstrap, topic)
    n = 25
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all"
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=f"value-{i}".encode(),
                key=f"key-{i % 3}".encode(),
                headers=[("seq", str(i).encode()), ("source", b"smoke")],
            )
            for i in range(n)
        ]
        metas = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    assert [(m.topic, m.partition, m.offset) for m in metas] == [(topic, 0, i) for i in range(n)]

    c = consumer(kafka_bootstrap, topic)
    await c.start()
    try:
        got = await receive(c, n)
    finally:
        await c.stop()
    assert [r.offset for r in got] == list(range(n))
    assert [r.value for r in got] == [f"value-{i}".encode() for i in range(n)]
    assert [r.key for r in got] == [f"key-{i % 3}".encode() for i in range(n)]
    assert [list(r.headers) for r in got] == [
        [("seq", str(i).encode()), ("source", b"smoke")] for i in range(n)
    ]


# ------------------------------------------------------------------------------------------
# (c) transactions: commit vs abort, read_committed vs read_uncommitted


async def test_read_committed_hides_aborted_transaction(
    kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"{unique_name}-t"
    await create_topic(kafka_bootstrap, topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-txn"
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1", key=b"k")
            await producer.send_and_wait(topic, b"committed-2", key=b"k")

        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted-1", key=b"k")
        await producer.send_and_wait(topic, b"aborted-2", key=b"k")
        await producer.abort_transaction()

        # A later committed transaction: once a read_committed consumer has seen it, it has
        # provably read past the aborted records instead of merely not having reached them.
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-3", key=b"k")
    finally:
        await producer.stop()

    committed = consumer(kafka_bootstrap, topic, isolation_level="read_committed")
    uncommitted = consumer(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    await committed.start()
    await uncommitted.start()
    try:
        seen_committed = await receive(committed, 10, until=b"committed-3")
        seen_uncommitted = await receive(uncommitted, 5)
        # Nothing else turns up for the read_committed reader either.
        seen_committed += await receive(committed, 10, timeout_s=0.5)
        tp = TopicPartition(topic, 0)
        end = (await committed.end_offsets([tp]))[tp]
    finally:
        await committed.stop()
        await uncommitted.stop()

    assert [r.value for r in seen_committed] == [b"committed-1", b"committed-2", b"committed-3"]
    assert [r.value for r in seen_uncommitted] == [
        b"committed-1",
        b"committed-2",
        b"aborted-1",
        b"aborted-2",
        b"committed-3",
    ]
    # 5 data records + 3 transaction markers (commit, abort, commit) occupy offsets 0..7.
    assert [r.offset for r in seen_uncommitted] == [0, 1, 3, 4, 6]
    assert end == 8


# ------------------------------------------------------------------------------------------
# (d) fencing


async def _fence(bootstrap: str, topic: str, txn_id: str) -> None:
    first = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    second = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    await first.start()
    try:
        async with first.transaction():
            await first.send_and_wait(topic, b"first-ok")

        await second.start()  # InitProducerId bumps the epoch: `first` is now a zombie
        try:
            # aiokafka raises ProducerFenced (the broker answers AddPartitionsToTxn with
            # INVALID_PRODUCER_EPOCH) from the zombie's next transactional send, and the
            # transaction context re-raises it without trying to abort.
            with pytest.raises(ProducerFenced):
                async with first.transaction():
                    await first.send_and_wait(topic, b"zombie")
            async with second.transaction():
                await second.send_and_wait(topic, b"second-ok")
        finally:
            await second.stop()
    finally:
        await first.stop()


async def test_second_producer_with_same_transactional_id_fences_first(
    kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"{unique_name}-t"
    await create_topic(kafka_bootstrap, topic)

    # The fenced producer leaves internal futures holding ProducerFenced that nobody awaits;
    # collect them here (with the loop's handler capturing the "never retrieved" reports) so
    # they are not finalized later at a random point. See tools/kafka/README.md (pitfalls).
    loop = asyncio.get_running_loop()
    unretrieved: list[BaseException | None] = []
    loop.set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx.get("exception")))
    try:
        await _fence(kafka_bootstrap, topic, f"{unique_name}-txn")
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert unretrieved, "expected aiokafka's fenced-producer futures to be collected"
    assert all(isinstance(e, ProducerFenced) for e in unretrieved), unretrieved

    c = consumer(kafka_bootstrap, topic, isolation_level="read_committed")
    await c.start()
    try:
        got = await receive(c, 10, until=b"second-ok")
        got += await receive(c, 10, timeout_s=0.5)
    finally:
        await c.stop()
    assert [r.value for r in got] == [b"first-ok", b"second-ok"]


# ------------------------------------------------------------------------------------------
# (e) consume -> process -> produce with send_offsets_to_transaction


async def test_send_offsets_to_transaction_commits_group_offset_atomically(
    kafka_bootstrap: str, unique_name: str
) -> None:
    src, dst = f"{unique_name}-in", f"{unique_name}-out"
    group = f"{unique_name}-group"
    await create_topic(kafka_bootstrap, src)
    await create_topic(kafka_bootstrap, dst)
    tp_in = TopicPartition(src, 0)

    feeder = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await feeder.start()
    try:
        for i in range(6):
            await feeder.send_and_wait(src, f"in-{i}".encode())
    finally:
        await feeder.stop()

    worker_in = consumer(
        kafka_bootstrap, src, group_id=group, isolation_level="read_committed"
    )
    worker_out = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-txn"
    )
    await worker_in.start()
    await worker_out.start()
    try:
        batch = await receive(worker_in, 6)
        assert [r.value for r in batch] == [f"in-{i}".encode() for i in range(6)]

        # Transaction 1 processes in-0..in-3 and commits the group offset 4 with the output.
        async with worker_out.transaction():
            for r in batch[:4]:
                await worker_out.send_and_wait(dst, r.value.upper())
            await worker_out.send_offsets_to_transaction({tp_in: batch[3].offset + 1}, group)

        # Transaction 2 processes in-4..in-5 but aborts: neither output nor offset may stick.
        await worker_out.begin_transaction()
        for r in batch[4:]:
            await worker_out.send_and_wait(dst, r.value.upper())
        await worker_out.send_offsets_to_transaction({tp_in: batch[5].offset + 1}, group)
        await worker_out.abort_transaction()
    finally:
        await worker_out.stop()
        await worker_in.stop()

    # A fresh member of the group sees exactly the offset committed by transaction 1 ...
    fresh = consumer(kafka_bootstrap, group_id=group, isolation_level="read_committed")
    await fresh.start()
    try:
        assert await fresh.committed(tp_in) == 4
        # ... and resumes from it.
        fresh.subscribe([src])
        resumed = await receive(fresh, 2)
    finally:
        await fresh.stop()
    assert [r.value for r in resumed] == [b"in-4", b"in-5"]

    out = consumer(kafka_bootstrap, dst, isolation_level="read_committed")
    await out.start()
    try:
        produced = await receive(out, 4)
        produced += await receive(out, 10, timeout_s=0.5)
    finally:
        await out.stop()
    assert [r.value for r in produced] == [b"IN-0", b"IN-1", b"IN-2", b"IN-3"]
