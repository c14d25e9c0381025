"""The file event log over the mmap indexer: the EventLog contract with the pure-Python twin,
and the file-log guarantees with both indexers (empty files, views outliving remaps, other
writers' appends and torn tails, files changed after verification)."""

from __future__ import annotations

import logging
import os
import zlib
from array import array
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_es.adapters.file_log import CorruptLogError, FileEventLog, frame
from kai_es.adapters.framing import Buffer, FrameScan, LineIndexer, PythonIndexer, load_indexer
from kai_es.events import encode
from kai_es.ports import EventLog
from tests.log_contract import EventLogContract, collect, event


class TestFileLogWithTheTwin(EventLogContract):
    @pytest.fixture
    async def log(self, tmp_path: Path) -> AsyncIterator[EventLog]:
        yield FileEventLog(tmp_path / "events.log", poll_interval_s=0.01, indexer=PythonIndexer())


@pytest.fixture(params=["native", "python"])
def indexer(request: pytest.FixtureRequest) -> LineIndexer:
    return load_indexer(request.param)


def line(i: int) -> bytes:
    return frame(encode(event(i)))


def ids(log: FileEventLog) -> list[str]:
    return [r.envelope.id for r in log.scan()]


async def test_empty_file(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    path.touch()
    for readonly in (True, False):
        log = FileEventLog(path, readonly=readonly, indexer=indexer)
        assert log.recovered is None
        assert await log.end_position() == 0
        assert list(log.scan()) == [] and list(log.scan_raw(0, 5)) == []
    assert await log.append([event(0)]) == [0]
    assert ids(log) == ["id-0"]


async def test_views_outlive_remaps_and_close(tmp_path: Path, indexer: LineIndexer) -> None:
    log = FileEventLog(tmp_path / "e.log", indexer=indexer)
    await log.append([event(0), event(1)])
    frames = log._frames(0, None)
    pos, view = next(frames)  # the generator holds its map while it runs
    for i in range(2, 40):  # the file grows: later reads map it again
        await log.append([event(i)])
    assert [p for p, _ in log._frames(0, None)] == list(range(40))
    held = [v for _, v in log._frames(30, 35)]
    await log.close()
    assert (pos, bytes(view)) == (0, encode(event(0)))
    assert [p for p, _ in frames] == [1]  # the lines indexed when the iteration started
    assert [bytes(v) for v in held] == [encode(event(i)) for i in range(30, 35)]
    del frames, view, held  # the old maps go with the last views


async def test_appends_by_another_writer_are_picked_up(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    writer = FileEventLog(path)
    reader = FileEventLog(path, readonly=True, indexer=indexer)
    await writer.append([event(0)])
    assert ids(reader) == ["id-0"]
    await writer.append([event(i) for i in range(1, 300)])  # past the first page of the file
    assert await reader.end_position() == 300
    assert [r.position for r in reader.scan(298)] == [298, 299]
    assert [r.envelope.id for r in await collect(reader, 150)] == [f"id-{i}" for i in range(150, 300)]


async def test_a_line_being_appended_is_indexed_once_complete(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, indexer=indexer)
    await log.append([event(0)])
    whole = line(1)
    with open(path, "ab") as f:  # another writer, mid-append (it holds the lock)
        f.write(whole[:30])
    assert await log.end_position() == 1
    assert ids(log) == ["id-0"]
    assert log.recovered is None
    with open(path, "ab") as f:
        f.write(whole[30:])
    assert await log.end_position() == 2
    assert ids(log) == ["id-0", "id-1"]


async def test_an_append_truncates_a_crashed_writers_torn_tail(
        tmp_path: Path, indexer: LineIndexer, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, indexer=indexer)
    await log.append([event(0)])
    clean = path.read_bytes()
    with open(path, "ab") as f:  # a writer died in the middle of its write, after our open
        f.write(line(1)[:25])
    with caplog.at_level(logging.WARNING, logger="kai_es.adapters.file_log"):
        assert await log.append([event(2)]) == [1]
    assert log.recovered is not None and log.recovered.byte_offset == len(clean)
    assert any("truncating torn last record at position 1" in r.getMessage() for r in caplog.records)
    assert path.read_bytes() == clean + line(2)
    assert ids(FileEventLog(path, indexer=indexer)) == ["id-0", "id-2"]


async def test_writer_open_truncates_only_what_is_still_torn(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    path.write_bytes(line(0) + line(1)[:-1])
    log = FileEventLog(path, indexer=indexer)
    assert log.recovered is not None and log.recovered.position == 1
    assert path.read_bytes() == line(0)
    assert await log.append([event(1)]) == [1]
    assert ids(log) == ["id-0", "id-1"]


class _FinishesAnAppendAfterTheFirstLook:
    """An indexer through which the open sees another writer's append before it completes."""

    def __init__(self, inner: LineIndexer, path: Path, rest: bytes) -> None:
        self.inner, self.path, self.rest = inner, path, rest

    @property
    def kind(self) -> str:
        return self.inner.kind

    def index(self, buf: Buffer, offsets: array[int], *, start: int = 0, base: int = 0,
              cap: int | None = None) -> FrameScan:
        scan = self.inner.index(buf, offsets, start=start, base=base, cap=cap)
        if self.rest:
            with open(self.path, "ab") as f:
                f.write(self.rest)
            self.rest = b""
        return scan

    def check(self, buf: Buffer, starts: array[int]) -> int:
        return self.inner.check(buf, starts)


async def test_writer_open_does_not_truncate_another_writers_append_in_progress(
        tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    path.write_bytes(line(0) + line(1)[:40])
    log = FileEventLog(path, indexer=_FinishesAnAppendAfterTheFirstLook(indexer, path, line(1)[40:]))
    assert log.recovered is None  # looked again under the lock: the line was complete
    assert path.read_bytes() == line(0) + line(1)
    assert ids(log) == ["id-0", "id-1"]


async def test_a_terminated_last_line_that_does_not_verify_is_corruption_not_a_torn_tail(
        tmp_path: Path, indexer: LineIndexer) -> None:
    # An append writes whole lines: a crash leaves bytes after the last newline, never a whole
    # line with a wrong CRC. That is a flipped bit, and it is reported, never dropped as "torn".
    path = tmp_path / "e.log"
    bad = line(1).replace(b"id-1", b"id-X")  # the last line is whole but its CRC does not match
    content = line(0) + bad
    path.write_bytes(content)
    for readonly in (True, False):
        with pytest.raises(CorruptLogError, match="position 1.*CRC mismatch"):
            FileEventLog(path, readonly=readonly, indexer=indexer)
    assert path.read_bytes() == content  # nothing truncated
    with open(path, "ab") as f:  # in the middle it is corruption as well
        f.write(line(2))
    with pytest.raises(CorruptLogError, match="position 1.*CRC mismatch"):
        FileEventLog(path, readonly=True, indexer=indexer)


async def test_read_only_keeps_ignoring_an_unterminated_torn_tail(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    content = line(0) + line(1)[:-1]  # the newline never made it
    path.write_bytes(content)
    log = FileEventLog(path, readonly=True, indexer=indexer)
    assert log.recovered is not None and log.recovered.reason == "the last append is not complete (write was cut short)"
    assert ids(log) == ["id-0"]
    assert await log.end_position() == 1
    assert path.read_bytes() == content


async def test_corruption_in_the_middle_found_by_a_later_look(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, indexer=indexer)
    await log.append([event(0)])
    with open(path, "ab") as f:
        f.write(b"0000000g\t{}\n" + line(2))
    with pytest.raises(CorruptLogError, match="position 1.*not hexadecimal"):
        await log.end_position()


async def test_a_file_shortened_after_verification_is_reported(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, indexer=indexer)
    for i in range(5):  # five batches of one: a reader may hand out the first two
        await log.append([event(i)])
    content = path.read_bytes()
    path.write_bytes(content[:len(line(0)) * 2 + 3])
    assert ids(FileEventLog(path, readonly=True)) == ["id-0", "id-1"]
    with pytest.raises(CorruptLogError, match="position 2.*changed after it was verified"):
        list(log.scan())
    assert [r.position for r in log.scan(0, 2)] == [0, 1]  # the lines still there can be read


async def test_a_file_rewritten_after_verification_is_reported(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, indexer=indexer)
    await log.append([event(i) for i in range(3)])
    content = bytearray(path.read_bytes())
    cut = len(line(0)) + len(line(1)) - 1
    content[cut - 5], content[cut] = 0x0A, 0x20  # line 1 now ends 5 bytes earlier
    path.write_bytes(bytes(content))
    with pytest.raises(CorruptLogError, match="position 1.*changed after it was verified"):
        list(log.scan())
    assert os.path.getsize(path) == len(content)


# ----------------------------------------------------------------------------- one append, one batch


def batch_lines(first: int, n: int) -> bytes:
    """The bytes of one append of events first..first+n-1, as `FileEventLog.append` writes them."""
    return b"".join(frame(encode(event(i)), more=i < first + n - 1) for i in range(first, first + n))


async def test_an_append_of_several_records_is_one_batch(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path)
    await log.append([event(0)])
    await log.append([event(i) for i in range(1, 4)])
    assert path.read_bytes() == line(0) + batch_lines(1, 3)
    lines = path.read_bytes().splitlines()
    assert [ln[8:9] for ln in lines] == [b"\t", b"+", b"+", b"\t"]


async def test_an_append_torn_anywhere_recovers_to_the_batch_boundary(tmp_path: Path, indexer: LineIndexer) -> None:
    # A crash while one append (a cycle's decisions, a gang's binds) is being written leaves any
    # prefix of it: whole lines of it as well as a cut line. No reader sees any of it, and the
    # next writer removes all of it, never a part.
    clean = line(0) + batch_lines(1, 2)
    torn_batch = batch_lines(3, 4)
    for cut in range(1, len(torn_batch)):
        path = tmp_path / f"e{cut}.log"
        path.write_bytes(clean + torn_batch[:cut])
        reader = FileEventLog(path, readonly=True, indexer=indexer)
        assert ids(reader) == ["id-0", "id-1", "id-2"], cut
        assert reader.recovered is not None and reader.recovered.position == 3, cut
        assert reader.recovered.byte_offset == len(clean) and reader.recovered.length == cut, cut
        assert path.read_bytes() == clean + torn_batch[:cut]  # a read-only opener changes nothing
        writer = FileEventLog(path, indexer=indexer)
        assert writer.recovered is not None and writer.recovered.position == 3, cut
        assert path.read_bytes() == clean, cut
        assert await writer.append([event(9)]) == [3]
        assert ids(FileEventLog(path, readonly=True, indexer=indexer)) == ["id-0", "id-1", "id-2", "id-9"]


async def test_a_reader_never_sees_part_of_an_append_in_progress(tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    writer = FileEventLog(path)
    await writer.append([event(0)])
    reader = FileEventLog(path, readonly=True, indexer=indexer)
    whole = batch_lines(1, 3)
    for cut in range(1, len(whole)):  # another writer's append, seen after each byte
        with open(path, "ab") as f:
            f.write(whole[cut - 1:cut])
        assert await reader.end_position() == 1, cut
        assert ids(reader) == ["id-0"], cut
        assert reader.recovered is None  # in progress, not torn: nothing reported
    with open(path, "ab") as f:
        f.write(whole[-1:])
    assert await reader.end_position() == 4
    assert ids(reader) == ["id-0", "id-1", "id-2", "id-3"]


async def test_an_append_truncates_a_crashed_writers_whole_lines_of_a_torn_batch(
        tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, indexer=indexer)
    await log.append([event(0)])
    clean = path.read_bytes()
    with open(path, "ab") as f:  # a writer died after two whole lines of its four
        f.write(batch_lines(1, 4)[:len(line(1)) * 2])
    assert await log.end_position() == 1
    assert await log.append([event(7), event(8)]) == [1, 2]
    assert log.recovered is not None and log.recovered.position == 1
    assert path.read_bytes() == clean + frame(encode(event(7)), more=True) + line(8)


async def test_a_bad_line_inside_a_batch_is_corruption_named_by_its_own_position(
        tmp_path: Path, indexer: LineIndexer) -> None:
    path = tmp_path / "e.log"
    lines = (line(0) + batch_lines(1, 3)).splitlines(keepends=True)
    lines[2] = lines[2].replace(b"id-2", b"id-X")
    path.write_bytes(b"".join(lines))
    for readonly in (True, False):
        with pytest.raises(CorruptLogError, match=r"position 2 .*CRC mismatch \(in the append that starts at position 1\)"):
            FileEventLog(path, readonly=readonly, indexer=indexer)


async def test_a_log_written_before_batches_reads_as_before(tmp_path: Path, indexer: LineIndexer) -> None:
    # Every line of an older log ends with a tab: each is a batch of one.
    old = b"".join(b"%08x\t%s\n" % (zlib.crc32(encode(event(i))), encode(event(i))) for i in range(5))
    path = tmp_path / "old.log"
    path.write_bytes(old + old[:7])  # with an old-style torn tail
    assert ids(FileEventLog(path, readonly=True, indexer=indexer)) == [f"id-{i}" for i in range(5)]
    log = FileEventLog(path, indexer=indexer)
    assert path.read_bytes() == old
    assert await log.append([event(5), event(6)]) == [5, 6]
    assert ids(FileEventLog(path, readonly=True, indexer=indexer)) == [f"id-{i}" for i in range(7)]


# ----------------------------------------------------------------------------- the bounded offset index


class TestFileLogWithATinyOffsetIndex(EventLogContract):
    """The whole contract with an index that keeps 3 offsets and marks every 2 lines."""

    @pytest.fixture
    async def log(self, tmp_path: Path) -> AsyncIterator[EventLog]:
        yield FileEventLog(tmp_path / "events.log", poll_interval_s=0.01, dense_lines=3, mark_every=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.integers(1, 7), min_size=1, max_size=25), dense=st.integers(1, 6),
       every=st.integers(1, 5), ranges=st.lists(st.tuples(st.integers(0, 120), st.integers(0, 120)), max_size=8),
       kind=st.sampled_from(["native", "python"]))
def test_any_range_reads_the_same_through_a_bounded_index(
        tmp_path_factory: pytest.TempPathFactory, batches: list[int], dense: int, every: int,
        ranges: list[tuple[int, int]], kind: str) -> None:
    path = tmp_path_factory.mktemp("idx") / "e.log"
    indexer = load_indexer(kind)  # type: ignore[arg-type]
    log = FileEventLog(path, indexer=indexer, dense_lines=dense, mark_every=every)
    n = 0
    for size in batches:
        anyio.run(log.append, [event(i) for i in range(n, n + size)])
        n += size
    expected = [encode(event(i)) for i in range(n)]
    reopened = FileEventLog(path, readonly=True, indexer=indexer, dense_lines=dense, mark_every=every)
    for lg in (log, reopened):
        assert [b for _, b in lg.scan_raw()] == expected
        for a, b in ranges:
            assert [(p, bytes(v)) for p, v in lg.frames(a, b)] == list(enumerate(expected))[a:b], (a, b)
        index = lg._index
        assert index.count == n
        assert len(index.dense) <= 2 * dense + max(batches)  # the newest lines, from a batch start
        assert index.memory_bytes() <= 8 * (2 * dense + max(batches)) + 16 * (n // every + 1)


async def test_the_index_memory_stays_bounded_as_the_log_grows(tmp_path: Path) -> None:
    log = FileEventLog(tmp_path / "e.log", dense_lines=64, mark_every=16)
    sizes = []
    for round_ in range(200):
        await log.append([event(round_ * 50 + i) for i in range(50)])
        sizes.append(log._index.memory_bytes())
    assert log._index.count == 10_000
    assert max(sizes) <= 8 * (2 * 64 + 50) + 16 * (10_000 // 16 + 1)
    assert max(sizes) < 8 * 10_000 // 4  # a quarter of one offset per line
    assert [r.position for r in log.scan(0, 3)] == [0, 1, 2]  # old lines still read
    assert [r.envelope.id for r in log.scan(4_321, 4_323)] == ["id-4321", "id-4322"]


async def test_an_old_line_changed_after_verification_is_reported_when_read(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    log = FileEventLog(path, dense_lines=4, mark_every=4)
    for i in range(40):
        await log.append([event(i)])
    content = bytearray(path.read_bytes())
    at = content.index(b"id-7")
    content[at:at + 4] = b"id-X"  # same length: only a CRC can tell
    path.write_bytes(bytes(content))
    assert [r.position for r in log.scan(30, 40)] == list(range(30, 40))  # the newest lines are fine
    with pytest.raises(CorruptLogError, match="position 7.*changed after it was verified"):
        list(log.scan(5, 10))
