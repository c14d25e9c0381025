"""The embedded default EventLog: one append-only file, one event per line.

Line format: `<crc32 of the JSON, 8 hex digits>\\t<canonical JSON envelope>\\n` for the last record
of an append, `<crc32 of "+" and the JSON, 8 hex digits>+<canonical JSON envelope>\\n` for the
others (written in lowercase; either case is read): one append is one batch, so a reader can tell
a whole append from one a crash cut short after some of its lines. A log written before batches
existed has only tab lines, each a batch of one, and reads as it always did.
The position of a record is its 0-based line number.

Contract:
- An append writes its whole batch with one `write` under an exclusive `flock`, so concurrent
  appenders (other processes too) never interleave and positions stay dense.
- A batch is all or nothing: no reader hands out a record of a batch whose last line is not in
  the file, so a consumer never sees part of an append (half of a cycle's decisions, part of a
  gang's binds).
- On open, a torn last batch (bytes after the last newline, or whole lines of a batch whose last
  line is missing) is a crash mid-write: it is reported (`recovered`) and truncated to the
  batch's start by a writer; a read-only opener ignores it without changing the file (and says so
  in `recovered`). Only an unfinished last batch is torn: an append writes whole lines, so a
  newline-terminated line that does not verify (a flipped bit, a bad CRC) is corruption wherever
  it is, the last line included, and `CorruptLogError` names the position of its batch.
  A writer truncates only under the append lock, after looking again: what looked torn may have
  been another writer's append in progress. An append that finds a torn last line under the lock
  (a writer crashed after this log was opened) truncates it the same way before writing.
- Lines appended by other processes are indexed when this log next looks (`end_position`, a
  read, an append); a last line another writer is still appending is indexed by a later look.
- Every line is verified (frame and CRC) once, when it is indexed; reads hand out views of a
  read-only `mmap` of the file and report a file that changed after it was verified. Reads of
  older lines (before the newest `dense_lines` or so) index their stretch of the file again, CRC
  included (`kai_es.adapters.offset_index`): the index's memory does not grow with the log.

Indexing is `kai_es.adapters.framing` (C, or its pure-Python twin when the C is not built).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import weakref
import zlib
from array import array
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import BinaryIO

import anyio

from kai_es.adapters.framing import CRC_OF_PLUS, HEAD, LineIndexer, Reason, default_indexer
from kai_es.adapters.offset_index import DENSE_LINES, MARK_EVERY, IndexChanged, OffsetIndex
from kai_es.events import DecodeError, Envelope, Record, decode, encode

log = logging.getLogger(__name__)

#: the most lines a read gets the offsets of at once
_READ_CHUNK = 1 << 16


def _release(m: mmap.mmap, start: int, end: int) -> None:
    """Drop the whole pages of map offsets [start, end) from this process's resident set once
    they are read (a scan of a large log otherwise keeps every page it touched resident: the
    size of the file). The file's bytes are untouched and the map stays valid: a later read of
    them faults them in again from the page cache."""
    lo = start - start % mmap.PAGESIZE
    hi = end - end % mmap.PAGESIZE
    if hi > lo:
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class CorruptLogError(Exception):
    """A record in the middle of the log is damaged; the message names its position."""

    def __init__(self, path: Path, position: int, reason: str) -> None:
        super().__init__(f"{path}: record at position {position} is corrupt: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TornTail:
    """A torn last line found and removed (or, read-only, ignored) at the end of the file: by
    open(), or by an append that found a crashed writer's leftover under the lock."""

    position: int
    byte_offset: int
    length: int
    reason: str


def frame(body: bytes, *, more: bool = False) -> bytes:
    """One line of the file for a canonical envelope body: the last of its batch, or (`more`) one
    another line of the same batch follows."""
    if more:
        return b"%08x+%s\n" % (zlib.crc32(body, CRC_OF_PLUS), body)
    return b"%08x\t%s\n" % (zlib.crc32(body), body)


def frame_batch(bodies: Sequence[bytes]) -> list[bytes]:
    """The lines of one batch (one append) of canonical envelope bodies, in order."""
    last = len(bodies) - 1
    return [frame(body, more=i < last) for i, body in enumerate(bodies)]


