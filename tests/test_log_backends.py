"""The EventLog contract run against the memory and file backends, plus file-log crash safety."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from kai_es.adapters.file_log import CorruptLogError, FileEventLog, frame
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import encode
from kai_es.ports import EventLog
from tests.log_contract import EventLogContract, collect, event


class TestMemoryLog(EventLogContract):
    @pytest.fixture
    async def log(self) -> AsyncIterator[EventLog]:
        yield MemoryEventLog()


class TestFileLog(EventLogContract):
    @pytest.fixture
    async def log(self, tmp_path: Path) -> AsyncIterator[EventLog]:
        yield FileEventLog(tmp_path / "events.log", poll_interval_s=0.01)


async def test_file_log_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    await FileEventLog(path).append([event(0), event(1)])
    reopened = FileEventLog(path)
    assert [r.envelope.id for r in await collect(reopened)] == ["id-0", "id-1"]
    assert await reopened.append([event(2)]) == [2]


async def test_torn_last_record_is_reported_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    await FileEventLog(path).append([event(0), event(1)])
    whole = path.read_bytes()
    torn = frame(encode(event(2)))[:-25]  # crash in the middle of writing record 2
    path.write_bytes(whole + torn)
    log = FileEventLog(path)
    assert log.recovered is not None
    assert log.recovered.position == 2
    assert "cut short" in log.recovered.reason
    assert path.read_bytes() == whole
    assert [r.envelope.id for r in await collect(log)] == ["id-0", "id-1"]
    assert await log.append([event(3)]) == [2]


async def test_read_only_open_ignores_torn_tail_without_changing_the_file(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    await FileEventLog(path).append([event(0)])
    content = path.read_bytes() + b"0000"
    path.write_bytes(content)
    log = FileEventLog(path, readonly=True)
    assert log.recovered is not None
    assert path.read_bytes() == content
    assert len(await collect(log)) == 1


async def test_corrupt_record_in_the_middle_names_its_position(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    await FileEventLog(path).append([event(i) for i in range(4)])
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"id-1", b"id-X")  # bit rot: CRC no longer matches
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptLogError, match="position 1.*CRC mismatch"):
        FileEventLog(path)


async def test_corrupt_record_with_valid_crc_is_reported_on_read(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    await FileEventLog(path).append([event(0)])
    with open(path, "ab") as f:
        f.write(frame(b'{"not":"an event"}'))
    await FileEventLog(path).append([event(2)])
    log = FileEventLog(path)
    with pytest.raises(CorruptLogError, match="position 1.*not a kai-es envelope"):
        await collect(log)


def _appender(path: str, worker: int, count: int) -> None:
    async def run() -> None:
        log = FileEventLog(path)
        for i in range(count):
            await log.append([event(worker * 1000 + i), event(worker * 1000 + i + 500)])

    anyio.run(run)


async def test_concurrent_appenders_in_other_processes_never_interleave(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.log")
    FileEventLog(path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_appender, args=(path, w, 40)) for w in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    records = await collect(FileEventLog(path))
    assert [r.position for r in records] == list(range(240))
    # each batch of two stayed adjacent
    ids = [r.envelope.id for r in records]
    for i in range(0, 240, 2):
        a, b = int(ids[i][3:]), int(ids[i + 1][3:])
        assert b == a + 500
    assert os.path.getsize(path) > 0
