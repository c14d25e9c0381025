"""The embedded default EventLog: one append-only file, one event per line.

Line format: `<crc32 of the JSON, 8 hex digits>\\t<canonical JSON envelope>\\n` (written in lowercase;
either case is read).
The position of a record is its 0-based line number.

Contract:
- An append writes its whole batch with one `write` under an exclusive `flock`, so concurrent
  appenders (other processes too) never interleave and positions stay dense.
- On open, a torn last line (bytes after the last newline) is a crash mid-write: it is reported
  (`recovered`) and truncated by a writer; a read-only opener ignores it without changing the
  file (and says so in `recovered`). Only an unterminated last line is torn: an append writes
  whole lines, so a newline-terminated line that does not verify (a flipped bit, a bad CRC) is
  corruption wherever it is, the last line included, and `CorruptLogError` names its position.
  A writer truncates only under the append lock, after looking again: what looked torn may have
  been another writer's append in progress. An append that finds a torn last line under the lock
  (a writer crashed after this log was opened) truncates it the same way before writing.
- Lines appended by other processes are indexed when this log next looks (`end_position`, a
  read, an append); a last line another writer is still appending is indexed by a later look.
- Every line is verified (frame and CRC) once, when it is indexed; reads hand out views of a
  read-only `mmap` of the file and report a file that changed after it was verified.

Indexing is `kai_es.adapters.framing` (C, or its pure-Python twin when the C is not built).
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import mmap
import os
import zlib
from array import array
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import anyio

from kai_es.adapters.framing import HEAD, LineIndexer, Reason, default_indexer
from kai_es.events import DecodeError, Envelope, Record, decode, encode

log = logging.getLogger(__name__)


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


def frame(body: bytes) -> bytes:
    """One line of the file for a canonical envelope body."""
    return b"%08x\t%s\n" % (zlib.crc32(body), body)


class FileEventLog:
    """EventLog over a local file (see module docstring for the format and guarantees).

    `indexer` verifies and indexes the lines (default: `framing.default_indexer()`, the C one)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 fsync: bool = False, poll_interval_s: float = 0.05,
                 indexer: LineIndexer | None = None) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.fsync = fsync
        self.poll_interval_s = poll_interval_s
        self._indexer = default_indexer() if indexer is None else indexer
        self._offsets: array[int] = array("q")
        self._indexed_size = 0
        # A read-only map of the file from byte 0, covering at least the lines indexed when it was
        # made; replaced (never closed: views handed out keep an old one alive) when it is too short.
        self._map: mmap.mmap | None = None
        self.recovered: TornTail | None = None
        if not self.path.exists():
            if readonly:
                raise FileNotFoundError(f"event log {self.path} does not exist")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        self._scan_from(0, at_open=True)
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
        scan = self._indexer.index(m, self._offsets, start=start - base, base=base)
        self._indexed_size = scan.stop
        if scan.reason is Reason.OK:
            if base == 0:
                self._map = m  # it covers every indexed line: reads need not map the file again
            return
        position = len(self._offsets)
        if scan.line_end != base + len(m) or scan.reason is not Reason.NOT_TERMINATED:
            raise CorruptLogError(self.path, position, scan.reason.message)
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
        return size

    def _readable(self, end: int) -> mmap.mmap:
        """A map of the file from byte 0 that covers byte offsets [0, end)."""
        m = self._map
        if m is None or len(m) < end:
            region = self._map_from(0)
            if region is None or len(region[0]) < end:
                size = 0 if region is None else len(region[0])
                raise CorruptLogError(self.path, self._first_line_past(size), "the file changed after it was verified")
            m = self._map = region[0]
        return m

    def _first_line_past(self, size: int) -> int:
        """The position of the first indexed line that does not end within the first `size` bytes."""
        return max(0, bisect.bisect_right(self._offsets, size) - 1)

    # -- EventLog -----------------------------------------------------------------------------

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        if self.readonly:
            raise PermissionError(f"{self.path} was opened read-only")
        if not events:
            return []
        frames = [frame(encode(e)) for e in events]
        blob = b"".join(frames)
        with open(self.path, "ab") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._refresh(locked=True)
                start_pos = len(self._offsets)
                offset = self._indexed_size
                f.write(blob)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        positions = []
        for fr in frames:
            positions.append(len(self._offsets))
            self._offsets.append(offset)
            offset += len(fr)
        self._indexed_size = offset
        self._appended.set()
        self._appended = anyio.Event()
        assert positions[0] == start_pos
        return positions

    def scan(self, from_position: int = 0, end: int | None = None) -> Iterator[Record]:
        """Synchronous read of records [from_position, end) — the fast path for folds."""
        for pos, body in self._frames(from_position, end):
            try:
                env = decode(body)  # type: ignore[arg-type]  # msgspec reads any buffer
            except DecodeError as exc:
                raise CorruptLogError(self.path, pos, str(exc)) from None
            yield Record(pos, env)

    def scan_raw(self, from_position: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """(position, canonical body bytes) of [from_position, end) without decoding."""
        for pos, body in self._frames(from_position, end):
            yield pos, bytes(body)

    def frames(self, from_position: int = 0, end: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """(position, canonical body) of [from_position, end) without decoding or copying (see
        `_frames`); what `kai_es.replay.replay_frames` reads."""
        return self._frames(from_position, end)

    def record_count(self) -> int:
        """The number of complete records now in the file (other processes' appends included)."""
        self._refresh()
        return len(self._offsets)

    def _frames(self, from_position: int, end: int | None) -> Iterator[tuple[int, memoryview]]:
        """(position, body view) of every line in [from_position, end); no copies.

        The views are slices of a read-only map of the file; each keeps its map alive, so a view
        stays valid after the log remaps or closes. Every indexed line had its CRC verified when
        it was indexed (at open, or by the `_refresh` that found it), so it is not verified again
        here; a file now shorter than the lines read, or a line whose newline or frame is no
        longer where the index says, means the file changed under us, which is reported."""
        size = self._refresh()
        offsets = self._offsets
        stop = len(offsets) if end is None else min(end, len(offsets))
        pos = max(0, from_position)
        if pos >= stop:
            return
        last = offsets[stop] if stop < len(offsets) else self._indexed_size  # end of line stop - 1
        if size < last:  # reading the map past the end of the file would crash (SIGBUS)
            raise CorruptLogError(self.path, max(pos, self._first_line_past(size)),
                                  "the file changed after it was verified")
        m = self._readable(last)
        starts = offsets[pos:stop]
        starts.append(last)
        good = pos + self._indexer.check(m, starts)
        view = memoryview(m)
        for p, s, e in zip(range(pos, good), starts, islice(starts, 1, None)):
            yield p, view[s + HEAD:e - 1]
        if good < stop:
            raise CorruptLogError(self.path, good, "the file changed after it was verified")

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        pos = max(0, from_position)
        end = len(self._offsets)
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
        return len(self._offsets)

    async def claim_writer(self) -> None:
        """No writer identities here: nothing to claim."""

    async def check_writer(self) -> None:
        """No writer identities here: nobody can take over."""

    async def close(self) -> None:
        self._map = None  # unmapped once no view handed out refers to it
