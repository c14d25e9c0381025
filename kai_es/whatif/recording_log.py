"""An EventLog that writes a file log and serves reads from the records it appended.

Why: a what-if writes a log of up to a million events that its scheduler and binder read back;
decoding them, and opening and locking the file for each of tens of thousands of appends, cost
more than running the scheduler. Here the file is written through one handle in the file log's
framing (`kai_es.adapters.file_log.frame_batch`: the same bytes, one batch per append, a `FileEventLog` writes, so
`kai-es replay` and every reader open it as usual) and the appended envelopes are kept, so reads
decode nothing.

Contract: the EventLog protocol (`kai_es.ports`) for the only writer of a new file: positions
are dense from 0, as the file log's; `read` yields what was appended through this object.
Everything appended is in the file once `close` returns (it is flushed, not fsynced: a
counterfactual can be re-run).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio

from pathlib import Path

from kai_es.adapters.file_log import frame_batch
from kai_es.events import Envelope, Record, encode


class RecordingFileLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 - held for the run, closed by close()
        self.records: list[Record] = []
        self._appended = anyio.Event()

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        self._file.write(b"".join(frame_batch([encode(e) for e in events])))
        start = len(self.records)
        positions = list(range(start, start + len(events)))
        self.records.extend(Record(position, env) for position, env in zip(positions, events))
        self._appended.set()
        self._appended = anyio.Event()
        return positions

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        pos = max(0, from_position)
        end = len(self.records)
        while True:
            while pos < (len(self.records) if follow else end):
                yield self.records[pos]
                pos += 1
            if not follow:
                return
            await self._appended.wait()

    async def end_position(self) -> int:
        return len(self.records)

    async def claim_writer(self) -> None:
        """No writer identities here: nothing to claim."""

    async def check_writer(self) -> None:
        """No writer identities here: nobody can take over."""

    async def close(self) -> None:
        if not self._file.closed:
            self._file.close()
