"""Process wiring for running the services as separate OS processes over one shared log.

- ``kai-es scheduler``: SchedulerService (with snapshots) in a supervised loop.
- ``kai-es binder``: the simulated Kubernetes (SimCluster) + InformerService + BinderService.

Time. Both processes use `FlowClock`: wall time, optionally scaled (``--time-scale 60``: one
real second is one simulated minute), anchored at start to max(wall clock, the log's last
logical time), and moved forward (never back) whenever the process reads a later logical time
from the log — a Lamport clock. So logical time never goes below the log's, survives restarts,
and the two processes' clocks converge to the faster one.

The simulated cluster after a binder restart. The cluster lives in the binder process, so a
restart loses it; it is REBUILT from the log (`rebuild_cluster`): the scenario is re-anchored
at t0 = the logical time of the binder's first ResyncStarted (the cluster's birth), then every
outcome the binder recorded is re-applied at its own logical time (advance the cluster to it,
bind/evict). The simulated cluster is deterministic given the times of its binds and evictions
(submissions and completions are scheduled from them), and the live loop performs every bind
at exactly the logical time its outcome records, so the rebuilt cluster equals the lost one
except for binds whose outcomes never reached the log — those are performed again, since the
binder dedupes by decision id from the log. Then the informer relists (resync), which removes
pods that finished while nobody was watching. The binder appends the outcomes of a batch in ONE
transaction, after performing them: a crash in between loses effects and outcomes together.

Errors. Any error other than fencing ends the "session": the process claims its
transactional_id again (InitProducerId, which completes or aborts whatever transaction of ours
was in flight, so its outcome is visible before we read), re-reads the log and continues (the
binder rebuilds its cluster). A FencedError stops the process (exit 2, one line).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from kai_es.adapters.ids import RandomIds
from kai_es.app import bulk_fold, freeze_long_lived
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.ports import ActionOutcome, EventLog
from kai_es.scenario import Scenario
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import Packer
from kai_es.services.binder import SOURCE as BINDER_SOURCE
from kai_es.services.binder import BinderService
from kai_es.services.informer import SOURCE as INFORMER_SOURCE
from kai_es.services.informer import InformerService
from kai_es.services.scheduler import SchedulerService
from kai_es.sim.cluster import SimCluster

log = logging.getLogger(__name__)

SCHEDULER_TXN_ID = "kai-es-scheduler"
BINDER_TXN_ID = "kai-es-binder"


# -- time -----------------------------------------------------------------------------------------


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

    async def sleep_until(self, ns: int) -> None:  # pragma: no cover - never used to wait
        return None


# -- Kafka helpers ---------------------------------------------------------------------------------


def is_kafka(events: EventLog) -> bool:
    return type(events).__name__ == "KafkaEventLog"


async def claim_writer(events: EventLog) -> None:
    """Start the producer now (InitProducerId): fences an older instance with our
    transactional_id and settles any transaction of ours still in flight, BEFORE we read."""
    if is_kafka(events):
        events._check_open()  # type: ignore[attr-defined]
        await events._ensure_topic()  # type: ignore[attr-defined]
        await events._ensure_producer()  # type: ignore[attr-defined]


async def read_all(events: EventLog, from_position: int = 0) -> list[Record]:
    return [r async for r in events.read(from_position)]


def fenced_error_types() -> tuple[type[BaseException], ...]:
    try:
        from kai_es.adapters.kafka_log import FencedError  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        return ()
    return (FencedError,)


async def supervise(name: str, session: Callable[[], Awaitable[None]], *,
                    max_failures: int = 60, backoff_s: float = 0.5) -> None:
    """Run `session` again after any error but fencing (which propagates)."""
    fenced = fenced_error_types()
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await session()
            return
        except fenced:
            raise
        except Exception as exc:  # noqa: BLE001 - the supervisor's whole point
            if time.monotonic() - started > 30:
                failures = 0
            failures += 1
            if failures > max_failures:
                raise
            log.warning("%s: %s: %s; starting again in %.1f s (attempt %d)", name,
                        type(exc).__name__, exc, backoff_s, failures)
            await anyio.sleep(backoff_s)
            backoff_s = min(backoff_s * 1.5, 3.0)


# -- the scheduler process ---------------------------------------------------------------------------


async def scheduler_session(events: EventLog, config: SchedulerConfig, packer: Packer,
                            clock: FlowClock, *, period_s: float, snapshots: Any = None,
                            snapshot_every: int = 0, on_ready: Callable[[str], None] | None = None,
                            stop_after_cycles: int | None = None) -> SchedulerService:
    """Claim the writer role, restore/fold, then run cycles until cancelled."""
    t = time.monotonic()
    await claim_writer(events)
    sched = SchedulerService(events, config, packer, clock, RandomIds(), snapshots=snapshots,
                             snapshot_every=snapshot_every)
    with bulk_fold():
        await sched.restore_snapshot()
        restored = sched.snapshot_restored
        await sched.catch_up()
    clock.observe(sched.state.logicaltime)
    await sched.start()
    freeze_long_lived()
    if on_ready is not None:
        src = f"snapshot at {restored} + tail" if restored is not None else "full fold"
        on_ready(f"scheduler ready in {time.monotonic() - t:.2f} s ({src}): position "
                 f"{sched.state.position}, {sched.state.records} records, cycle {sched.state.cycle}")
    while stop_after_cycles is None or sched.cycles_run < stop_after_cycles:
        await sched.catch_up()
        clock.observe(sched.state.logicaltime)
        if sched.has_work():
            await sched.run_cycle_once()
        await anyio.sleep(period_s)
    return sched


# -- the binder process (simulated cluster + informer + binder) ---------------------------------------


class CountingActuator:
    """The SimCluster as the binder's actuator, counting what a double bind would look like."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.binds = 0
        self.already = 0
        self.refused_other_node = 0
        self.failed = 0
        self.evictions = 0

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Any, gpu_groups: Any) -> ActionOutcome:
        out = await self.cluster.bind(namespace, name, uid, node, gpu_devices, gpu_groups)
        if out.ok and out.already:
            self.already += 1
        elif out.ok:
            self.binds += 1
        else:
            self.failed += 1
            if "already bound" in out.message:
                self.refused_other_node += 1
        return out

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        self.evictions += 1
        return await self.cluster.evict(namespace, name, uid)

    def stats(self) -> dict[str, int]:
        return {"binds": self.binds, "already": self.already, "failed": self.failed,
                "refusedOtherNode": self.refused_other_node, "evictions": self.evictions}


