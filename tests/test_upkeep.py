"""The upkeep a scheduler runs while it waits for its next cycle (`kai_es.scheduling.upkeep`):
it leaves the next cycle nothing of its derived data to bring up to date, it changes no decision
and no digest however often it runs (a replay never runs it), it makes no cache no cycle asked
for and follows none the last cycle did not ask for, and `SchedulerService` runs it shortly
before each cycle is due."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kai_es.adapters.clock import SimClock
from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest.translate import subject_of
from kai_es.replay import Share, _Replayer, replay
from kai_es.scenario import load_scenario
from kai_es.scheduling.actions import consolidation_bounds
from kai_es.scheduling.config import SchedulerConfig, parse_config
from kai_es.scheduling.kept_capacity import CACHE_KEY as CAPACITY_KEY
from kai_es.scheduling.kept_capacity import fresh_capacity, state_capacity
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.tables import changed_since, generation
from kai_es.scheduling.upkeep import keep_up
from kai_es.services.scheduler import SchedulerService
from kai_es.state import ClusterState
from kai_es.state.incremental_digest import STALE_SETS, incremental_digest, recomputed_digest
from kai_es.state.reducer import apply
from tests.replays import day_log_with_checkpoints, verdict

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
SEC = 1_000_000_000


@pytest.fixture(scope="module")
def day_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return day_log_with_checkpoints(tmp_path_factory.mktemp("upkeep"))


def _logs(day_log: Path) -> dict[str, Path]:
    return {"consolidation": GOLDEN / "consolidation.events.jsonl",
            "quickstart-v1": GOLDEN / "history" / "quickstart.policy-v1-schema-v2.events.jsonl",
            "day": day_log}


def _stale(state: ClusterState) -> int:
    return sum(len(getattr(state, name)) for name in STALE_SETS)


def _config(state: ClusterState) -> SchedulerConfig | None:
    return parse_config(state.config) if state.config else None


def _replay_with_upkeep(path: Path, before: str) -> tuple[object, set[str]]:
    """The replay of `path` with `keep_up` run before every record (`before="record"`) or only
    before each CycleStarted (`"cycle"`), and which kept caches it brought up to date."""
    replayer = _Replayer(load_packer("native"), None, Share(), None)
    kept: set[str] = set()
    for record in FileEventLog(path, readonly=True).scan():
        config = _config(replayer.state)
        if config is not None and (before == "record" or isinstance(record.envelope.data, p.CycleStarted)):
            keep_up(replayer.state, config)
            kept |= {key for key in (consolidation_bounds.CACHE_KEY, CAPACITY_KEY) if key in replayer.state.caches}
        assert replayer.step(record), replayer.result.divergence
    return verdict(replayer.finish(at_end=True)), kept


@pytest.mark.parametrize("name", ["consolidation", "quickstart-v1", "day"])
@pytest.mark.parametrize("before", ["record", "cycle"])
def test_the_upkeep_changes_no_decision_and_no_digest_however_often_it_runs(
        name: str, before: str, day_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_ES_VERIFY", "1")  # every cycle checks its kept caches against fresh ones
    path = _logs(day_log)[name]
    plain = verdict(replay(FileEventLog(path, readonly=True).scan(), load_packer("native")))
    assert plain[0] is True, plain
    with_upkeep, kept = _replay_with_upkeep(path, before)
    assert with_upkeep == plain
    # the caches the upkeep followed (v1 has no consolidation; the day's searches never rank by bounds)
    assert kept == {"consolidation": {consolidation_bounds.CACHE_KEY, CAPACITY_KEY}, "day": {CAPACITY_KEY},
                    "quickstart-v1": set()}[name]


def _folded_until_a_later_cycle() -> tuple[ClusterState, Record]:
    """The golden consolidation log's state folded up to (not including) the first CycleStarted
    after a cycle that left kept bounds, with changes since, and that record."""
    replayer = _Replayer(load_packer("native"), None, Share(), None)
    for record in FileEventLog(GOLDEN / "consolidation.events.jsonl", readonly=True).scan():
        if isinstance(record.envelope.data, p.CycleStarted):
            if consolidation_bounds.CACHE_KEY in replayer.state.caches and _stale(replayer.state) and \
                    replayer.state.dirty_nodes:
                return replayer.state, record
        assert replayer.step(record)
    raise AssertionError("no such cycle in the log")


def test_after_the_upkeep_the_next_cycle_has_nothing_to_bring_up_to_date() -> None:
    state, started = _folded_until_a_later_cycle()
    config = _config(state)
    assert config is not None and config.state_digest_every == 1
    keep_up(state, config)
    assert _stale(state) == 0 and state.hashes.complete  # the digest's hashes: all current
    assert not state.dirty_nodes  # the tables' rows: all current
    now = generation(state)
    assert changed_since(state, now) == (now, [], False)
    bounds = consolidation_bounds.state_bounds(state)
    assert bounds.seen == now  # the cycle's own call finds them current
    fresh = consolidation_bounds.fresh_bounds(state)
    assert (bounds.least, bounds.free, list(bounds.ordered)) == (fresh.least, fresh.free, list(fresh.ordered))
    kept, again = state_capacity(state), fresh_capacity(state)
    assert kept.seen == now and (kept.each, kept.total) == (again.each, again.total)
    # the hashes kept are the digest's: the header hashed on top gives the digest from scratch
    assert incremental_digest(state) == recomputed_digest(state)
    assert isinstance(started.envelope.data, p.CycleStarted)


def test_the_upkeep_does_only_what_the_next_cycle_would() -> None:
    state, _ = _folded_until_a_later_cycle()
    config = _config(state)
    assert config is not None
    # a next cycle that computes no digest (every other cycle, this one not): its hashes wait
    every = 2 if (state.cycle + 1) % 2 else 3
    stale = _stale(state)
    assert stale
    keep_up(state, msgspec.structs.replace(config, state_digest_every=every))
    assert _stale(state) == stale
    # a state whose cycles never made the kept caches: the upkeep makes none of them
    fresh = ClusterState()
    for record in FileEventLog(GOLDEN / "consolidation.events.jsonl", readonly=True).scan():
        if isinstance(record.envelope.data, p.CycleStarted):
            break
        apply(fresh, record)
    cfg = _config(fresh)
    assert cfg is not None
    keep_up(fresh, cfg)
    assert consolidation_bounds.CACHE_KEY not in fresh.caches and CAPACITY_KEY not in fresh.caches
    assert _stale(fresh) == 0  # (the first cycle computes a digest: its hashes are made)


def _kept_bounds(state: ClusterState) -> consolidation_bounds.StateBounds:
    kept = state.caches[consolidation_bounds.CACHE_KEY]
    assert isinstance(kept, consolidation_bounds.StateBounds)
    return kept


def test_a_kept_cache_the_last_cycle_did_not_ask_for_is_left_for_the_cycle_that_asks() -> None:
    state, started = _folded_until_a_later_cycle()
    config = _config(state)
    assert config is not None
    keep_up(state, config)  # the last cycle asked for the bounds: followed
    followed = _kept_bounds(state).seen
    assert followed == generation(state)
    # more changes, and no cycle asks for the bounds (its consolidation searched nothing)
    for record in FileEventLog(GOLDEN / "consolidation.events.jsonl", readonly=True).scan():
        if record.position >= started.position and not state.dirty_nodes:
            apply(state, record)
    assert state.dirty_nodes
    keep_up(state, config)
    assert generation(state) > followed and _kept_bounds(state).seen == followed
    # the cycle that asks brings them up to date itself, as without the upkeep
    kept = consolidation_bounds.state_bounds(state)
    fresh = consolidation_bounds.fresh_bounds(state)
    assert kept.seen == generation(state) and list(kept.ordered) == list(fresh.ordered)
    asked = kept.asked
    keep_up(state, config)  # (asked since: followed again)
    assert _kept_bounds(state).asked == asked + 1


class _Recording(SimClock):
    """A SimClock that records the times it was asked to sleep until."""

    def __init__(self, start_ns: int) -> None:
        super().__init__(start_ns)
        self.sleeps: list[int] = []

    async def sleep_until(self, ns: int) -> None:
        self.sleeps.append(ns)
        await super().sleep_until(ns)


async def _service() -> tuple[SchedulerService, MemoryEventLog, _Recording]:
    sc = load_scenario(QUICKSTART)
    log = MemoryEventLog()
    await log.append([make_envelope(o.payload, event_id=f"e-{i}", source="test",
                                    subject=subject_of(o.payload), logicaltime=sc.start_ns)
                      for i, o in enumerate(sc.initial())])
    clock = _Recording(sc.start_ns)
    return SchedulerService(log, sc.config, load_packer("native"), clock, SeededIds("u")), log, clock


def _arrivals(t: int, n: int) -> Iterator[Envelope]:
    for i in range(n):
        pod = p.PodObserved(namespace="default", name=f"late-{i}", uid=f"late-{i}", queue="team-a",
                            podgroup=f"late-{i}", implicit_podgroup=True,
                            requests=p.PodResources(milli_cpu=100, memory_bytes=2**20),
                            gpu=p.GpuRequest(whole=1), created_ns=t)
        yield make_envelope(pod, event_id=f"late-{i}", source="test", subject=subject_of(pod), logicaltime=t)


async def test_the_scheduler_folds_and_runs_the_upkeep_shortly_before_its_next_cycle() -> None:
    sched, log, clock = await _service()
    await sched.start()
    await sched.run_cycle_once()
    period = SEC
    await log.append(list(_arrivals(clock.now_ns(), 3)))  # (arrives while it waits)
    until = clock.now_ns() + period
    await sched.wait(until, period)
    assert sched.upkeeps_run == 1
    assert _stale(sched.state) == 0 and "default/late-2" in sched.state.pods  # folded, hashed
    assert clock.sleeps == [until, until]  # the first upkeep: no duration known, no lead
    clock.sleeps.clear()
    until = clock.now_ns() + period
    await sched.wait(until, period)  # (the SimClock measured it as taking no time: a 20th of the period)
    assert clock.sleeps == [until - period // 20, until]
    assert sched.has_work()
    decisions = await sched.run_cycle_once()
    assert any(isinstance(d.data, p.BindingDecided) and d.data.name.startswith("late-") for d in decisions)
    # the cycle after the upkeep decided what a cycle without it decides: a replay's verdict
    result = replay([r async for r in log.read(0)], load_packer("native"))
    assert result.ok and result.cycles == 2, result.divergence


async def test_the_scheduler_loop_waits_through_the_upkeep() -> None:
    sched, _, _ = await _service()
    told: list[float] = []

    class Observer:
        def on_fold(self, record: object, state: object) -> None:
            pass

        def on_action(self, name: str) -> None:
            pass

        def on_cycle(self, state: object, config: object, decisions: object) -> None:
            pass

        def on_upkeep(self, seconds: float) -> None:
            told.append(seconds)

    sched.observer = Observer()
    await sched.run(SEC, cycles=1)
    assert sched.cycles_run == 1 and sched.upkeeps_run == 1 and len(told) == 1 and told[0] >= 0
