"""Deterministic simulation testing (`kai_es.app.dst`): the real informer, scheduler and binder
over the memory log (or the file log, torn appends included) and the simulated cluster, faults
from one seed, invariants after every step.

Hypothesis picks the seeds and the fault mixes (CI runs `max_examples` of each: see the
settings below); `tools/dst.py --seeds N` is the long soak. Each invariant is shown to catch a
bug planted in the real code it guards, and one seed always gives the same log, byte for byte."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kai_es.adapters import file_log
from kai_es.app.dst import DstReport, DstSettings, run_seed
from kai_es.scheduling.packing import load_packer
from kai_es.services import binder as binder_module
from kai_es.services import informer as informer_module
from kai_es.sim.faults import DEFAULT_MIX, FAULT_KINDS, FaultMix, FaultPlan
from kai_es.events import payloads as p
from kai_es.state.handlers import pods as pod_handlers
from kai_es.state.handlers.jobs import set_pending
from kai_es.state.handlers.occupancy import release

PACKER = load_packer("native")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)  # the services warn about every injected fault
    yield
    logging.disable(logging.NOTSET)


def _run(seed: int, mix: FaultMix | None = None, **kwargs: Any) -> DstReport:
    return anyio.run(lambda: run_seed(seed, PACKER, mix=mix, **kwargs))


mixes = st.dictionaries(st.sampled_from(FAULT_KINDS), st.integers(0, 200)).map(FaultMix)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**64 - 1), mix=st.one_of(st.just(FaultMix()), mixes))
# An expired bind back-off once counted as work forever: the idle scheduler cycled every period.
@example(seed=507470, mix=FaultMix({"pause": 78, "duplicate_outcomes": 77, "api_conflict": 134,
                                    "delete_pod": 163, "delete_node": 110, "delay_outcomes": 137,
                                    "lose_watch": 85}))
def test_every_invariant_holds_under_any_seed_and_fault_mix(seed: int, mix: FaultMix) -> None:
    report = _run(seed, mix)
    event(f"faults injected: {'none' if not report.fault_total() else 'some'}")
    event(f"restarts: {sum(report.starts.values()) > 3}")
    assert report.ok, f"seed {seed}, mix {dict(mix.rates)}: {report.violations}"
    assert report.settled and report.cycles > 0 and report.decisions > 0


def test_one_seed_gives_one_log_byte_for_byte() -> None:
    first, again, other = _run(7), _run(7), _run(8)
    assert first.ok and first.fault_total() > 0
    assert first.log_digest == again.log_digest
    assert (first.faults, first.starts, first.records) == (again.faults, again.starts, again.records)
    assert other.log_digest != first.log_digest


_LOGS = itertools.count()


def _run_on_file(seed: int, mix: FaultMix | None, directory: Path) -> DstReport:
    return _run(seed, mix, log_path=directory / f"seed-{seed}-{next(_LOGS)}.log")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**64 - 1), torn=st.integers(20, 300),
       mix=st.one_of(st.just(FaultMix()), mixes))
def test_every_invariant_holds_on_the_file_log_with_torn_appends(
        seed: int, torn: int, mix: FaultMix, tmp_path: Path) -> None:
    mix = FaultMix({**mix.rates, "torn_append": torn})
    report = _run_on_file(seed, mix, tmp_path)
    event(f"torn appends: {'none' if not report.faults.get('torn_append') else 'some'}")
    assert report.ok, f"seed {seed}, mix {dict(mix.rates)}: {report.violations}"
    assert report.settled and report.cycles > 0 and report.decisions > 0


def test_torn_appends_happen_on_the_file_log_only(tmp_path: Path) -> None:
    mix = FaultMix({"torn_append": 200})
    on_file = [_run_on_file(seed, mix, tmp_path) for seed in range(5)]
    assert all(r.ok for r in on_file), [r.violations for r in on_file]
    assert sum(r.faults.get("torn_append", 0) for r in on_file) > 5
    assert {"torn_append@informer", "torn_append@scheduler", "torn_append@binder"} <= set().union(*(r.faults for r in on_file))
    in_memory = _run(0, mix)
    assert in_memory.ok and "torn_append" not in in_memory.faults
    # without faults, the file log and the memory log hold the same records, byte for byte
    assert _run_on_file(4, FaultMix({}), tmp_path).log_digest == _run(4, FaultMix({})).log_digest


def test_a_file_log_whose_appends_are_not_batches_is_caught_by_a_torn_cycle(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The planted bug: every line of an append ends a batch (as before batches), so a scheduler
    that dies mid-append leaves part of its cycle that every reader takes for whole."""
    monkeypatch.setattr(file_log, "frame_batch", lambda bodies: [file_log.frame(b) for b in bodies])
    found = []
    for seed in range(40):
        found += [v for v in _run_on_file(seed, FaultMix({"torn_append": 150}), tmp_path).violations
                  if "missing" in v or "replay" in v]
        if found:
            break
    assert found


