"""Folding a log into a `LiveView` as it grows, in a daemon thread.

Contract: `Follower(log, view, lock).start()` reads `log` (any `EventLog`: a file or Kafka)
from position 0 to the end it has at start, with the cyclic GC paused (`bulk_fold`), then
follows it, feeding each record to `view` exactly once, in order, holding `lock` for each feed
(readers of `view` take the same lock); after the first part, what was folded is moved out of
the cyclic GC's reach (`bulk_fold(keep=True)`), so folding each new record stays cheap. A failure (a corrupt or undecodable record, a broken
connection) stops the following and is kept in `error`; what was folded until then stays shown.
`status()` is one line for the pages: folding (how far), following, or stopped and why.
"""

from __future__ import annotations

import threading

import anyio

from kai_es.app import bulk_fold
from kai_es.ports import EventLog
from kai_es.visibility.live import LiveView


class Follower:
    def __init__(self, log: EventLog, view: LiveView, lock: threading.Lock) -> None:
        self.log = log
        self.view = view
        self.lock = lock
        self.target = 0
        self.caught_up = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._main, name="kai-es-serve-follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def status(self) -> str:
        """One line: how far the view is (read by the HTTP threads; single assignments only)."""
        if self.error is not None:
            return f"stopped following the log at position {self.view.position}: {self.error}"
        if not self.caught_up:
            return f"folding the log: {self.view.fed} of {self.target} records so far"
        return ""

    def _main(self) -> None:
        try:
            anyio.run(self._run)
        except Exception as exc:  # noqa: BLE001 - whatever stops the fold is shown, not raised
            self.error = " ".join(f"{type(exc).__name__}: {exc}".split())

    async def _run(self) -> None:
        try:
            self.target = await self.log.end_position()
            position = 0
            if self.target:
                with bulk_fold(keep=True):  # (frozen before the collector resumes: else it walks it all)
                    async for record in self.log.read(0):
                        with self.lock:
                            self.view.feed(record)
                        position = record.position + 1
            self.caught_up = True
            async for record in self.log.read(position, follow=True):
                with self.lock:
                    self.view.feed(record)
        finally:
            await self.log.close()