class FileEventLog:
    """EventLog over a local file (see module docstring for the format and guarantees).

    `indexer` verifies and indexes the lines (default: `framing.default_indexer()`, the C one);
    `dense_lines` and `mark_every` size the offset index (`kai_es.adapters.offset_index`: the
    offsets of the newest lines, marks for the older ones, so its memory does not grow with the
    log)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 fsync: bool = False, poll_interval_s: float = 0.05,
                 indexer: LineIndexer | None = None, dense_lines: int = DENSE_LINES,
                 mark_every: int = MARK_EVERY) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.fsync = fsync
        self.poll_interval_s = poll_interval_s
        self._indexer = default_indexer() if indexer is None else indexer
        self._index = OffsetIndex(self._indexer, dense_lines=dense_lines, mark_every=mark_every)
        self._indexed_size = 0
        # A read-only map of the file from byte 0, covering at least the lines indexed when it was
        # made; replaced (never closed: views handed out keep an old one alive) when it is too short.
        self._map: mmap.mmap | None = None
        #: the file opened for appending (O_APPEND), from the first append to `close`
        self._appender: BinaryIO | None = None
        self._close_appender: Callable[[], object] = lambda: None
        self.recovered: TornTail | None = None
        if not self.path.exists():
            if readonly:
                raise FileNotFoundError(f"event log {self.path} does not exist")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        self._scan_from(0, at_open=True)
        self._compact()
        self._appended = anyio.Event()

    # -- index maintenance ------------------------------------------------------------------

    def _map_from(self, start: int) -> tuple[mmap.mmap, int] | None:
        """A read-only map of the file from the page holding byte `start` to the file's current
        end, and the byte offset the map starts at; None if the file ends at or before `start`
        (an empty file cannot be mapped)."""
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= start:
                return None
            base = start - start % mmap.ALLOCATIONGRANULARITY
            return mmap.mmap(f.fileno(), size - base, offset=base, access=mmap.ACCESS_READ), base

    def _scan_from(self, start: int, *, at_open: bool = False, locked: bool = False) -> None:
        """Verify and index the lines from byte `start` (the end of the indexed ones) to the end.

        The first line that is not valid is corruption (`CorruptLogError`) if more bytes follow
        it or if it is terminated. If it is the last line and not terminated, on a later look (neither `at_open` nor
        `locked`) another writer may still be appending it: a later look indexes it. Otherwise
        the last line is torn: truncated if this process holds the append lock (`locked`: no
        writer can be mid-append), ignored by a read-only log, looked at again under the lock by
        a writer's open; a writer's later look reports it as corruption."""
        region = self._map_from(start)
        if region is None:
            return
        m, base = region
        scan = self._indexer.index(m, self._index.dense, start=start - base, base=base)
        self._indexed_size = scan.stop
        _release(m, start - base, scan.stop - base)
        if scan.reason is Reason.OK:
            if base == 0:
                self._map = m  # it covers every indexed line: reads need not map the file again
            return
        position = self._index.count
        if scan.line_end != base + len(m) or scan.reason is not Reason.NOT_TERMINATED:
            # name the line that does not verify, not the start of the batch holding it
            before = m[scan.stop - base:scan.line_end - base - 1].count(b"\n")
            where = f" (in the append that starts at position {position})" if before else ""
            raise CorruptLogError(self.path, position + before, scan.reason.message + where)
        if scan.reason is Reason.NOT_TERMINATED and not (at_open or locked):
            return
        torn = TornTail(position, scan.stop, scan.line_end - scan.stop, scan.reason.message)
        if locked:
            self._truncate(torn)
        elif self.readonly:
            if torn != self.recovered:
                log.warning("%s: ignoring torn last record at position %d (%s)", self.path, position, torn.reason)
            self.recovered = torn
        elif at_open:
            self._recover_tail()
        else:
            raise CorruptLogError(self.path, position, torn.reason)

    def _recover_tail(self) -> None:
        """A writer opened the log and found a torn last line: look again under the append lock."""
        with open(self.path, "ab") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._scan_from(self._indexed_size, locked=True)
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _truncate(self, torn: TornTail) -> None:
        """Remove a torn last line; the caller holds the append lock."""
        self.recovered = torn
        log.warning("%s: truncating torn last record at position %d (%d bytes: %s)",
                    self.path, torn.position, torn.length, torn.reason)
        os.truncate(self.path, torn.byte_offset)
        if self._map is not None and len(self._map) > torn.byte_offset:
            self._map = None  # never read a map past the end of the file

    def _refresh(self, *, locked: bool = False) -> int:
        """Index what other processes appended; returns the file's size (at least the end of the
        indexed lines if some were found: the file grew while they were being indexed)."""
        size = self.path.stat().st_size
        if size > self._indexed_size:
            self._scan_from(self._indexed_size, locked=locked)
            size = max(size, self._indexed_size)
            self._compact()
        return size

    def _compact(self) -> None:
        """Keep the offset index's memory bounded (`kai_es.adapters.offset_index`)."""
        if self._index.needs_compaction:
            self._index.compact(self._readable(self._indexed_size))

    def _readable(self, end: int) -> mmap.mmap:
        """A map of the file from byte 0 that covers byte offsets [0, end)."""
        m = self._map
        if m is None or len(m) < end:
            region = self._map_from(0)
            if region is None or len(region[0]) < end:
                size = 0 if region is None else len(region[0])
                raise CorruptLogError(self.path, self._index.first_line_past(size),
                                      "the file changed after it was verified")
            m = self._map = region[0]
        return m

    # -- EventLog -----------------------------------------------------------------------------

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        if self.readonly:
            raise PermissionError(f"{self.path} was opened read-only")
        if not events:
            return []
        frames = frame_batch([encode(e) for e in events])
        blob = b"".join(frames)
        f = self._appender
        if f is None:  # kept open between appends: opening the file each time cost a writer
            f = self._appender = open(self.path, "ab")  # noqa: SIM115 - closed by close()
            self._close_appender = weakref.finalize(self, f.close)  # or when the log is dropped
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._refresh(locked=True)
                start_pos = self._index.count
                offset = self._indexed_size
                self._write(f, blob)
                if self.fsync:
                    os.fsync(f.fileno())
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        except BaseException:
            self._appender = None  # a failed append leaves nothing open: the next one starts afresh
            self._close_appender()
            raise
        positions = []
        dense = self._index.dense
        for fr in frames:
            positions.append(self._index.count)
            dense.append(offset)
            offset += len(fr)
        self._indexed_size = offset
        self._compact()
        self._appended.set()
        self._appended = anyio.Event()
        assert positions[0] == start_pos
        return positions

    def _write(self, f: BinaryIO, blob: bytes) -> None:
        """The one write of an append, under the lock (a seam: the simulation tests cut it short
        to tear an append, `kai_es.sim.faulty.TearingFileLog`)."""
        f.write(blob)
        f.flush()

    def scan(self, from_position: int = 0, end: int | None = None) -> Iterator[Record]:
        """Synchronous read of records [from_position, end) — the fast path for folds."""
        for pos, body in self._frames(from_position, end):
            try:
                env = decode(body)
            except DecodeError as exc:
                raise CorruptLogError(self.path, pos, str(exc)) from None
            yield Record(pos, env)

    def scan_raw(self, from_position: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """(position, canonical body bytes) of [from_position, end) without decoding."""
        return self._frames(from_position, end)

    def frames(self, from_position: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """(position, canonical body) of [from_position, end) without decoding (see `_frames`);
        what `kai_es.replay.replay_frames` reads."""
        return self._frames(from_position, end)

    def bodies_at(self, positions: Iterable[int]) -> dict[int, bytes]:
        """The body of the record at each of `positions` that has one (`frames`, one by one)."""
        return {at: body for position in positions for at, body in self._frames(position, position + 1)}

    def record_count(self) -> int:
        """The number of complete records now in the file (other processes' appends included)."""
        self._refresh()
        return self._index.count

    def _frames(self, from_position: int, end: int | None) -> Iterator[tuple[int, bytes]]:
        """(position, body) of every line in [from_position, end).

        Each body is its own bytes, sliced from a read-only map of the file in one copy (what
        the decoder takes without copying again), valid whatever the log does after. Every
        indexed line had its CRC verified when
        it was indexed (at open, or by the `_refresh` that found it), so it is not verified again
        here; a file now shorter than the lines read, or a line whose newline or frame is no
        longer where the index says, means the file changed under us, which is reported."""
        size = self._refresh()
        index = self._index
        stop = index.count if end is None else min(end, index.count)
        pos = max(0, from_position)
        while pos < stop:  # a stretch at a time: the offsets of a whole log are not held at once
            chunk = min(stop, pos + _READ_CHUNK)
            extent = index.extent(chunk, self._indexed_size)
            if size < extent:  # reading the map past the end of the file would crash (SIGBUS)
                raise CorruptLogError(self.path, max(pos, index.first_line_past(size)),
                                      "the file changed after it was verified")
            m = self._readable(extent)
            try:
                starts = index.starts(m, pos, chunk, self._indexed_size)
            except IndexChanged as exc:
                raise CorruptLogError(self.path, max(pos, exc.position), "the file changed after it was verified") from None
            good = pos + self._indexer.check(m, starts)
            for p, s, e in zip(range(pos, good), starts, islice(starts, 1, None)):
                yield p, m[s + HEAD:e - 1]
            if good > pos:
                _release(m, starts[0], starts[good - pos])
            if good < chunk:
                raise CorruptLogError(self.path, good, "the file changed after it was verified")
            pos = chunk

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        pos = max(0, from_position)
        self._refresh()  # without follow, the end is what is in the file now, others' appends too
        end = self._index.count
        while True:
            limit = pos + 4096 if follow else min(end, pos + 4096)
            batch = list(self.scan(pos, limit))
            for rec in batch:
                yield rec
            if batch:
                await anyio.sleep(0)
                pos = batch[-1].position + 1
            if not follow:
                if pos >= end or not batch:
                    return
                continue
            if not batch:
                with anyio.move_on_after(self.poll_interval_s):
                    await self._appended.wait()

    async def end_position(self) -> int:
        self._refresh()
        return self._index.count

    async def claim_writer(self) -> None:
        """No writer identities here: nothing to claim."""

    async def check_writer(self) -> None:
        """No writer identities here: nobody can take over."""

    async def close(self) -> None:
        self._map = None  # unmapped once no view handed out refers to it
        self._appender = None
        self._close_appender()