def test_the_default_mix_injects_every_fault_over_a_few_seeds(tmp_path: Path) -> None:
    seen: set[str] = set()
    fenced = 0
    for seed in range(40):  # every fourth over the file log: a torn append needs a file
        report = _run_on_file(seed, None, tmp_path) if seed % 4 == 3 else _run(seed)
        assert report.ok, (seed, report.violations)
        seen |= {k for k in report.faults if "@" not in k}
        fenced += report.fenced
    assert seen == set(FAULT_KINDS)
    assert fenced > 0, "no paused scheduler woke to find itself fenced"


def _violations_over(seeds: range, check: Callable[[str], bool]) -> list[tuple[int, str]]:
    found = []
    for seed in seeds:
        report = _run(seed)
        found += [(seed, v) for v in report.violations if check(v)]
        if found:
            break
    return found


def test_a_reducer_that_forgets_an_inflight_bind_is_caught_binding_a_pod_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: a pod being bound that the cluster reports without a node (a relist
    while the bind is in flight) goes back to Pending, so the next cycle binds it again."""
    real = pod_handlers._reconcile_placement

    def forgetful(state: Any, pod: Any, spec: Any, now: int, job: Any = None) -> None:
        if not spec.node_name and pod.status == "Binding":
            release(state, pod, job)
            set_pending(state, pod, not spec.terminating, job)
            return
        real(state, pod, spec, now, job)

    monkeypatch.setattr(pod_handlers, "_reconcile_placement", forgetful)
    assert _violations_over(range(60), lambda v: "bound twice" in v)


def test_a_relist_without_its_markers_is_caught_leaving_deleted_pods_in_the_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def unbracketed(self: Any, kind: str, changes: Any) -> list[Any]:
        return [e for e in (self.translate(c) for c in changes) if e is not None]

    monkeypatch.setattr(informer_module.InformerService, "_relist", unbracketed)
    assert _violations_over(range(60), lambda v: "the cluster has None" in v)


def test_a_binder_that_ignores_outcomes_in_the_log_is_caught_answering_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = binder_module.BinderService._observe
    outcomes = (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)

    def forgetful(self: Any, record: Any) -> None:
        if not isinstance(record.envelope.data, outcomes):
            real(self, record)

    monkeypatch.setattr(binder_module.BinderService, "_observe", forgetful)
    found = _violations_over(range(100), lambda v: "outcome" in v)
    assert found, "a binder re-performing answered decisions went unnoticed"


def test_a_scheduler_that_is_not_fenced_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without writer identities (a log whose claim fences nobody) a paused scheduler's wake-up
    cycle reaches the log: the run says so."""
    from kai_es.sim import faulty  # noqa: PLC0415

    monkeypatch.setattr(faulty.FaultyLog, "_check", lambda self: None)
    mix = FaultMix({"pause": 200})
    found = []
    for seed in range(20):
        found += [v for v in _run(seed, mix).violations if "not fenced" in v]
        if found:
            break
    assert found


def test_a_run_that_never_settles_is_a_violation() -> None:
    report = _run(3, FaultMix({}), settings=DstSettings(settle_ns=0, horizon_ns=1_000_000_000))
    assert not report.settled and any("did not settle" in v for v in report.violations)


def test_fault_mixes_are_validated_and_parsed() -> None:
    assert FaultMix.parse("none").rates == {}
    assert FaultMix.parse("crash=60").rate("crash") == 60
    assert FaultMix.parse("default").rates == dict(DEFAULT_MIX)
    for bad in ("crash", "crash=x", "crash=-1", "fire=3", "crash=1001"):
        with pytest.raises(ValueError):
            FaultMix.parse(bad)
    with pytest.raises(ValueError):
        FaultMix({"crash": True})
    with pytest.raises(ValueError):
        FaultMix({"crash": 2**128})


def test_a_plan_rolls_the_same_faults_for_the_same_seed() -> None:
    def rolls(seed: int) -> list[bool]:
        plan = FaultPlan(seed, FaultMix({"crash": 500}))
        return [plan.roll("crash") for _ in range(64)]

    assert rolls(2**127) == rolls(2**127) and rolls(1) != rolls(2)
    plan = FaultPlan(0, FaultMix({"crash": 1000}), enabled=False)
    assert not plan.roll("crash") and not plan.injected
