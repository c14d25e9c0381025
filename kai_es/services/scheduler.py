"""The scheduler service: folds the log, runs cycles by the protocol of ARCHITECTURE.md §5 and
appends their decisions.

Contract:
- A cycle appends CycleStarted (its position is the cut), folds exactly up to it, runs the pure
  `run_cycle`, and appends the decisions plus CycleCompleted in one atomic append.
- `has_work()` is true when something other than the scheduler's own events arrived after the
  last cycle's cut (including what another writer appended while that cycle ran), a bind
  back-off expired since the last cycle, or (policy kai-es/v3) a time rule came due since the
  last cycle (a stale gang's grace period, a preemption delay or a min-runtime ended); the shell
  never runs a cycle that has nothing new to look at (so an idle cluster writes nothing).
- Optional snapshots (`snapshots=` a `kai_es.services.snapshotting.SnapshotStore`): every
  `snapshot_every` cycles, on a cycle whose CycleCompleted carries a `statedigest`, the state at
  the cut is saved after the decisions are in the log; `start()` restores the newest snapshot
  that passes validation and folds only the tail (a rejected one is reported and ignored).
- Between cycles `run` waits with `wait`: shortly before the next cycle is due it folds what
  arrived and brings the derived data that cycle starts from up to date
  (`kai_es.scheduling.upkeep`), which cannot change a decision, only when its cost is paid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ports import Clock, CycleObserver, EventLog, IdFactory, SnapshotStore, StoredSnapshot
from kai_es.scheduling.config import SchedulerConfig, config_digest, config_event
from kai_es import verify_mode
from kai_es.collector import collector_paused
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import Packer
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.upkeep import keep_up
from kai_es.scheduling.victims import EVICTION_REFUSED_BACKOFF_NS
from kai_es.services.snapshotting import cut_snapshot, restore_validated
from kai_es.state import ClusterState
from kai_es.state.reducer import apply

log = logging.getLogger(__name__)
SOURCE = "kai-es/scheduler"


class SchedulerService:
    def __init__(self, events: EventLog, config: SchedulerConfig, packer: Packer, clock: Clock,
                 ids: IdFactory, state: ClusterState | None = None, *,
                 snapshots: SnapshotStore | None = None, snapshot_every: int = 0,
                 on_fold: Callable[[Record], None] | None = None,
                 observer: CycleObserver | None = None) -> None:
        self.events = events
        self.config = config
        self.digest = config_digest(config)
        self.packer = packer
        self.clock = clock
        self.ids = ids
        self.state = state if state is not None else ClusterState()
        self._inputs_since_cycle = True
        self.cycles_run = 0
        self.snapshots = snapshots
        self.snapshot_every = snapshot_every
        self.snapshot_restored: int | None = None  # position of the snapshot start() used
        self.snapshots_written = 0
        self._cycles_since_snapshot = 0
        #: logical time of the last cycle run here (time rules due after it wake the scheduler)
        self._last_cycle_ns = -1
        self._due_cache: tuple[int, list[int]] = (-2, [])
        #: called with every record right after it is folded into `state` (a run's summary)
        self.on_fold = on_fold
        #: told of folds, actions and cycles (the process's metrics); None: nobody
        self.observer = observer
        #: how long before a cycle is due `wait` starts the upkeep (clock ns; adapts to its duration)
        self._upkeep_lead_ns = 0
        self.upkeeps_run = 0

    def _fold(self, record: Record) -> None:
        apply(self.state, record)
        if self.on_fold is not None:
            self.on_fold(record)
        if self.observer is not None:
            self.observer.on_fold(record, self.state)
        if not record.envelope.type.startswith("kai.scheduler."):
            self._inputs_since_cycle = True

    async def catch_up(self, until: int | None = None) -> None:
        """Fold every record after the state's position (up to `until` inclusive)."""
        async for record in self.events.read(self.state.position + 1):
            if until is not None and record.position > until:
                break
            self._fold(record)
            if until is not None and record.position == until:
                break

    async def restore_snapshot(self) -> bool:
        """Replace an empty state by the newest valid snapshot (True if one was used)."""
        if self.snapshots is None or self.state.position >= 0:
            return False
        state = await restore_validated(self.snapshots, self.events)
        if state is None:
            return False
        self.state = state
        self.snapshot_restored = state.position
        return True

    async def start(self) -> None:
        """Fold to the end (from a snapshot when there is a valid one); announce the
        configuration if the log does not have it yet."""
        await self.restore_snapshot()
        await self.catch_up()
        if self.state.config_digest != self.digest:
            await self.events.append([config_event(self.config, event_id=self.ids.new_id(),
                                                   logicaltime=self.clock.now_ns())])
            await self.catch_up()

    def _due_times(self) -> list[int]:
        """When a time rule of the policy (stale gangs, preemption delay, min-runtime) may change
        a decision with nothing new logged (the version's `kai_es.scheduling.rules.wakeups`)."""
        position = self.state.position
        if self._due_cache[0] != position:  # a function of the state: computed once per position
            wakeups = policy_for(self.config.policy_version).rules.wakeups
            self._due_cache = (position, wakeups.due_times_ns(self.state, self.config))
        return self._due_cache[1]

    def has_work(self) -> bool:
        if self._inputs_since_cycle:
            return True
        now = self.clock.now_ns()
        if any(self._last_cycle_ns < t <= now for t in self._due_times()):
            return True
        # a back-off that expired since the last cycle (one that expired before it was that
        # cycle's to act on: counting it again would cycle every period while nothing changes)
        last = self._last_cycle_ns
        return any(last < t <= now for t in self._backoff_ends())

    def _backoff_ends(self) -> Iterator[int]:
        """When each back-off ends that may change a cycle's decisions with nothing new logged:
        a pending pod's bind back-off, and — while some pod waits — a victim's eviction
        back-off (kai-es/v3 on: a pod whose eviction failed is no victim for
        `EVICTION_REFUSED_BACKOFF_NS`; a preemptor that only it could make room for must be
        tried again when that ends, or it waits until something unrelated happens)."""
        waiting = bool(self.state.pending_jobs)
        for pod in self.state.pods.values():
            if pod.status == "Pending":
                if pod.backoff_until_ns:
                    yield pod.backoff_until_ns
            elif waiting and pod.eviction_refused_ns:
                yield pod.eviction_refused_ns + EVICTION_REFUSED_BACKOFF_NS

    def next_backoff_ns(self) -> int | None:
        """The earliest future back-off end (`_backoff_ends`) or due time of a time rule (a
        reason to wake up)."""
        now = self.clock.now_ns()
        times = [t for t in self._backoff_ends() if t > now]
        times += [t for t in self._due_times() if t > now][:1]
        return min(times) if times else None

    async def run_cycle_once(self) -> list[Envelope]:
        """One cycle by the protocol; returns the decisions appended."""
        await self.catch_up()
        cycle = self.state.cycle + 1
        started = make_envelope(p.CycleStarted(cycle=cycle, config_digest=self.digest),
                                event_id=self.ids.new_id(), source=SOURCE, subject=f"cycle/{cycle}",
                                logicaltime=max(self.clock.now_ns(), self.state.logicaltime),
                                policyversion=self.config.policy_version)
        self._last_cycle_ns = started.logicaltime
        [cut] = await self.events.append([started])
        cut_record: Record | None = None
        async for record in self.events.read(self.state.position + 1):
            self._fold(record)
            if record.position >= cut:
                cut_record = record
                break
        if cut_record is None or cut_record.position != cut:
            raise RuntimeError(f"the log did not return the cycle's own CycleStarted at {cut}")
        observer = self.observer
        with collector_paused():  # (the cycle's objects live until it ends: collections would walk them in vain)
            decisions = run_cycle(self.state, cut_record, self.config, self.packer, verify=verify_mode.enabled(),
                                  on_action=observer.on_action if observer is not None else None)
        snap_data = self._snapshot_due(decisions)
        positions = await self.events.append(decisions)
        if snap_data is not None:
            await self._save_snapshot(cut_record, positions[-1], decisions[-1], snap_data)
        # what arrived after the cut (another writer appended it while the cycle ran) is input
        # the next cycle must see: fold it with the flag down, so it raises the flag again
        self._inputs_since_cycle = False
        await self.catch_up()
        self.cycles_run += 1
        if observer is not None:
            observer.on_cycle(self.state, self.config, decisions)
        return decisions

    def _snapshot_due(self, decisions: list[Envelope]) -> bytes | None:
        """The snapshot bytes of the state at the cut, when this cycle should be snapshotted."""
        if self.snapshots is None or self.snapshot_every <= 0:
            return None
        self._cycles_since_snapshot += 1
        if self._cycles_since_snapshot < self.snapshot_every:
            return None
        return cut_snapshot(self.state, self.config, decisions)

    async def _save_snapshot(self, cut: Record, completed_position: int, completed: Envelope,
                             data: bytes) -> None:
        assert self.snapshots is not None and completed.statedigest
        snap = StoredSnapshot(position=cut.position, completed_position=completed_position,
                              cycle=self.state.cycle, logicaltime=cut.envelope.logicaltime,
                              digest=completed.statedigest, data=data)
        try:
            await self.snapshots.save(snap)
        except Exception as exc:  # an optimisation: never fails a cycle
            log.warning("saving the snapshot of position %d failed: %s", cut.position, exc)
            return
        self._cycles_since_snapshot = 0
        self.snapshots_written += 1

    async def run(self, period_ns: int, *, cycles: int | None = None) -> None:
        """The scheduler loop (the only one): `start()` (a no-op when already started), then
        fold what is new, run a cycle when there is work, wait `period_ns` of clock time (`wait`:
        the upkeep of the next cycle's derived data runs near its end); return
        after `cycles` cycles (None: never). The clock observes every logical time folded, so
        cycles never carry a time behind the log's."""
        await self.start()
        while cycles is None or self.cycles_run < cycles:
            await self.catch_up()
            self.clock.observe(self.state.logicaltime)
            if self.has_work():
                await self.run_cycle_once()
            await self.wait(self.clock.now_ns() + period_ns, period_ns)

    async def wait(self, until_ns: int, period_ns: int) -> None:
        """Wait until clock time `until_ns`; shortly before it, fold what arrived and run the
        upkeep (`kai_es.scheduling.upkeep.keep_up`), so that the next cycle starts with its derived
        data up to date but for what arrives after. It starts twice its last duration plus a
        twentieth of `period_ns` before `until_ns` (at most half the period before it)."""
        clock = self.clock
        await clock.sleep_until(until_ns - self._upkeep_lead_ns)
        await self.catch_up()
        started, wall = clock.now_ns(), time.perf_counter()
        with collector_paused():  # (as a cycle runs: what it makes lives on in the state)
            keep_up(self.state, self.config)
        spent = max(0, clock.now_ns() - started)
        self._upkeep_lead_ns = min(period_ns // 2, 2 * spent + period_ns // 20)
        self.upkeeps_run += 1
        if self.observer is not None:
            self.observer.on_upkeep(time.perf_counter() - wall)
        await clock.sleep_until(until_ns)
