"""Clocks: the machine's (production) and a simulated one the simulator advances by hand."""

from __future__ import annotations

import time

import anyio


class SystemClock:
    """Wall-clock time in int ns."""

    def now_ns(self) -> int:
        return time.time_ns()

    async def sleep_until(self, ns: int) -> None:
        delay = (ns - time.time_ns()) / 1e9
        if delay > 0:
            await anyio.sleep(delay)


class SimClock:
    """Discrete-event time: `now_ns` only moves when the simulator calls `advance_to`."""

    def __init__(self, start_ns: int) -> None:
        self._now = start_ns

    def now_ns(self) -> int:
        return self._now

    def advance_to(self, ns: int) -> None:
        if ns < self._now:
            raise ValueError(f"simulated time cannot go back ({ns} < {self._now})")
        self._now = ns

    async def sleep_until(self, ns: int) -> None:
        self.advance_to(max(ns, self._now))
