"""Stale gangs judged per leaf sub-group (policy kai-es/v4; KAI's `IsStale` over pod-sets):
the scenario tests/scenarios/stale-subgroup-eviction.yaml under v4 and v3, the wake-up
deadline, the rule over simulated time, and what must not move: a v3 log with a gang short in
a sub-group (tests/golden/history/stale-subgroups.policy-v3-schema-v3.*, written before the
rule existed) is still written, folded and digested byte for byte, while v4 states carry the
rule through a snapshot and through a change of config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.oneshot import initial_state, one_cycle
from kai_es.replay import replay
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import config_event, parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.policy import POLICIES, state_digest
from kai_es.scheduling.rules import wakeups as times
from kai_es.state import fold, invariants
from kai_es.state.incremental_digest import incremental_digest, recomputed_digest
from kai_es.state.reducer import apply
from kai_es.state.versions import FOLD_RULES
from kai_es.state.snapshot import load_snapshot, restore, snapshot_bytes

TESTS = Path(__file__).parent
SCENARIO = (TESTS / "scenarios" / "stale-subgroup-eviction.yaml").read_text()
HISTORY = TESTS / "golden" / "history"
SIM = (HISTORY / "stale-subgroups.policy-v3-schema-v3.yaml").read_text()
SIM_LOG = HISTORY / "stale-subgroups.policy-v3-schema-v3.events.jsonl"
SEC = 10**9


def _as(text: str, version: str) -> str:
    for old in ("policyVersion: kai-es/v3", "policyVersion: kai-es/v4"):
        text = text.replace(old, f"policyVersion: {version}")
    assert f"policyVersion: {version}" in text
    return text


def _cycle(text: str, engine: str = "native") -> dict[str, Any]:
    return one_cycle(load_scenario_text(text, "s.yaml"), load_packer(engine))  # type: ignore[arg-type]


def _evictions(outcome: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["subject"].removeprefix("pod/"): d["data"] for d in outcome["decisions"]
            if d["type"] == "kai.scheduler.pod.evictiondecided"}


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_v4_evicts_a_gang_short_in_a_sub_group_v3_does_not(engine: str) -> None:
    v4 = _evictions(_cycle(SCENARIO, engine))
    assert sorted(v4) == ["default/sg-leader-0", "default/sg-leader-1", "default/sg-worker-0"]
    data = v4["default/sg-worker-0"]
    assert data["action"] == "stalegangeviction"
    assert "sub-group workers of job default/sg has 1 of the 2 pods it needs" in data["reason"]
    assert {k: data["numbers"][k] for k in ("subgroup_occupying", "subgroup_min_member", "subgroups_below",
                                             "occupying", "min_member", "grace_period_ns")} == \
        {"subgroup_occupying": 1, "subgroup_min_member": 2, "subgroups_below": 1, "occupying": 3,
         "min_member": 3, "grace_period_ns": 0}
    # v3 judges the job's own minMember only: 3 of 3 run, nothing is stale
    assert _evictions(_cycle(_as(SCENARIO, "kai-es/v3"), engine)) == {}
    # a second worker running makes sub-group workers whole: nothing is stale under v4 either
    whole = SCENARIO.replace("{name: sg-leader-1, labels: {kai.scheduler/queue: q, kai.scheduler/subgroup-name: leaders}",
                             "{name: sg-leader-1, labels: {kai.scheduler/queue: q, kai.scheduler/subgroup-name: workers}")
    assert whole != SCENARIO and _evictions(_cycle(whole, engine)) == {}


def test_every_policy_version_judges_sub_groups_as_the_reducer_does() -> None:
    """The reducer keeps `stale_since_ns` by the config's version; the Policy says the same."""
    assert sorted(POLICIES) == sorted(FOLD_RULES)
    for version, policy in sorted(POLICIES.items()):
        assert policy.rules.staleness.judges_subgroups == FOLD_RULES[version].stale_subgroups, version
        assert policy.fold is FOLD_RULES[version], version
    assert POLICIES["kai-es/v4"].rules.staleness.judges_subgroups
    assert not POLICIES["kai-es/v3"].rules.staleness.judges_subgroups


