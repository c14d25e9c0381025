"""Deterministic simulation testing: the real informer, scheduler and binder services in one
process, over the memory log and the simulated cluster, on simulated time, with faults drawn
from one seed (FoundationDB's and TigerBeetle's simulation testing, for kai-es).

A run (`run_seed`) is over the memory log, or (`log_path`) over the file log at that path: each
process instance opens its own `FileEventLog` on the file, as separate processes do, and the
`torn_append` fault leaves part of an append in the file when its writer dies.
It steps the three processes in an order the seed shuffles, injects the faults
of `kai_es.sim.faults` through the ports of `kai_es.sim.faulty`, restarts a crashed process
after a pause from what outlives it (the log, the scheduler's newest snapshot, the binder's
saved progress; the informer relists), lets a paused scheduler's standby take over and fences
the old one, and checks after every step (`Checker`):
- the log replays: every cycle's decisions, re-run from the state at its cut, are the bytes in
  the log (`kai_es.replay.IncrementalReplay`), and every binder outcome matches its decision;
- every decision has at most one outcome (records repeated under one id are byte-identical);
- no pod is bound twice: no binding is decided for a pod while an earlier binding of it is
  unanswered or succeeded, and no pod is reported bound to two nodes;
- no eviction is performed twice: none is decided for a pod while an earlier eviction of it is
  unanswered or succeeded;
- no gang is bound partially: after a cycle, every job it placed pods of holds (bound, binding or
  pipelined) at least its minMember;
- no queue is over its GPU limit after a cycle that placed pods in it, not counting its pods
  being released (KAI's queue allocation: a victim evicted to make room under the limit is
  Releasing while its preemptor binds, kai-es/v10's `rules.queue_limits`).
After the fault phase (`horizon_ns`) faults stop, every process is up, and the run settles until
nothing is left to do; then every decision has exactly one outcome, the pods and nodes the state
holds are the cluster's, each queue's allocation is the sum of its pods', and a replay of the
whole log from scratch is exact. The same seed, mix, scenario and packer give the same log, byte
for byte (`DstReport.log_digest`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Record, encode
from kai_es.ports import EventLog
from kai_es.events import payloads as p
from kai_es.replay import IncrementalReplay, describe, replay
from kai_es.scenario import Scenario, load_scenario_text
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import Packer
from kai_es.services.binder import BinderService
from kai_es.services.informer import InformerService
from kai_es.services.scheduler import SchedulerService
from kai_es.sim.cluster import SimCluster
from kai_es.sim.faults import Crash, FaultMix, FaultPlan
from kai_es.sim.faulty import (FaultyActuator, FaultyLog, LossyWatch, MemoryBlobStore, MemorySnapshotStore,
                               TearingFileLog, WriterEpochs, WriterFenced)
from kai_es.sim.workload import workload
from kai_es.state.model import OCCUPYING

SECOND = 1_000_000_000
ROLES = ("informer", "scheduler", "binder")


@dataclass(frozen=True, slots=True)
class DstSettings:
    #: how long faults are injected (simulated time from the scenario's start)
    horizon_ns: int = 90 * SECOND
    #: how long the run may take to settle after the faults stop before that is a violation
    settle_ns: int = 900 * SECOND
    #: a crashed process is down for a pause drawn in this range
    restart_ns: tuple[int, int] = (1 * SECOND, 5 * SECOND)
    #: a paused scheduler's lease: its standby leads this long after the pause
    lease_ns: int = 15 * SECOND
    snapshot_every: int = 3
    max_steps: int = 100_000


@dataclass(slots=True)
class DstReport:
    seed: int
    steps: int = 0
    cycles: int = 0
    records: int = 0
    decisions: int = 0
    end_ns: int = 0
    settled: bool = False
    faults: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    #: paused schedulers that woke after their standby took over and were fenced
    fenced: int = 0
    violations: list[str] = field(default_factory=list)
    log_digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def fault_total(self) -> int:
        return sum(n for kind, n in self.faults.items() if "@" not in kind)


class Checker:
    """The invariants of the module docstring, checked over the log as it grows."""

    def __init__(self, packer: Packer) -> None:
        self.replay = IncrementalReplay(packer)
        self.violations: list[str] = []
        self.read_to = -1
        #: decision id -> ("bind" | "evict", pod uid, position)
        self.decisions: dict[str, tuple[str, str, int]] = {}
        #: decision id -> outcome event id; outcome id -> its bytes
        self.outcome_of: dict[str, str] = {}
        self.outcome_bytes: dict[str, bytes] = {}
        self.succeeded: set[str] = set()  # decision ids whose outcome is PodBound / PodEvicted
        #: (kind, pod uid) -> decision ids of that kind for the pod, in log order
        self.per_pod: dict[tuple[str, str], list[str]] = {}
        self.bound_to: dict[str, str] = {}
        self.cycle_placed: dict[int, list[str]] = {}  # cut position -> pod keys placed in it
        self.cycles = 0

    def fail(self, message: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(message)

    async def check(self, log: EventLog) -> None:
        async for record in log.read(self.read_to + 1):
            self.read_to = record.position
            self._record(record)

    def _record(self, record: Record) -> None:
        env = record.envelope
        data = env.data
        if not self.replay.feed(record):
            div = self.replay.divergence
            if div is not None and not any(v.startswith("replay:") for v in self.violations):
                self.fail(f"replay: {describe(div)}")
        if isinstance(data, (p.BindingDecided, p.EvictionDecided)):
            kind = "bind" if isinstance(data, p.BindingDecided) else "evict"
            earlier = [d for d in self.per_pod.get((kind, data.uid), [])
                       if d not in self.outcome_of or d in self.succeeded]
            if earlier:
                what = "bound" if kind == "bind" else "evicted"
                self.fail(f"pod {data.namespace}/{data.name} (uid {data.uid}) {what} twice: decision "
                          f"{env.id} at {record.position} while decision {earlier[0]} is "
                          f"{'answered ' + what if earlier[0] in self.succeeded else 'unanswered'}")
            self.decisions[env.id] = (kind, data.uid, record.position)
            self.per_pod.setdefault((kind, data.uid), []).append(env.id)
            if kind == "bind" and env.basedon is not None:
                self.cycle_placed.setdefault(env.basedon, []).append(f"{data.namespace}/{data.name}")
        elif isinstance(data, p.PodPipelined) and env.basedon is not None:
            self.cycle_placed.setdefault(env.basedon, []).append(f"{data.namespace}/{data.name}")
        elif isinstance(data, (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)):
            self._outcome(record, data)
        elif isinstance(data, p.CycleCompleted) and env.basedon is not None:
            self.cycles += 1
            self._after_cycle(env.basedon)

    def _outcome(self, record: Record, data: Any) -> None:
        env = record.envelope
        raw = encode(env)
        seen = self.outcome_bytes.get(env.id)
        if seen is not None:
            if seen != raw:
                self.fail(f"outcome {env.id} at {record.position} repeats an earlier outcome's id "
                          f"with other content")
            return
        self.outcome_bytes[env.id] = raw
        first = self.outcome_of.get(data.decision_id)
        if first is not None:
            self.fail(f"decision {data.decision_id} has a second outcome {env.id} at {record.position} "
                      f"(first: {first})")
            return
        self.outcome_of[data.decision_id] = env.id
        if isinstance(data, (p.PodBound, p.PodEvicted)):
            self.succeeded.add(data.decision_id)
        if isinstance(data, p.PodBound):
            node = self.bound_to.setdefault(data.uid, data.node)
            if node != data.node:
                self.fail(f"pod {data.namespace}/{data.name} (uid {data.uid}) reported bound to {node} "
                          f"and to {data.node}")

    def _after_cycle(self, cut: int) -> None:
        state = self.replay.state
        placed = self.cycle_placed.pop(cut, [])
        jobs = sorted({state.pods[k].job_key for k in placed if k in state.pods})
        for job_key in jobs:
            job = state.jobs.get(job_key)
            if job is None:
                continue
            held = sum(1 for m in job.members if m in state.pods and (
                state.pods[m].status in OCCUPYING or state.pods[m].nominated_node))
            if held < job.min_member:
                self.fail(f"cycle at {cut} bound gang {job_key} partially: {held} of its pods held, "
                          f"minMember {job.min_member}")
        queues = sorted({state.jobs[j].queue for j in jobs if j in state.jobs})
        releasing: dict[str, int] = {}
        if queues:
            for pod in state.pods.values():
                if pod.status == "Releasing" and pod.job_key in state.jobs:
                    queue = state.jobs[pod.job_key].queue
                    releasing[queue] = releasing.get(queue, 0) + pod.milli_gpu
        for name in queues:
            q = state.queues.get(name)
            held = q.allocated_milli_gpu - releasing.get(name, 0) if q is not None else 0
            if q is not None and q.spec.gpu.limit >= 0 and held > q.spec.gpu.limit:
                self.fail(f"cycle at {cut} left queue {name} over its GPU limit: "
                          f"{held} > {q.spec.gpu.limit} milli-GPU (pods being released not counted)")

    def finish(self, cluster: SimCluster) -> None:
        """The checks of a settled run (module docstring)."""
        state = self.replay.state
        unanswered = sorted(d for d in self.decisions if d not in self.outcome_of)
        if unanswered:
            pos = self.decisions[unanswered[0]][2]
            self.fail(f"{len(unanswered)} decision(s) without an outcome after settling (first at {pos})")
        theirs = {k: (i.obj["metadata"].get("uid", ""), i.node) for k, i in cluster.pods.items()}
        ours = {k: (pod.spec.uid, pod.node if pod.status in OCCUPYING else "")
                for k, pod in state.pods.items()}
        for key in sorted(set(theirs) | set(ours)):
            if theirs.get(key) != ours.get(key):
                self.fail(f"pod {key}: the cluster has {theirs.get(key)}, the state {ours.get(key)}")
        if sorted(state.nodes) != sorted(cluster.nodes):
            self.fail(f"nodes: the cluster has {sorted(cluster.nodes)}, the state {sorted(state.nodes)}")
        for name, q in sorted(state.queues.items()):
            pods = sum(pod.milli_gpu for pod in state.pods.values()
                       if pod.status in OCCUPYING and pod.accounted_queue == name)
            if pods != q.allocated_milli_gpu:
                self.fail(f"queue {name}: allocation {q.allocated_milli_gpu} milli-GPU, its pods hold {pods}")


class _Run:
    def __init__(self, seed: int, scenario: Scenario, mix: FaultMix, packer: Packer,
                 settings: DstSettings, config: SchedulerConfig | None, log_path: Path | None) -> None:
        self.seed, self.scenario, self.packer, self.settings = seed, scenario, packer, settings
        self.config = config or scenario.config
        self.log_path = log_path
        self.log: EventLog
        if log_path is None:
            self.log = MemoryEventLog()
        else:  # the checker's reader; every process instance opens a writer of its own
            if log_path.exists():
                raise FileExistsError(f"{log_path} exists: a simulation run writes a new log")
            FileEventLog(log_path)
            self.log = FileEventLog(log_path, readonly=True)
        self.clock = SimClock(scenario.start_ns)
        self.cluster = SimCluster(scenario, scenario.start_ns)
        self.plan = FaultPlan(seed, mix)
        self.writers = WriterEpochs()
        self.actuator = FaultyActuator(self.cluster, self.plan)
        self.watch = LossyWatch(self.cluster, self.plan)
        self.snapshots = MemorySnapshotStore()
        self.progress = MemoryBlobStore()
        self.checker = Checker(packer)
        self.starts: Counter[str] = Counter()
        self.informer: InformerService | None = None
        self.scheduler: SchedulerService | None = None
        self.binder: BinderService | None = None
        self.down_until: dict[str, int] = {role: scenario.start_ns for role in ROLES}
        self.zombie: tuple[SchedulerService, int] | None = None
        self.next_cycle = scenario.start_ns
        self.cycles = 0
        self.fenced = 0
        self._interleaving = False

    # -- processes ----------------------------------------------------------------------------

    def _log_for(self, role: str) -> FaultyLog:
        inner = self.log if self.log_path is None else TearingFileLog(self.log_path, self.plan)
        return FaultyLog(inner, self.plan, role, self.writers,
                         interleave=self._interleave if role == "binder" else None)

    async def _start(self, role: str) -> None:
        self.starts[role] += 1
        ids = SeededIds(f"dst/{self.seed}/{role}/{self.starts[role]}")
        log = self._log_for(role)
        await log.claim_writer()
        if role == "informer":
            self.watch.restart()
            informer = InformerService(log, self.cluster, self.clock, ids, ours=self.config.scheduler_name)
            await informer.resync()
            self.informer = informer
        elif role == "scheduler":
            scheduler = SchedulerService(log, self.config, self.packer, self.clock, ids,
                                         snapshots=self.snapshots, snapshot_every=self.settings.snapshot_every)
            await scheduler.start()
            self.scheduler = scheduler
        else:
            binder = BinderService(log, self.actuator, self.clock, evict_retry_delays_ns=(0, 0),
                                   progress=self.progress)
            await binder.restore()
            await binder.poll()
            self.binder = binder

    def _up(self, role: str) -> bool:
        return getattr(self, role) is not None

    def _crashed(self, role: str) -> None:
        setattr(self, role, None)
        low, high = self.settings.restart_ns
        delay = self.plan.between(low, high) if self.plan.enabled else 0
        self.down_until[role] = self.clock.now_ns() + delay

    async def _step(self, role: str) -> bool:
        """One step of `role` (starting it when due); True when it did something."""
        now = self.clock.now_ns()
        try:
            if not self._up(role):
                if now < self.down_until[role]:
                    return False
                await self._start(role)
                return True
            if role == "informer":
                assert self.informer is not None
                return await self.informer.pump(self.watch.pending()) > 0
            if role == "scheduler":
                assert self.scheduler is not None
                if not self._interleaving and self.plan.roll("pause"):
                    self._pause()
                    return True
                await self.scheduler.catch_up()
                if now >= self.next_cycle and self.scheduler.has_work():
                    await self.scheduler.run_cycle_once()
                    self.cycles += 1
                    self.next_cycle = now + self.scenario.simulation.cycle_period_ns
                    return True
                return False
            assert self.binder is not None
            return await self.binder.step() > 0
        except Crash:
            self._crashed(role)
            return True

    def _pause(self) -> None:
        """The scheduler stops past its lease; a standby starts when the lease runs out and the
        old one wakes a little after that (see `_wake_zombie`)."""
        assert self.scheduler is not None
        now = self.clock.now_ns()
        standby = now + self.settings.lease_ns
        self.zombie = (self.scheduler, standby + self.plan.between(1 * SECOND, 10 * SECOND))
        self.scheduler = None
        self.down_until["scheduler"] = standby

    async def _wake_zombie(self) -> None:
        if self.zombie is None or self.clock.now_ns() < self.zombie[1] or not self._up("scheduler"):
            return
        old, _ = self.zombie
        self.zombie = None
        try:
            await old.catch_up()
            await old.run_cycle_once()
        except WriterFenced:
            self.fenced += 1
            return
        except Crash:
            return
        self.checker.fail("a paused scheduler woke after its standby took over and appended a cycle "
                          "(it was not fenced)")

    async def _interleave(self) -> None:
        """The binder's append waits while the informer and the scheduler run a few steps."""
        if self._interleaving:
            return
        self._interleaving = True
        try:
            for _ in range(self.plan.between(1, 3)):
                for role in ("informer", "scheduler"):
                    if self._up(role):
                        await self._step(role)
        finally:
            self._interleaving = False

    # -- the loop -----------------------------------------------------------------------------

    def _idle(self) -> bool:
        return (all(self._up(r) for r in ROLES) and self.zombie is None
                and self.cluster.next_event_ns() is None and not self.cluster._changes  # noqa: SLF001
                and self.scheduler is not None and not self.scheduler.has_work()
                and self.scheduler.next_backoff_ns() is None
                and self.binder is not None and not self.binder.pending)

    def _next_time(self, now: int, faulting: bool) -> int:
        candidates = [t for t in self.down_until.values() if t > now]
        nxt = self.cluster.next_event_ns()
        if nxt is not None:
            candidates.append(nxt)
        if self.scheduler is not None:
            if self.scheduler.has_work():
                candidates.append(max(self.next_cycle, now + 1))
            backoff = self.scheduler.next_backoff_ns()
            if backoff is not None:
                candidates.append(max(backoff, self.next_cycle))
        if self.zombie is not None and self.zombie[1] > now:
            candidates.append(self.zombie[1])
        retry = None if self.binder is None else self.binder.next_retry_ns()
        if retry is not None:
            candidates.append(retry)
        if faulting:  # faults need chances even when nothing is due
            candidates.append(now + self.plan.between(SECOND // 10, 2 * SECOND))
        target = min(candidates) if candidates else now + SECOND
        return max(target, now + 1)

    async def run(self) -> DstReport:
        report = DstReport(seed=self.seed)
        start = self.scenario.start_ns
        fault_end = start + self.settings.horizon_ns
        settle_end = fault_end + self.settings.settle_ns
        for step in range(self.settings.max_steps):
            now = self.clock.now_ns()
            faulting = now < fault_end
            if not faulting and self.plan.enabled:
                self.plan.enabled = False  # settle: no more faults, everything up at once
                for role in ROLES:
                    self.down_until[role] = min(self.down_until[role], now)
                if self.zombie is not None:
                    self.zombie = (self.zombie[0], now)
            self.cluster.advance(now)
            for role in self.plan.shuffled(ROLES) if faulting else ROLES:
                await self._step(role)
            await self._wake_zombie()
            await self.checker.check(self.log)
            report.steps = step + 1
            if self.checker.violations:
                break
            if not faulting and self._idle():
                report.settled = True
                break
            if now >= settle_end:
                self.checker.fail(f"the run did not settle within {self.settings.settle_ns // SECOND} s "
                                  f"after the faults stopped")
                break
            self.clock.advance_to(self._next_time(now, faulting))
        else:
            self.checker.fail(f"the run took more than {self.settings.max_steps} steps")
        if report.settled:
            self.checker.finish(self.cluster)
            records = [r async for r in self.log.read(0)]
            whole = replay(records, self.packer)
            if not whole.ok:
                assert whole.divergence is not None
                self.checker.fail(f"replay from scratch: {describe(whole.divergence)}")
        report.cycles = self.cycles
        report.fenced = self.fenced
        report.records = await self.log.end_position()
        report.decisions = len(self.checker.decisions)
        report.end_ns = self.clock.now_ns() - start
        report.faults = dict(sorted(self.plan.injected.items()))
        report.starts = dict(sorted(self.starts.items()))
        report.violations = list(self.checker.violations)
        bodies = [encode(r.envelope) async for r in self.log.read(0)]
        report.log_digest = hashlib.sha256(b"".join(bodies)).hexdigest()
        return report


async def run_seed(seed: int, packer: Packer, *, mix: FaultMix | None = None,
                   scenario: Scenario | None = None, settings: DstSettings = DstSettings(),
                   config: SchedulerConfig | None = None, log_path: Path | None = None) -> DstReport:
    """One run (module docstring) of `scenario` (default: `kai_es.sim.workload.workload(seed)`)
    with the faults of `mix` (default: every fault, `kai_es.sim.faults.DEFAULT_MIX`) drawn from
    `seed`, over the memory log or (`log_path`, which must not exist) a new file log there."""
    scenario = scenario or load_scenario_text(workload(seed), f"dst-{seed}.yaml")
    return await _Run(seed, scenario, mix or FaultMix(), packer, settings, config, log_path).run()

