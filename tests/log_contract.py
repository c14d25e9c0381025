"""The EventLog contract, one suite for every backend (eventsourcing's tests/persistence.py
pattern). A backend's test module subclasses `EventLogContract` and provides `make_log`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ports import EventLog


def event(i: int, subject: str = "node/n") -> Envelope:
    return make_envelope(p.NodeRemoved(name=f"n{i}"), event_id=f"id-{i}", source="test",
                         subject=subject, logicaltime=1_000 + i)


async def collect(log: EventLog, start: int = 0) -> list[Record]:
    return [r async for r in log.read(start)]


class EventLogContract:
    """Subclass and implement `make_log` (an async context manager factory via fixture)."""

    @pytest.fixture
    async def log(self) -> AsyncIterator[EventLog]:  # pragma: no cover - overridden
        raise NotImplementedError
        yield

    async def test_empty_log(self, log: EventLog) -> None:
        assert await collect(log) == []
        end = await log.end_position()
        assert await collect(log, end) == []

    async def test_append_returns_increasing_positions(self, log: EventLog) -> None:
        first = await log.append([event(0), event(1)])
        second = await log.append([event(2)])
        assert len(first) == 2 and len(second) == 1
        assert first[0] < first[1] < second[0]
        assert await log.end_position() > second[0]

    async def test_read_returns_events_in_order_with_their_positions(self, log: EventLog) -> None:
        positions = await log.append([event(i) for i in range(5)])
        records = await collect(log)
        assert [r.position for r in records] == positions
        assert [r.envelope for r in records] == [event(i) for i in range(5)]

    async def test_read_from_a_position(self, log: EventLog) -> None:
        positions = await log.append([event(i) for i in range(6)])
        records = await collect(log, positions[3])
        assert [r.envelope.id for r in records] == ["id-3", "id-4", "id-5"]

    async def test_read_from_end_yields_only_later_appends(self, log: EventLog) -> None:
        await log.append([event(0)])
        end = await log.end_position()
        assert await collect(log, end) == []
        await log.append([event(1)])
        assert [r.envelope.id for r in await collect(log, end)] == ["id-1"]

    async def test_empty_append_is_a_no_op(self, log: EventLog) -> None:
        assert await log.append([]) == []
        assert await collect(log) == []

    async def test_follow_waits_for_new_records(self, log: EventLog) -> None:
        await log.append([event(0)])
        seen: list[str] = []

        async def reader() -> None:
            async for record in log.read(0, follow=True):
                seen.append(record.envelope.id)
                if len(seen) == 3:
                    return

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await anyio.sleep(0.05)
                await log.append([event(1), event(2)])
        assert seen == ["id-0", "id-1", "id-2"]

    async def test_round_trip_is_byte_exact(self, log: EventLog) -> None:
        from kai_es.events import encode

        env = make_envelope(p.PodUnschedulable(
            namespace="default", name="a", uid="u", podgroup="g", queue="q",
            reasons=(p.Reason(code="NoNodeFits", message="0/3 nodes: ünïcode ok", numbers={"nodes": 3}),)),
            event_id="x", source="test", subject="pod/default/a", logicaltime=5, basedon=0,
            statedigest="sha256:00")
        await log.append([env])
        [record] = await collect(log)
        assert encode(record.envelope) == encode(env)
