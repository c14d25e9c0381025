"""Clocks (`kai_es.ports.Clock`): the machine's, a scaled one for long-running processes, a
simulated one the simulator advances by hand, and a frozen one a driving loop sets."""

from __future__ import annotations

import time

import anyio


class SystemClock:
    """Wall-clock time in int ns."""

    def now_ns(self) -> int:
        return time.time_ns()

    def observe(self, logicaltime: int) -> None:
        """Wall time is not moved; a writer using it takes max(now, the log's time) itself."""

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

    def observe(self, logicaltime: int) -> None:
        """Simulated time moves only by `advance_to` (the simulator reads the log it wrote)."""

    def advance_to(self, ns: int) -> None:
        if ns < self._now:
            raise ValueError(f"simulated time cannot go back ({ns} < {self._now})")
        self._now = ns

    async def sleep_until(self, ns: int) -> None:
        self.advance_to(max(ns, self._now))


class FlowClock:
    """Scaled wall time that never goes back and jumps forward to logical times it observes."""

    def __init__(self, scale: float = 1.0, floor_ns: int = 0) -> None:
        if scale <= 0:
            raise ValueError("time scale must be positive")
        self.scale = scale
        self._base = max(time.time_ns(), floor_ns)
        self._mono = time.monotonic_ns()

    def now_ns(self) -> int:
        return self._base + int((time.monotonic_ns() - self._mono) * self.scale)

    def observe(self, logicaltime: int) -> None:
        """Never run behind a logical time seen in the log."""
        if logicaltime > self.now_ns():
            self._base = logicaltime
            self._mono = time.monotonic_ns()

    def wall_seconds(self, sim_ns: int) -> float:
        return max(0.0, sim_ns / self.scale / 1e9)

    async def sleep_until(self, ns: int) -> None:
        delay = self.wall_seconds(ns - self.now_ns())
        if delay > 0:
            await anyio.sleep(delay)


class FrozenClock:
    """A clock that reads one value the driving loop sets (so a batch shares one time)."""

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def now_ns(self) -> int:
        return self.ns

    def observe(self, logicaltime: int) -> None:
        self.ns = max(self.ns, logicaltime)

    async def sleep_until(self, ns: int) -> None:  # pragma: no cover - never used to wait
        return None