def cluster_birth(records: list[Record]) -> int | None:
    """Logical time of the simulated cluster's first relist (None: it never started)."""
    for record in records:
        env = record.envelope
        if env.source == INFORMER_SOURCE and isinstance(env.data, p.ResyncStarted):
            return env.logicaltime
    return None


async def rebuild_cluster(scenario: Scenario, records: list[Record], t0: int) -> tuple[SimCluster, int]:
    """The simulated cluster as the binder's recorded outcomes left it (see module docstring).
    Returns it and how many recorded binds were re-applied."""
    cluster = SimCluster(replace(scenario, start_ns=t0), t0)
    groups: dict[str, list[str]] = {}  # PodBound does not repeat the decision's GPU groups
    applied = 0
    for record in records:
        env = record.envelope
        data = env.data
        if isinstance(data, p.BindingDecided):
            if data.gpu_groups:
                groups[env.id] = list(data.gpu_groups)
            continue
        if env.source != BINDER_SOURCE:
            continue
        if isinstance(data, p.PodBound):
            cluster.advance(max(env.logicaltime, cluster.now_ns))
            out = await cluster.bind(data.namespace, data.name, data.uid, data.node,
                                     data.gpu_devices, groups.get(data.decision_id, []))
            if not out.ok or out.already:
                log.warning("rebuilding the cluster: recorded bind of %s/%s to %s at position %d "
                            "does not re-apply: %s", data.namespace, data.name, data.node,
                            record.position, out.message or "already bound")
            applied += 1
        elif isinstance(data, p.PodEvicted):
            cluster.advance(max(env.logicaltime, cluster.now_ns))
            await cluster.evict(data.namespace, data.name, data.uid)
    cluster.drain_changes()
    return cluster, applied


