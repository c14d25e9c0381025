"""The scheduler service: folds the log, runs cycles by the protocol of ARCHITECTURE.md §5 and
appends their decisions.

Contract:
- A cycle appends CycleStarted (its position is the cut), folds exactly up to it, runs the pure
  `run_cycle`, and appends the decisions plus CycleCompleted in one atomic append.
- `has_work()` is true when something other than the scheduler's own events arrived since the
  last cycle, or a bind back-off has expired; the shell never runs a cycle that has nothing new
  to look at (so an idle cluster writes nothing).
"""

from __future__ import annotations

import logging

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.feed import config_event
from kai_es.ports import Clock, EventLog, IdFactory
from kai_es.scheduling.config import SchedulerConfig, config_digest
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import Packer
from kai_es.state import ClusterState
from kai_es.state.reducer import HANDLERS

log = logging.getLogger(__name__)
SOURCE = "kai-es/scheduler"


class SchedulerService:
    def __init__(self, events: EventLog, config: SchedulerConfig, packer: Packer, clock: Clock,
                 ids: IdFactory, state: ClusterState | None = None) -> None:
        self.events = events
        self.config = config
        self.digest = config_digest(config)
        self.packer = packer
        self.clock = clock
        self.ids = ids
        self.state = state if state is not None else ClusterState()
        self._inputs_since_cycle = True
        self.cycles_run = 0

    def _fold(self, record: Record) -> None:
        st = self.state
        env = record.envelope
        HANDLERS[type(env.data)](st, env)
        st.position = record.position
        st.records += 1
        if env.logicaltime > st.logicaltime:
            st.logicaltime = env.logicaltime
        if not env.type.startswith("kai.scheduler."):
            self._inputs_since_cycle = True

    async def catch_up(self, until: int | None = None) -> None:
        """Fold every record after the state's position (up to `until` inclusive)."""
        async for record in self.events.read(self.state.position + 1):
            if until is not None and record.position > until:
                break
            self._fold(record)
            if until is not None and record.position == until:
                break

    async def start(self) -> None:
        """Fold to the end; announce the configuration if the log does not have it yet."""
        await self.catch_up()
        if self.state.config_digest != self.digest:
            await self.events.append([config_event(self.config, event_id=self.ids.new_id(),
                                                   logicaltime=self.clock.now_ns())])
            await self.catch_up()

    def has_work(self) -> bool:
        if self._inputs_since_cycle:
            return True
        now = self.clock.now_ns()
        return any(0 < pod.backoff_until_ns <= now and pod.status == "Pending"
                   for pod in self.state.pods.values())

    def next_backoff_ns(self) -> int | None:
        """The earliest future back-off expiry of a pending pod (a reason to wake up)."""
        now = self.clock.now_ns()
        times = [pod.backoff_until_ns for pod in self.state.pods.values()
                 if pod.status == "Pending" and pod.backoff_until_ns > now]
        return min(times) if times else None

    async def run_cycle_once(self) -> list[Envelope]:
        """One cycle by the protocol; returns the decisions appended."""
        await self.catch_up()
        cycle = self.state.cycle + 1
        started = make_envelope(p.CycleStarted(cycle=cycle, config_digest=self.digest),
                                event_id=self.ids.new_id(), source=SOURCE, subject=f"cycle/{cycle}",
                                logicaltime=max(self.clock.now_ns(), self.state.logicaltime),
                                policyversion=self.config.policy_version)
        [cut] = await self.events.append([started])
        cut_record: Record | None = None
        async for record in self.events.read(self.state.position + 1):
            self._fold(record)
            if record.position >= cut:
                cut_record = record
                break
        if cut_record is None or cut_record.position != cut:
            raise RuntimeError(f"the log did not return the cycle's own CycleStarted at {cut}")
        decisions = run_cycle(self.state, cut_record, self.config, self.packer)
        await self.events.append(decisions)
        self._inputs_since_cycle = False
        await self.catch_up()
        self._inputs_since_cycle = False
        self.cycles_run += 1
        return decisions

    async def run(self, period_ns: int) -> None:
        """Production loop: a cycle every `period_ns` when there is work."""
        await self.start()
        while True:
            await self.catch_up()
            if self.has_work():
                await self.run_cycle_once()
            await self.clock.sleep_until(self.clock.now_ns() + period_ns)
