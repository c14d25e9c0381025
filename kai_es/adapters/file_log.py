"""The embedded default EventLog: one append-only file, one event per line.

Line format: `<crc32 of the JSON, 8 lowercase hex digits>\\t<canonical JSON envelope>\\n`.
The position of a record is its 0-based line number.

Contract:
- An append writes its whole batch with one `write` under an exclusive `flock`, so concurrent
  appenders (other processes too) never interleave and positions stay dense.
- On open, a torn last line (no newline, or a CRC mismatch on the last line) is a crash mid-write:
  it is reported (`recovered`) and truncated by a writer; a read-only opener ignores it without
  changing the file. A bad line anywhere else is corruption: `CorruptLogError` names its position.
"""

from __future__ import annotations

import fcntl
import logging
import os
import zlib
from array import array
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

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
    """What open() found and removed (or, read-only, ignored) at the end of the file."""

    position: int
    byte_offset: int
    length: int
    reason: str


def frame(body: bytes) -> bytes:
    """One line of the file for a canonical envelope body."""
    return b"%08x\t%s\n" % (zlib.crc32(body), body)


def _check_line(line: bytes) -> tuple[memoryview | None, str]:
    """The body of a framed line (a view, not a copy), or None and the reason it is not valid."""
    if not line.endswith(b"\n"):
        return None, "line is not terminated (write was cut short)"
    if len(line) < 10 or line[8] != 9:  # b"\t"
        return None, "line has no CRC frame"
    body = memoryview(line)[9:-1]
    try:
        expected = int(line[:8], 16)
    except ValueError:
        return None, "CRC field is not hexadecimal"
    if zlib.crc32(body) != expected:
        return None, "CRC mismatch"
    return body, ""


class FileEventLog:
    """EventLog over a local file (see module docstring for the format and guarantees)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 fsync: bool = False, poll_interval_s: float = 0.05) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.fsync = fsync
        self.poll_interval_s = poll_interval_s
        self._offsets: array[int] = array("q")
        self._indexed_size = 0
        self.recovered: TornTail | None = None
        if not self.path.exists():
            if readonly:
                raise FileNotFoundError(f"event log {self.path} does not exist")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        self._scan_from(0, at_open=True)
        self._appended = anyio.Event()

    # -- index maintenance ------------------------------------------------------------------

    def _scan_from(self, start: int, *, at_open: bool = False) -> None:
        """Index complete lines from byte `start`; detect a torn tail at open."""
        with open(self.path, "rb") as f:
            f.seek(start)
            offset = start
            for line in f:
                body, reason = _check_line(line)
                if body is None:
                    if not at_open and not line.endswith(b"\n"):
                        break  # another writer is mid-append: index up to here, retry later
                    if f.read(1) or not at_open:
                        raise CorruptLogError(self.path, len(self._offsets), reason)
                    self._handle_torn(offset, len(line), reason)
                    return
                self._offsets.append(offset)
                offset += len(line)
            self._indexed_size = offset

    def _handle_torn(self, offset: int, length: int, reason: str) -> None:
        position = len(self._offsets)
        self.recovered = TornTail(position, offset, length, reason)
        self._indexed_size = offset
        if self.readonly:
            log.warning("%s: ignoring torn last record at position %d (%s)", self.path, position, reason)
            return
        log.warning("%s: truncating torn last record at position %d (%d bytes: %s)",
                    self.path, position, length, reason)
        with open(self.path, "r+b") as f:
            f.truncate(offset)

    def _refresh(self) -> None:
        size = self.path.stat().st_size
        if size > self._indexed_size:
            self._scan_from(self._indexed_size)

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
                self._refresh()
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

    def _frames(self, from_position: int, end: int | None) -> Iterator[tuple[int, memoryview]]:
        """(position, body view) of every line in [from_position, end); no copies.

        Every indexed line had its CRC verified when it was indexed (at open, or by the
        `_refresh` that found it), so it is not verified again here; a line whose length no
        longer matches the index means the file changed under us, which is reported."""
        self._refresh()
        stop = len(self._offsets) if end is None else min(end, len(self._offsets))
        pos = max(0, from_position)
        if pos >= stop:
            return
        offsets = self._offsets
        with open(self.path, "rb") as f:
            f.seek(offsets[pos])
            for line in f:
                if pos >= stop:
                    return
                nxt = offsets[pos + 1] if pos + 1 < len(offsets) else self._indexed_size
                if len(line) != nxt - offsets[pos] or not line.endswith(b"\n"):
                    raise CorruptLogError(self.path, pos, "the file changed after it was verified")
                yield pos, memoryview(line)[9:-1]
                pos += 1

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

    async def close(self) -> None:
        return None
