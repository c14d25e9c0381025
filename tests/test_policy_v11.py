"""kai-es/v11: a victim search takes victim jobs queue by queue, from the queue KAI's queue order
puts last (`rules.victim_queue_order.ReverseQueueOrder`; KAI's victims queue, `JobsOrderByQueues`
with `VictimQueue`, compares queue nodes by the reverse of the proportion plugin's queue order:
over fair share, over quota, lower queue priority, dominant share without the victims given and
the next one, ...). kai-es/v10 merged every candidate job of every queue cheapest first, so the
newest job of a higher-priority queue went before an older one of a lower-priority queue. The
scenario and KAI's case hold under v11 and fail with v10's rule in its place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.victim_queue_order import CheapestFirstV10
from tests import test_kai_rounds as rounds
from tests.policy_patch import without
from tests.test_cycle_scenarios import check, expectations

SCENARIO = Path(__file__).parent / "scenarios" / "v11-reclaim-from-the-lower-priority-queue.yaml"
START = '  start: "2026-01-01T12:00:00Z"\n'
#: KAI cases (tests/test_kai_rounds.py) that converge with this rule only
BY_QUEUE_KAI_CASES = ("Reclaim trains according to priority",)


def _evicted(outcome: dict[str, Any]) -> list[str]:
    return [d["subject"].removeprefix("pod/") for d in outcome["decisions"]
            if d["type"] == "kai.scheduler.pod.evictiondecided"]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_the_lower_priority_queue_gives_the_victim(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = one_cycle(load_scenario(SCENARIO), load_packer(engine))  # type: ignore[arg-type]
    check(outcome, expectations(SCENARIO))
    assert _evicted(outcome) == ["default/nightly-b-0"]
    without(monkeypatch, "kai-es/v11", "victim_queue_order", CheapestFirstV10())
    outcome = one_cycle(load_scenario(SCENARIO), load_packer(engine))  # type: ignore[arg-type]
    assert _evicted(outcome) == ["default/embed-b-0"]  # the newest job, of the priority-101 queue
    with pytest.raises(AssertionError):
        check(outcome, expectations(SCENARIO))


def test_kai_es_v10_decides_the_scenario_as_before() -> None:
    text = SCENARIO.read_text().replace(START, f"{START}  scheduler: {{policyVersion: kai-es/v10}}\n", 1)
    outcome = one_cycle(load_scenario_text(text, "v10.yaml"), load_packer("native"))
    assert _evicted(outcome) == ["default/embed-b-0"]


@pytest.mark.parametrize("name", BY_QUEUE_KAI_CASES, ids=lambda v: v[:40])
def test_kais_integration_cases_need_v11s_rule(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    case, = (c for c in rounds.CASES if name in c.kai_test)
    rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case, "native")
    without(monkeypatch, "kai-es/v11", "victim_queue_order", CheapestFirstV10())
    with pytest.raises(AssertionError):
        rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case, "native")


def test_v11s_fold_adds_only_releases_failed_moves() -> None:
    import dataclasses

    v10, v11 = policy.POLICIES["kai-es/v10"].fold, policy.POLICIES["kai-es/v11"].fold
    assert dataclasses.replace(v11, releases_failed_moves=False) == v10 and v11.releases_failed_moves
