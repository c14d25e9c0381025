"""An EventLog that writes a file log and serves reads from the records it appended.

Why: a what-if writes a log of up to a million events that its scheduler and binder read back;
decoding them, and opening and locking the file for each of tens of thousands of appends, cost
more than running the scheduler. Here the file is written through one handle in the file log's
framing (`kai_es.adapters.file_log.frame_batch`: the same bytes, one batch per append, a `FileEventLog` writes, so
`kai-es replay` and every reader open it as usual) and the last appended envelopes are kept, so
reads decode nothing. Only the last `WINDOW` to 2 x `WINDOW` records are kept (a million-event
what-if held them all: gigabytes); the scheduler and the binder read a cycle or so behind the end,
and a read from further back decodes that part from the file (`kai_es.adapters.file_log`).

Contract: the EventLog protocol (`kai_es.ports`) for the only writer of a new file: positions
are dense from 0, as the file log's; `read` yields what was appended through this object.
Without a file (`path` None, a re-run only summarised) it keeps the window alone, in place of a
memory log that would hold every record.
Everything appended is in the file once `close` returns (it is flushed, not fsynced: a
counterfactual can be re-run).
Serving the appended objects is exact only while each equals what decoding its bytes gives (a
list where the payload decodes a tuple compares unequal, and a reducer comparing specs would
then fold the run differently from its replay): in verification mode (`kai_es.verify_mode`)
every append checks that, and raises AppendedNotDecodedError naming the event that differs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import BinaryIO

import anyio

from pathlib import Path

from kai_es import verify_mode
from kai_es.adapters.file_log import FileEventLog, frame_batch
from kai_es.events import Envelope, Record, decode, encode


#: records kept in memory: the last WINDOW at least, at most twice as many
WINDOW = 65_536


class AppendedNotDecodedError(AssertionError):
    """An appended envelope differs from its own bytes decoded (verification mode)."""


class RecordingFileLog:
    def __init__(self, path: str | Path | None, window: int = WINDOW, *, verify: bool | None = None) -> None:
        """`path` None: no file (a re-run that is only summarised): the last records only, and
        a read from before them raises RuntimeError. `verify`: check every append against its
        decoded bytes (None: as `kai_es.verify_mode` says)."""
        self.verify = verify_mode.enabled() if verify is None else verify
        self.path = None if path is None else Path(path)
        self._file: BinaryIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "wb")  # noqa: SIM115 - held for the run, closed by close()
        self.window = max(1, window)
        #: the last records appended; `records[i]` is at position `base + i`
        self.records: list[Record] = []
        self.base = 0
        self._appended = anyio.Event()

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        if self._file is not None or self.verify:
            encoded = [encode(e) for e in events]
            if self.verify:
                for env, body in zip(events, encoded):
                    if decode(body) != env:
                        raise AppendedNotDecodedError(
                            f"{env.type} {env.subject} ({env.id}) differs from its bytes decoded: a field "
                            f"holds another type than its payload declares (a list for a tuple?): {env.data!r}")
            if self._file is not None:
                self._file.write(b"".join(frame_batch(encoded)))
        start = self.base + len(self.records)
        positions = list(range(start, start + len(events)))
        self.records.extend(Record(position, env) for position, env in zip(positions, events))
        if len(self.records) > 2 * self.window:
            drop = len(self.records) - self.window
            del self.records[:drop]
            self.base += drop
        self._appended.set()
        self._appended = anyio.Event()
        return positions

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        pos = max(0, from_position)
        end = self.base + len(self.records)
        while True:
            limit = self.base + len(self.records) if follow else end
            if pos >= limit:
                if not follow:
                    return
                await self._appended.wait()
            elif pos < self.base:  # no longer kept: from the file
                for record in self._from_file(pos, min(self.base, limit)):
                    yield record
                    pos += 1
            else:
                yield self.records[pos - self.base]
                pos += 1

    def _from_file(self, start: int, end: int) -> list[Record]:
        """Records [start, end) decoded from the file written so far."""
        if self._file is None or self.path is None:
            raise RuntimeError(f"records {start}-{end - 1} are no longer kept (a log without a file keeps the "
                               f"last {self.window:,} to {2 * self.window:,})")
        self._file.flush()
        return list(FileEventLog(self.path, readonly=True).scan(start, end))

    async def end_position(self) -> int:
        return self.base + len(self.records)

    async def claim_writer(self) -> None:
        """No writer identities here: nothing to claim."""

    async def check_writer(self) -> None:
        """No writer identities here: nobody can take over."""

    async def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
