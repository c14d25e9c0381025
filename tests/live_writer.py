"""A live writer for tests of readers that follow a file log: it appends a log's records to
another file in bursts with pauses, as a simulation or a scheduler writing while someone
watches would, rather than in the one burst `kai-es simulate` writes.

Contract:
- `appends_of(path)` is the file log's envelopes grouped as the appends that wrote them (a line
  framed with a tab ends its append, one framed with '+' does not: kai_es.adapters.file_log's
  format). Appending them in that order, one `FileEventLog.append` each, writes the same bytes.
- `bursts_of(appends)` groups appends as a simulation writes them: the cluster's state, then from
  each scheduling cycle's start to the next (its decisions, the binder's and informer's records).
- `write_first(path, appends, count)` writes a log of the first `count` records, appended as
  they were (the last append cut at `count`).
- `LiveWriter(path, bursts, pause_s).watch(read)` appends each burst's appends back to back,
  `pause_s` between bursts, in a thread of its own that never waits for a reader; meanwhile it
  calls `read()` (what a reader shows: a position and anything) in the calling thread every
  50 ms and returns what it returned at each position, keeping only reads that ended before the
  writer finished (so a position below the last end was shown while the log was still growing). `ends` are the log's end after each burst. An error in the
  writer is raised by `watch`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import Envelope
from kai_es.events import payloads as p

Appends = list[list[Envelope]]


def appends_of(path: Path) -> Appends:
    lines = path.read_bytes().split(b"\n")
    assert lines.pop() == b"", f"{path}: the last line is not whole"
    records = list(FileEventLog(path, readonly=True).scan(0))
    assert len(lines) == len(records) and all(line[8:9] in (b"\t", b"+") for line in lines)
    out: Appends = [[]]
    for line, record in zip(lines, records):
        out[-1].append(record.envelope)
        if line[8:9] == b"\t":
            out.append([])
    assert not out.pop(), f"{path}: its last append is not whole"
    return out


def bursts_of(appends: Appends) -> list[Appends]:
    out: list[Appends] = []
    for batch in appends:
        if not out or isinstance(batch[0].data, p.CycleStarted):
            out.append([])
        out[-1].append(batch)
    return out


async def write_first(path: Path, appends: Appends, count: int) -> None:
    log = FileEventLog(path)
    try:
        left = count
        for batch in appends:
            if left <= 0:
                break
            await log.append(batch[:left])
            left -= len(batch)
    finally:
        await log.close()


class LiveWriter:
    def __init__(self, path: Path, bursts: list[Appends], *, pause_s: float) -> None:
        self.path = path
        self.bursts = bursts
        self.pause_s = pause_s
        self.ends: list[int] = []
        self.error: BaseException | None = None
        self.done = threading.Event()

    async def _run(self) -> None:
        log = FileEventLog(self.path)
        try:
            for i, burst in enumerate(self.bursts):
                if i:
                    await anyio.sleep(self.pause_s)
                for batch in burst:
                    await log.append(batch)
                self.ends.append(await log.end_position())
        finally:
            await log.close()

    def _main(self) -> None:
        try:
            anyio.run(self._run)
        except BaseException as exc:  # noqa: BLE001 - raised again by watch, in the test's thread
            self.error = exc
        finally:
            self.done.set()

    def watch(self, read: Callable[[], tuple[int, Any]]) -> dict[int, Any]:
        seen: dict[int, Any] = {}
        thread = threading.Thread(target=self._main, name="live-writer")
        thread.start()
        while not self.done.is_set():
            position, shown = read()
            if not self.done.is_set():  # (the read ended before the last append returned)
                seen[position] = shown
            time.sleep(0.05)
        thread.join(30)
        if self.error is not None:
            raise self.error
        return seen
