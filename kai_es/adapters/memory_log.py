"""An in-memory EventLog for tests and one-shot commands. Positions are dense from 0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio

from kai_es.events import Envelope, Record, decode, encode


class MemoryEventLog:
    """EventLog over a Python list. Appends round-trip through canonical bytes, so a memory log
    behaves exactly like a durable one (an envelope that cannot be encoded is rejected)."""

    def __init__(self) -> None:
        self._records: list[Record] = []
        self._lines: list[bytes] = []
        self._appended = anyio.Event()

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        encoded = [encode(e) for e in events]
        decoded = [decode(b) for b in encoded]
        start = len(self._records)
        for i, env in enumerate(decoded):
            self._records.append(Record(start + i, env))
        self._lines.extend(encoded)
        self._appended.set()
        self._appended = anyio.Event()
        return list(range(start, start + len(decoded)))

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        pos = max(0, from_position)
        end = len(self._records)
        while True:
            while pos < (len(self._records) if follow else end):
                yield self._records[pos]
                pos += 1
            if not follow:
                return
            await self._appended.wait()

    async def end_position(self) -> int:
        return len(self._records)

    async def claim_writer(self) -> None:
        """No writer identities here: nothing to claim."""

    async def check_writer(self) -> None:
        """No writer identities here: nobody can take over."""

    async def close(self) -> None:
        return None

    def raw_lines(self) -> list[bytes]:
        """The canonical bytes of every record, in order (for digests and golden files)."""
        return list(self._lines)