def test_the_scheduler_wakes_at_a_sub_group_gangs_deadline_under_v4_only() -> None:
    start = load_scenario_text(SCENARIO, "s.yaml").start_ns
    v4 = initial_state(load_scenario_text(SCENARIO, "s.yaml"))
    config = parse_config(v4.config)
    assert sorted(v4.gangs_below_minimum) == ["default/later", "default/sg"]
    assert v4.jobs["default/later"].stale_since_ns == start
    assert times.due_times_ns(v4, config) == [start, start + 60 * SEC]  # sg's 0s, later's default 60s
    v3 = initial_state(load_scenario_text(_as(SCENARIO, "kai-es/v3"), "s.yaml"))
    assert not v3.gangs_below_minimum and times.due_times_ns(v3, parse_config(v3.config)) == []


def _simulate(text: str) -> list[Record]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "stale-subgroups.yaml"), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def test_under_v4_a_gang_short_in_a_sub_group_is_evicted_once_its_grace_period_has_passed() -> None:
    """sg runs at its own minMember (leader + one worker) once the binder gives up on its second
    worker: stale from that event on (the log's time), evicted whole in the first cycle at or
    after stale-since + 30s, which the scheduler wakes up for; the log replays."""
    records = _simulate(_as(SIM, "kai-es/v4"))
    envelopes = [r.envelope for r in records]
    gave_up = [e.logicaltime for e in envelopes if isinstance(e.data, p.PodBindFailed) and e.data.final
               and e.data.name == "sg-worker-1"]
    evicted = [e for e in envelopes if isinstance(e.data, p.EvictionDecided) and e.data.name.startswith("sg-")]
    assert len(gave_up) == 1 and sorted(e.data.name for e in evicted) == ["sg-leader", "sg-worker-0"]
    first = evicted[0]
    assert "sub-group workers of job default/sg has 1 of the 2 pods" in first.data.reason
    assert first.data.numbers["stale_since_ns"] == gave_up[0]
    assert gave_up[0] + 30 * SEC <= first.logicaltime <= gave_up[0] + 31 * SEC
    result = replay(records, load_packer("native"))
    assert result.ok and result.cycles > 1


def test_the_v3_log_with_a_gang_short_in_a_sub_group_is_still_written_and_folded_as_before() -> None:
    """The history log was written before sub-groups were judged: the current code writes the
    same bytes from its scenario, and folding it keeps sg not stale (its CycleCompleted digests
    are checked by `kai-es replay` in tests/test_simulation.py)."""
    records = _simulate(SIM)
    # PodGroupObserved is written at schema version 4 since (sub-groups' topology constraints,
    # an additive change): apart from that version number the bytes are the history's
    ours = b"".join(b"%s\n" % (line.replace(b'"schemaversion":4,', b'"schemaversion":3,')
                               if b'"type":"kai.cluster.podgroup.observed"' in line else line)
                    for line in _log_lines(records))
    assert ours == b"".join(b"%s\n" % line[9:] for line in SIM_LOG.read_bytes().splitlines())
    state = fold(records)
    sg = state.jobs["default/sg"]
    assert sg.leaves_below_minimum() == [("workers", 1, 2)] and sg.stale_since_ns == 0
    assert not [e for e in (r.envelope for r in records)
                if isinstance(e.data, p.EvictionDecided) and e.data.name.startswith("sg-")]


def _log_lines(records: list[Record]) -> list[bytes]:
    from kai_es.events.codec import encode

    return [encode(r.envelope) for r in records]


def test_a_v4_state_round_trips_a_snapshot_and_digests_its_stale_gangs() -> None:
    state = initial_state(load_scenario_text(SCENARIO, "s.yaml"))
    again = restore(load_snapshot(snapshot_bytes(state)))
    assert again.subgroup_stale and again.gangs_below_minimum == state.gangs_below_minimum
    for key in sorted(state.jobs):
        assert (again.jobs[key].stale_since_ns, again.jobs[key].subgroup_occupying) == \
            (state.jobs[key].stale_since_ns, state.jobs[key].subgroup_occupying)
    assert snapshot_bytes(again) == snapshot_bytes(state)
    assert incremental_digest(state) == incremental_digest(again) == recomputed_digest(state)
    assert invariants.check(state) == [] and invariants.check(again) == []
    # the same objects under v3: sg and later are not stale, so the state (and digest) differ
    v3 = initial_state(load_scenario_text(_as(SCENARIO, "kai-es/v3"), "s.yaml"))
    assert v3.jobs["default/sg"].stale_since_ns == 0
    assert state_digest("kai-es/v3", v3) != state_digest("kai-es/v4", state)


