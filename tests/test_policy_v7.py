"""kai-es/v7, the clocks KAI keeps on a PodGroup: each rule's scenario (tests/scenarios/v7-*,
PodGroups annotated as KAI's status updater annotates them) holds under v7 on both packers
(test_cycle_scenarios) and fails with that one rule removed; the fold keeps one clock per gang
whatever second is read back; the annotations are read whatever they hold; digests of logs
without them are unchanged (tests/golden/history replays in test_simulation)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.events.registry import written_version
from kai_es.ingest import translate as tr
from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.config import ConfigError, config_event, config_to_dict, parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.preemption_delay import PodGroupPreemptionDelay
from kai_es.scheduling.rules.releasing_capacity import AllReleasingV6, stuck_releasing
from kai_es.state import ClusterState, invariants
from kai_es.state import versions
from kai_es.state.incremental_digest import incremental_digest, recomputed_digest
from kai_es.state.reducer import apply
from tests.policy_patch import without
from tests.test_cycle_scenarios import check, expectations

SCENARIOS = Path(__file__).parent / "scenarios"
STALE = SCENARIOS / "v7-stale-timestamp-handover.yaml"
DELAY = SCENARIOS / "v7-last-eviction-rearms-delay.yaml"
SEC = 10**9
T0 = 1_767_268_800 * SEC  # 2026-01-01T12:00:00Z


def _cycle(path: Path, engine: str = "native", text: str | None = None) -> dict[str, Any]:
    scenario = load_scenario(path) if text is None else load_scenario_text(text, path.name)
    return one_cycle(scenario, load_packer(engine))  # type: ignore[arg-type]


def _as_v6(path: Path) -> str:
    text = path.read_text()
    if "scheduler: {actions: [allocate, preempt]}" in text:
        return text.replace("scheduler: {actions: [allocate, preempt]}",
                            "scheduler: {actions: [allocate, preempt], policyVersion: kai-es/v6}")
    return text.replace('  start: "2026-01-01T12:00:00Z"\n',
                        '  start: "2026-01-01T12:00:00Z"\n  scheduler: {policyVersion: kai-es/v6}\n')


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_gang_kai_found_stale_is_evicted_when_its_grace_is_over_not_restarted(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(STALE, engine), expectations(STALE))
    # the fold rule removed: the clock starts again when kai-es first sees the gang
    for version, rules in sorted(versions.FOLD_RULES.items()):  # v7 and every later version
        if rules.handover_stamps:
            monkeypatch.setitem(versions.FOLD_RULES, version,  # type: ignore[arg-type]
                                dataclasses.replace(rules, handover_stamps=False))
    with pytest.raises(AssertionError):
        check(_cycle(STALE, engine), expectations(STALE))


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_kai_s_last_eviction_re_arms_the_preemption_delay(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(DELAY, engine), expectations(DELAY))
    without(monkeypatch, "kai-es/v7", "preemption_delay", PodGroupPreemptionDelay())
    with pytest.raises(AssertionError):
        check(_cycle(DELAY, engine), expectations(DELAY))


def test_under_v6_the_same_manifests_decide_as_v6_did() -> None:
    """Configs naming kai-es/v6 keep its decisions: the annotations are read into the log but
    change nothing."""
    stale = _cycle(STALE, text=_as_v6(STALE))["pods"]
    assert stale["default/handed-over-0"]["status"] == "Running"
    delay = _cycle(DELAY, text=_as_v6(DELAY))["pods"]
    assert delay["default/resumed-0"]["status"] == "Pipelined"
    assert delay["default/t-0"]["status"] == "Releasing"


# -- the fold ----------------------------------------------------------------------------------


def _rec(position: int, payload: p.Payload, t: int) -> Record:
    return Record(position, make_envelope(payload, event_id=str(uuid.uuid4()), source="test",
                                          subject="x", logicaltime=t))


class _Fold:
    """A state folded from hand-made records: a gang g (minMember 3) in queue q."""

    def __init__(self, version: str = "kai-es/v7") -> None:
        self.state = ClusterState()
        self.position = 0
        env = config_event(parse_config({"policyVersion": version}), event_id="c", logicaltime=T0 - 100 * SEC)
        apply(self.state, Record(0, env))
        self.position = 1
        self.feed(p.QueueObserved(name="q"), T0 - 100 * SEC)
        self.feed(p.NodeObserved(name="n", gpus=8, milli_cpu=64_000, memory_bytes=2**40), T0 - 100 * SEC)

    def feed(self, payload: p.Payload, t: int) -> None:
        apply(self.state, _rec(self.position, payload, t))
        self.position += 1
        assert not invariants.check(self.state), invariants.check(self.state)

    def group(self, t: int, stamp: int | None = None) -> None:
        self.feed(p.PodGroupObserved(namespace="d", name="g", queue="q", min_member=3,
                                     stale_timestamp_ns=stamp), t)

    def running(self, i: int, t: int) -> None:
        self.feed(p.PodObserved(namespace="d", name=f"g-{i}", uid=f"u{i}", queue="q", podgroup="g",
                                node_name="n", phase="Running", gpu=p.GpuRequest(whole=1)), t)

    @property
    def since(self) -> int:
        return self.state.jobs["d/g"].stale_since_ns


def test_the_stamp_read_back_in_the_same_second_keeps_the_clock_to_the_nanosecond() -> None:
    f = _Fold()
    f.group(T0)
    f.running(0, T0 + 123_456_789)
    assert f.since == T0 + 123_456_789  # stale: kai-es's own clock
    f.group(T0 + 2 * SEC, stamp=T0)  # its status writer wrote that second; the informer read it back
    assert f.since == T0 + 123_456_789
    f.group(T0 + 3 * SEC, stamp=T0 - 60 * SEC)  # another scheduler says otherwise: taken
    assert f.since == T0 - 60 * SEC
    f.running(1, T0 + 4 * SEC)
    f.running(2, T0 + 5 * SEC)
    assert f.since == 0  # whole: not stale


def test_a_stamp_waits_for_the_gang_to_run_and_a_future_or_pre_epoch_one_is_bounded() -> None:
    f = _Fold()
    f.group(T0, stamp=T0 - 600 * SEC)  # listed before its pods (the informer's resync order)
    assert f.since == 0
    f.running(0, T0 + SEC)
    assert f.since == T0 - 600 * SEC
    future = _Fold()
    future.group(T0, stamp=T0 + 3600 * SEC)
    future.running(0, T0 + SEC)
    assert future.since == T0 + SEC  # a time to come counts as the event's
    epoch = _Fold()
    epoch.group(T0, stamp=-5 * SEC)
    epoch.running(0, T0 + SEC)
    assert epoch.since == 1  # 0 means "not stale": the earliest time kept is 1 ns


def test_v6_ignores_the_stamp() -> None:
    f = _Fold("kai-es/v6")
    f.group(T0, stamp=T0 - 600 * SEC)
    f.running(0, T0 + SEC)
    assert f.since == T0 + SEC


@settings(max_examples=200, deadline=None)
@given(stamps=st.lists(st.one_of(st.none(), st.integers(min_value=-(2**128), max_value=2**128)), max_size=6),
       times=st.lists(st.integers(min_value=0, max_value=10**6), min_size=6, max_size=6))
def test_any_stamps_fold_and_digest_as_a_snapshot_does(stamps: list[int | None], times: list[int]) -> None:
    """Stamps from far outside any clock (2^128 ns either way) never break the fold, its
    invariants or the digest; the incremental digest equals the one recomputed from scratch."""
    f = _Fold()
    t = T0
    for i, stamp in enumerate(stamps):
        t += times[i] * SEC // 1000
        f.group(t, stamp=stamp)
        if i < 2:
            f.running(i, t)
        assert incremental_digest(f.state) == recomputed_digest(f.state)
        assert f.since == 0 or 1 <= f.since <= t


def test_a_spec_with_a_stamp_digests_differently_from_one_without() -> None:
    a, b = _Fold(), _Fold()
    a.group(T0)
    b.group(T0, stamp=T0)
    assert incremental_digest(a.state) != incremental_digest(b.state)
    assert incremental_digest(b.state) == recomputed_digest(b.state)


# -- ingest and schema -------------------------------------------------------------------------


def _podgroup(annotations: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "d", "uid": "u", "annotations": annotations},
            "spec": {"queue": "q", "minMember": 2}}


@pytest.mark.parametrize(("raw", "want"), [
    ("2026-01-01T11:58:00Z", T0 - 120 * SEC),
    ("2026-01-01T13:58:00.5+02:00", T0 - 120 * SEC + SEC // 2),
    ("9999-12-31T23:59:59Z", 253_402_300_799 * SEC),  # far ahead: kept (and bounded by the fold)
    ("quick brown fox", None),  # KAI's own test value: ignored, as KAI ignores it
    ("0000-01-01T00:00:00Z", None),  # no year 0
    ("", None),
])
def test_the_annotations_are_read_as_kai_reads_them(raw: str, want: int | None) -> None:
    data = tr.podgroup(_podgroup({tr.STALE_TIMESTAMP_ANNOTATION: raw, tr.LAST_EVICTION_TIMESTAMP_ANNOTATION: raw}))
    assert data.stale_timestamp_ns == want and data.last_eviction_timestamp_ns == want
    assert data.min_member == 2  # the PodGroup itself is never rejected for them


def test_a_podgroup_without_the_times_is_written_at_the_older_schema_version() -> None:
    plain = tr.podgroup(_podgroup({}))
    assert written_version(plain) == 4
    assert written_version(msgspec.structs.replace(plain, stale_timestamp_ns=0)) == 5
    assert written_version(tr.podgroup(_podgroup({tr.LAST_EVICTION_TIMESTAMP_ANNOTATION: "2026-01-01T00:00:00Z"}))) == 5


# -- stuck releasing (KAI's StuckInReleasing) --------------------------------------------------

STUCK = SCENARIOS / "v7-stuck-in-releasing.yaml"


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_pod_deleted_long_ago_that_still_runs_is_not_pipelined_onto(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = _cycle(STUCK, engine)
    check(outcome, expectations(STUCK))
    completed = [d for d in outcome["decisions"] if d["type"] == "kai.scheduler.cycle.completed"]
    assert completed[0]["data"]["stuck_releasing"] == ["default/old"]
    # version 2 brought stuck_releasing; v13's tried order (this first cycle records one) makes it 3
    assert "tried_order" in completed[0]["data"] and completed[0]["schemaversion"] == 3
    without(monkeypatch, "kai-es/v7", "releasing_capacity", AllReleasingV6())
    without(monkeypatch, "kai-es/v10", "releasing_capacity", AllReleasingV6())  # (v10's class extends v7's)
    with pytest.raises(AssertionError):
        check(_cycle(STUCK, engine), expectations(STUCK))


def test_under_v6_a_stuck_pod_is_pipelined_onto_and_the_cycle_names_none() -> None:
    text = STUCK.read_text().replace("scheduler: {actions: [allocate]}",
                                     "scheduler: {actions: [allocate], policyVersion: kai-es/v6}")
    outcome = _cycle(STUCK, text=text)
    assert outcome["pods"]["default/b"]["status"] == "Pipelined"
    completed = [d for d in outcome["decisions"] if d["type"] == "kai.scheduler.cycle.completed"]
    assert "stuck_releasing" not in completed[0]["data"] and completed[0]["schemaversion"] == 1


@pytest.mark.parametrize("threshold", ["10m1s", "1h"])
def test_the_threshold_is_the_config_s(threshold: str) -> None:
    text = STUCK.read_text().replace("scheduler: {actions: [allocate]}",
                                     f"scheduler: {{actions: [allocate], stuckInReleasingThreshold: {threshold}}}")
    pods = _cycle(STUCK, text=text)["pods"]
    assert pods["default/old"]["status"] == "Releasing" and pods["default/b"]["status"] == "Pipelined"


def _deleting(name: str, deletion: str | None, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "d", "uid": f"u-{name}", "labels": {"kai.scheduler/queue": "q"}}
    if deletion is not None:
        meta["deletionTimestamp"] = deletion
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"phase": phase},
            "spec": {"schedulerName": "kai-scheduler", "nodeName": "n",
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}


def test_which_pods_are_stuck() -> None:
    f = _Fold()
    f.feed(p.QueueObserved(name="q"), T0)
    for pod in (_deleting("over", "2026-01-01T11:57:59Z"), _deleting("exactly", "2026-01-01T11:58:00Z"),
                _deleting("young", "2026-01-01T11:59:00Z"), _deleting("pending", "2026-01-01T11:00:00Z", "Pending"),
                _deleting("running", None)):
        f.feed(tr.pod(pod), T0)
    unknown = msgspec.structs.replace(tr.pod(_deleting("unknown", "2026-01-01T11:00:00Z")), deletion_ns=0)
    f.feed(unknown, T0)  # observed by an informer that did not read the deletion time
    assert stuck_releasing(f.state, T0, 120 * SEC) == ["d/over"]  # KAI: more than the threshold
    assert written_version(tr.pod(_deleting("running", None))) == 3  # its bytes as before
    assert written_version(tr.pod(_deleting("over", "2026-01-01T11:57:59Z"))) == 4


def test_the_scheduler_wakes_when_a_pod_turns_stuck_under_v7_only() -> None:
    for version, wakes in (("kai-es/v7", True), ("kai-es/v6", False)):
        config = parse_config({"policyVersion": version})
        f = _Fold(version)
        f.feed(p.QueueObserved(name="q"), T0)
        f.feed(tr.pod(_deleting("leaving", "2026-01-01T11:59:00Z")), T0)
        f.feed(msgspec.structs.replace(tr.pod(_deleting("waits", None, "Pending")), node_name=""), T0)
        due = policy.POLICIES[version].rules.wakeups.due_times_ns(f.state, config)
        assert ((T0 - 60 * SEC + 120 * SEC + 1) in due) is wakes, due


@pytest.mark.parametrize("bad", ["-1s", "soon", "101y", 5])
def test_a_bad_threshold_is_refused_with_its_field(bad: object) -> None:
    with pytest.raises(ConfigError, match="stuckInReleasingThreshold"):
        parse_config({"stuckInReleasingThreshold": bad})


def test_the_default_threshold_is_not_written() -> None:
    assert "stuckInReleasingThreshold" not in config_to_dict(parse_config({}))
