"""The discrete-event simulation driver.

It runs the production services — InformerService, SchedulerService, BinderService — over the
given EventLog, with a SimClock and a SimCluster behind the ports. Each step, in order: the
cluster applies what is due, the informer appends the changes, the scheduler runs a cycle if one
is due and has work, the binder performs the decisions, the informer appends their effects. Time
then jumps to the next thing that can happen (a cluster happening, a due cycle, a back-off
expiry). A simulated day therefore costs only as many steps as there are happenings.

Contract: deterministic — the same scenario, config and packer give a byte-identical log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.events import Record
from kai_es.ports import ClusterActuator, EventLog, IdFactory, SnapshotStore
from kai_es.scenario import Scenario
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import Packer
from kai_es.services.binder import BinderService
from kai_es.services.informer import InformerService
from kai_es.services.scheduler import SchedulerService
from kai_es.sim.cluster import SimCluster
from kai_es.state import ClusterState


@dataclass(frozen=True, slots=True)
class SimResult:
    start_ns: int
    end_ns: int
    cycles: int
    binds: int
    bind_failures: int
    evictions: int
    completions: int
    end_position: int
    stopped_because: str


Progress = Callable[[int, int | None], None]


class Cluster(Protocol):
    """What the driver needs of a simulated cluster besides the actuator (SimCluster, or the
    what-if's recorded-workload cluster)."""

    binds: int
    bind_failures: int
    evictions: int
    completions: int

    def advance(self, now_ns: int) -> None: ...

    def next_event_ns(self) -> int | None: ...


class Informer(Protocol):
    """The informer side the driver pumps: the cluster's pending changes into the log."""

    async def resync(self) -> int: ...

    async def pump_pending(self) -> int: ...


class _ObjectInformer:
    """The production informer over a SimCluster's raw-object changes."""

    def __init__(self, informer: InformerService, cluster: SimCluster) -> None:
        self.informer, self.cluster = informer, cluster

    async def resync(self) -> int:
        return await self.informer.resync()

    async def pump_pending(self) -> int:
        return await self.informer.pump(self.cluster.drain_changes())


async def simulate(scenario: Scenario, events: EventLog, packer: Packer, *,
                   config: SchedulerConfig | None = None, until_ns: int | None = None,
                   progress: Progress | None = None, max_steps: int = 50_000_000,
                   snapshots: SnapshotStore | None = None, snapshot_every: int = 0) -> SimResult:
    """Run `scenario` to idle, or for `until_ns` (else the scenario's `until`) of simulated time,
    appending to `events`. With a time limit the run lasts exactly that long even when nothing
    happens before it (its `end_ns` is start + limit, `stopped_because` "time limit"); the log
    gets no record for the quiet stretch. The scheduler stores a snapshot in `snapshots` every
    `snapshot_every` cycles, as `kai-es scheduler --snapshot-every` does."""
    cfg = config or scenario.config
    start = scenario.start_ns
    limit = until_ns if until_ns is not None else scenario.simulation.until_ns
    clock = SimClock(start)
    cluster = SimCluster(scenario, start)
    ids = SeededIds(f"sim/{scenario.name}")
    informer = _ObjectInformer(InformerService(events, cluster, clock, ids, ours=cfg.scheduler_name),
                               cluster)
    return await drive(events, cluster, cluster, informer, cfg, packer, clock, ids,
                       period_ns=scenario.simulation.cycle_period_ns, until_ns=limit,
                       progress=progress, max_steps=max_steps, snapshots=snapshots,
                       snapshot_every=snapshot_every)


async def drive(events: EventLog, cluster: Cluster, actuator: ClusterActuator, informer: Informer,
                cfg: SchedulerConfig, packer: Packer, clock: SimClock, ids: IdFactory, *,
                period_ns: int, until_ns: int | None, progress: Progress | None = None,
                max_steps: int = 50_000_000, state: ClusterState | None = None,
                on_fold: Callable[[Record], None] | None = None,
                snapshots: SnapshotStore | None = None, snapshot_every: int = 0) -> SimResult:
    """The discrete-event loop of the module docstring over any cluster and informer, from the
    clock's current time, for `until_ns` of simulated time (None: until idle). The scheduler
    folds into `state` (default: a fresh one) and calls `on_fold` after each record."""
    start = clock.now_ns()
    stop_at = start + until_ns if until_ns is not None else None
    period = period_ns
    scheduler = SchedulerService(events, cfg, packer, clock, ids, state, on_fold=on_fold,
                                 snapshots=snapshots, snapshot_every=snapshot_every)
    # retryable eviction refusals are retried at once: simulated time moves only in this loop
    binder = BinderService(events, actuator, clock, evict_retry_delays_ns=(0, 0))
    await scheduler.start()
    await informer.resync()
    next_cycle = start
    reason = "idle"
    for _ in range(max_steps):
        now = clock.now_ns()
        cluster.advance(now)
        await informer.pump_pending()
        await scheduler.catch_up()
        if now >= next_cycle and scheduler.has_work():
            await scheduler.run_cycle_once()
            next_cycle = now + period
            if await binder.step():
                await informer.pump_pending()
        elif (retry := binder.next_retry_ns()) is not None and retry <= now and await binder.step():
            await informer.pump_pending()  # a refused eviction tried again
        if progress is not None:
            progress(now - start, (stop_at - start) if stop_at is not None else None)
        # what the binder's actions caused (an evicted pod's replacement, ...) is new input: the
        # scheduler must see it before deciding whether a cycle is due
        await scheduler.catch_up()
        # when can something happen next?
        candidates = []
        nxt = cluster.next_event_ns()
        if nxt is not None:
            candidates.append(nxt)
        if scheduler.has_work():
            candidates.append(max(next_cycle, now + 1) if next_cycle > now else next_cycle)
        backoff = scheduler.next_backoff_ns()
        if backoff is not None:
            candidates.append(max(backoff, next_cycle))
        retry = binder.next_retry_ns()
        if retry is not None:
            candidates.append(max(retry, now + 1))
        if not candidates:
            if stop_at is not None and stop_at > now:
                clock.advance_to(stop_at)  # nothing more happens, but the run lasts until its limit
                reason = "time limit"
            else:
                reason = "idle"
            break
        target = min(candidates)
        if target <= now:
            target = now if scheduler.has_work() and next_cycle <= now else now + 1
        if stop_at is not None and target > stop_at:
            clock.advance_to(stop_at)
            reason = "time limit"
            break
        clock.advance_to(target)
    else:
        reason = "step limit"
    return SimResult(start_ns=start, end_ns=clock.now_ns(), cycles=scheduler.cycles_run,
                     binds=cluster.binds, bind_failures=cluster.bind_failures,
                     evictions=cluster.evictions, completions=cluster.completions,
                     end_position=await events.end_position(), stopped_because=reason)