class StatsFile:
    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._last: dict[str, Any] | None = None

    def write(self, stats: dict[str, Any]) -> None:
        if self.path is None or stats == self._last:
            return
        self._last = dict(stats)
        with open(self.path, "a") as f:
            f.write(json.dumps(stats, sort_keys=True) + "\n")


async def binder_session(events: EventLog, scenario: Scenario, clock: FlowClock, *,
                         poll_s: float = 0.05, stats: StatsFile | None = None,
                         on_ready: Callable[[str], None] | None = None) -> None:
    t_start = time.monotonic()
    await claim_writer(events)
    records = await read_all(events)
    if records:
        clock.observe(max(r.envelope.logicaltime for r in records))
    t0 = cluster_birth(records)
    fresh = t0 is None
    if t0 is None:
        t0 = clock.now_ns()
    cluster, reapplied = await rebuild_cluster(scenario, records, t0)
    actuator = CountingActuator(cluster)
    frozen = FrozenClock(clock.now_ns())
    binder = BinderService(events, actuator, frozen)
    for record in records:
        binder.observe(record)
    del records
    now = clock.now_ns()
    frozen.ns = now
    cluster.advance(now)
    cluster.drain_changes()
    informer = InformerService(events, cluster, frozen, RandomIds())
    await informer.resync()
    if on_ready is not None:
        on_ready(f"binder ready in {time.monotonic() - t_start:.2f} s: "
                 f"{'new simulated cluster' if fresh else f'cluster rebuilt ({reapplied} binds re-applied)'}"
                 f", {len(cluster.pods)} pods, {len(binder.pending)} decisions to perform")
    pid = os.getpid()

    def record_stats() -> None:
        if stats is not None:
            stats.write({"pid": pid, **actuator.stats(), "performed": binder.performed})

    while True:
        now = clock.now_ns()
        frozen.ns = now
        cluster.advance(now)
        await informer.pump(cluster.drain_changes())
        await binder.poll()
        if binder.pending:
            clock.observe(max(r.envelope.logicaltime for r in binder.pending.values()))
            now = clock.now_ns()
            frozen.ns = now
            cluster.advance(now)
            await informer.pump(cluster.drain_changes())
            await binder.perform_batch()
            await informer.pump(cluster.drain_changes())
            record_stats()
        nxt = cluster.next_event_ns()
        delay = poll_s
        if nxt is not None:
            delay = min(delay, clock.wall_seconds(nxt - clock.now_ns()))
        await anyio.sleep(max(delay, 0.005))


def describe_dead_letters(dead_letters: list[Any]) -> list[str]:
    """One line per record a reader skipped (`KafkaEventLog.dead_letters`)."""
    return [f"dead-lettered: offset {d.offset} ({d.reason})" for d in dead_letters]


def dead_letter_report(url: str) -> str:
    """Read the whole log at `url` and name every record that was skipped as undecodable."""
    from kai_es.app import open_log  # noqa: PLC0415

    events = open_log(url, readonly=True)

    async def go() -> None:
        try:
            async for _ in events.read(0):
                pass
        finally:
            await events.close()

    anyio.run(go)
    lines = describe_dead_letters(list(getattr(events, "dead_letters", [])))
    return "\n".join(lines) if lines else "no dead letters"


__all__ = ["dead_letter_report", "describe_dead_letters", "BINDER_TXN_ID", "SCHEDULER_TXN_ID", "CountingActuator", "FlowClock", "FrozenClock",
           "StatsFile", "binder_session", "claim_writer", "cluster_birth", "read_all",
           "rebuild_cluster", "scheduler_session", "supervise"]