def _config_record(position: int, version: str, at_ns: int) -> Record:
    env = config_event(parse_config({"actions": ["allocate", "stalegangeviction"], "policyVersion": version}),
                       event_id=f"config-{position}", logicaltime=at_ns)
    return Record(position, env)


def test_a_change_of_policy_version_judges_sub_group_gangs_again_from_that_event() -> None:
    state = fold(_simulate(SIM))
    sg = state.jobs["default/sg"]
    assert sg.stale_since_ns == 0 and sg.leaves_below_minimum()
    at = state.logicaltime + SEC
    apply(state, _config_record(state.position + 1, "kai-es/v4", at))
    assert sg.stale_since_ns == at and "default/sg" in state.gangs_below_minimum
    assert invariants.check(state, strict=False) == []
    apply(state, _config_record(state.position + 1, "kai-es/v3", at + SEC))
    assert sg.stale_since_ns == 0 and "default/sg" not in state.gangs_below_minimum
    assert invariants.check(state, strict=False) == []


def test_a_gang_whose_podgroup_goes_is_judged_again_without_its_sub_groups() -> None:
    """sg is stale (by sub-group workers) 20s in, before its 30s grace period ends; its PodGroup
    removed, its pods form a job of minMember 1 without sub-groups: not stale any more."""
    state = fold(_simulate(_as(SIM.replace("until: 4m", "until: 20s"), "kai-es/v4")))
    sg = state.jobs["default/sg"]
    assert sg.stale_since_ns and sg.leaves_below_minimum() == [("workers", 1, 2)]
    gone = make_envelope(p.PodGroupRemoved(namespace="default", name="sg"), event_id="gone", source="t",
                         subject="podgroup/default/sg", logicaltime=state.logicaltime + SEC)
    apply(state, Record(state.position + 1, gone))
    assert sg.spec is None and sg.stale_since_ns == 0 and "default/sg" not in state.gangs_below_minimum
    assert invariants.check(state, strict=False) == []


def _pod(name: str, subgroup: str, *, node: str = "n1") -> p.PodObserved:
    return p.PodObserved(namespace="d", name=name, uid=f"uid-{name}", podgroup="g", subgroup=subgroup,
                         node_name=node, phase="Running", scheduler_name="kai-scheduler")


def test_an_occupying_pod_relabelled_into_another_sub_group_is_counted_there() -> None:
    config = config_event(parse_config({"policyVersion": "kai-es/v4"}), event_id="c", logicaltime=1)
    events: list[p.Payload] = [
        p.NodeObserved(name="n1", milli_cpu=64000, memory_bytes=2**36, gpus=8, max_pods=110),
        p.PodGroupObserved(namespace="d", name="g", uid="g", min_member=2,
                           subgroups=(p.SubGroup(name="a", min_member=1), p.SubGroup(name="b", min_member=1),)),
        _pod("x", "a"), _pod("y", "b"),
    ]
    records = [Record(0, config)] + [
        Record(i + 1, make_envelope(data, event_id=f"e{i}", source="t", subject="s", logicaltime=10 * (i + 1)))
        for i, data in enumerate(events)]
    state = fold(records)
    job = state.jobs["d/g"]
    assert job.subgroup_occupying == {"a": 1, "b": 1} and job.leaves_below_minimum() == []
    assert "d/g" not in state.gangs_below_minimum
    apply(state, Record(9, make_envelope(_pod("y", "a"), event_id="moved", source="t", subject="s",
                                         logicaltime=100)))
    assert job.subgroup_occupying == {"a": 2} and job.leaves_below_minimum() == [("b", 0, 1)]
    assert job.stale_since_ns == 100 and "d/g" in state.gangs_below_minimum
    assert invariants.check(state) == []
