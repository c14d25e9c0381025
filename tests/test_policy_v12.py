"""kai-es/v12: a reclaim or preempt search places the preemptor and its victims in one allocation
order (`rules.replacement_order.InAllocationOrder`; KAI's `TryToVirtuallyAllocatePreemptorAndGetVictims`
pops them from one jobs-by-queues order built once the victims are evicted): a victim whose job
that order takes first gets its place back before the preemptor is tried. kai-es/v11 placed the
preemptor first, so a queue could reclaim from a queue of higher priority, and a queue whose head
job was a large one reclaimed where KAI does not. The scenario and KAI's two cases hold under v12
and fail with v11's rule in its place."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.replacement_order import PreemptorFirstV11
from tests import test_kai_rounds as rounds
from tests.policy_patch import without
from tests.test_cycle_scenarios import check, expectations

SCENARIO = Path(__file__).parent / "scenarios" / "v12-the-higher-priority-queue-takes-its-place-back.yaml"
START = '  start: "2026-01-01T12:00:00Z"\n'
#: KAI cases (tests/test_kai_rounds.py) that converge with this rule only
IN_ORDER_KAI_CASES = ("yet we don't reclaim because allocate will case a loop",
                      "reclaim from less prioritized queue")


def _evicted(outcome: dict[str, Any]) -> list[str]:
    return [d["subject"].removeprefix("pod/") for d in outcome["decisions"]
            if d["type"] == "kai.scheduler.pod.evictiondecided"]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_the_higher_priority_queue_takes_its_place_back(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = one_cycle(load_scenario(SCENARIO), load_packer(engine))  # type: ignore[arg-type]
    check(outcome, expectations(SCENARIO))
    assert _evicted(outcome) == []
    reasons = {r["code"]: r["message"] for d in outcome["decisions"] if d["subject"] == "pod/default/nightly-b-0"
               and d["type"] == "kai.scheduler.pod.unschedulable" for r in d["data"]["reasons"]}
    # the reason names the queue whose victims come back first, and why
    assert "the victims of queue serving (priority 101 > 100) get their place back" in reasons["ReclaimNotPossible"]
    without(monkeypatch, "kai-es/v12", "replacement_order", PreemptorFirstV11())
    outcome = one_cycle(load_scenario(SCENARIO), load_packer(engine))  # type: ignore[arg-type]
    assert _evicted(outcome) == ["default/embed-b-0"]  # serving's newer job, for nightly-b
    with pytest.raises(AssertionError):
        check(outcome, expectations(SCENARIO))


def test_kai_es_v11_decides_the_scenario_as_before() -> None:
    text = SCENARIO.read_text().replace(START, f"{START}  scheduler: {{policyVersion: kai-es/v11}}\n", 1)
    outcome = one_cycle(load_scenario_text(text, "v11.yaml"), load_packer("native"))
    assert _evicted(outcome) == ["default/embed-b-0"]


@pytest.mark.parametrize("name", IN_ORDER_KAI_CASES, ids=lambda v: v[:40])
def test_kais_integration_cases_need_v12s_rule(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    case, = (c for c in rounds.CASES if name in c.kai_test)
    rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case, "native")
    without(monkeypatch, "kai-es/v12", "replacement_order", PreemptorFirstV11())
    with pytest.raises(AssertionError):
        rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case, "native")


def test_v12s_fold_is_v11s() -> None:
    v11, v12 = policy.POLICIES["kai-es/v11"], policy.POLICIES["kai-es/v12"]
    assert v12.fold == v11.fold
    assert dataclasses.replace(v12.rules, replacement_order=v11.rules.replacement_order) == v11.rules
