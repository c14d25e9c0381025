"""kai-es/v9: consolidation's node order breaks ties by KAI's victim order; reclaim's strategies and saturation bound judge the scenario's final victims, once
the job is placed and the victims that fit elsewhere are re-placed (KAI's reclaim validator with
allowConsolidatingReclaim, its default). The scenario (tests/scenarios/v9-*, KAI's
consolidation_and_reclaim integration test written as a KAI user's manifests) holds on both
packers and fails with the rule removed; a victim that cannot move is still judged, and refused
when its queue is not above its fair share; older versions decide as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.consolidation_nodes import MostFreeFirstV8
from kai_es.scheduling.rules.reclaim_victims import QueuePriorityInQuota
from tests.policy_patch import without
from tests import test_kai_rounds as rounds  # (the module, so its test is not collected here again)
from tests.test_cycle_scenarios import check, expectations

SCENARIO = Path(__file__).parent / "scenarios" / "v9-reclaim-takes-the-room-a-move-makes.yaml"

#: a third queue's non-preemptible pod fills node-a's idle GPUs: mid cannot move
NODE_A_FULL = """
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: serve}
spec:
  resources:
    gpu: {quota: 0, limit: -1, overQuotaWeight: 0}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-0
  namespace: default
  labels: {kai.scheduler/queue: serve}
spec:
  schedulerName: kai-scheduler
  priorityClassName: build
  nodeName: node-a
  containers:
  - {name: main, image: api:1, resources: {limits: {nvidia.com/gpu: "2"}}}
status: {phase: Running}
"""


def _cycle(text: str, engine: str = "native") -> dict[str, Any]:
    return one_cycle(load_scenario_text(text, SCENARIO.name), load_packer(engine))  # type: ignore[arg-type]


def _with_version(text: str, version: str) -> str:
    return text.replace('  start: "2026-01-01T12:00:00Z"\n',
                        f'  start: "2026-01-01T12:00:00Z"\n  scheduler: {{policyVersion: {version}}}\n', 1)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_the_scenario_needs_its_rule(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(one_cycle(load_scenario(SCENARIO), load_packer(engine)), expectations(SCENARIO))  # type: ignore[arg-type]
    without(monkeypatch, "kai-es/v9", "reclaim_victims", QueuePriorityInQuota())
    with pytest.raises(AssertionError):
        check(one_cycle(load_scenario(SCENARIO), load_packer(engine)), expectations(SCENARIO))  # type: ignore[arg-type]


def test_under_v8_the_victim_that_would_move_is_refused_and_nothing_is_reclaimed() -> None:
    outcome = _cycle(_with_version(SCENARIO.read_text(), "kai-es/v8"))
    assert outcome["pods"]["default/big-0"]["status"] == "Pending"
    assert {pod["status"] for name, pod in outcome["pods"].items() if name != "default/big-0"} == {"Running"}


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_victim_that_cannot_move_is_judged_and_refused_at_its_fair_share(engine: str) -> None:
    """node-a full: mid would be a real victim, leaving train-a at 4 - not above its fair share
    4 with mid still counted: KAI's strategies refuse it, so nothing is evicted, and big-0's
    reason names the queue and its numbers."""
    outcome = _cycle(SCENARIO.read_text() + NODE_A_FULL, engine)
    pods = outcome["pods"]
    assert pods["default/big-0"]["status"] == "Pending"
    assert all(pods[n]["status"] == "Running" for n in ("default/mid-0", "default/small-0", "default/base-0"))
    reasons = [r for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.unschedulable"
               and d["subject"] == "pod/default/big-0" for r in d["data"]["reasons"]]
    reclaim = [r for r in reasons if r["code"] == "ReclaimNotPossible"]
    assert reclaim and "queue train-a is not above its fair share or quota" in reclaim[0]["message"], reasons
    assert reclaim[0]["numbers"]["fair_share_milli_gpu"] == 4000, reclaim[0]
    assert reclaim[0]["numbers"]["allocated_milli_gpu"] == 4000, reclaim[0]


def test_v9s_fold_is_v8s() -> None:
    assert policy.POLICIES["kai-es/v9"].fold == policy.POLICIES["kai-es/v8"].fold


@pytest.mark.parametrize(("case", "field", "old"), [
    ("consolidation_and_reclaim/", "reclaim_victims", QueuePriorityInQuota()),
    ("consolidation/consolidation_test.go: 1 train job of 1 GPU running on node0, 1 train job of 1 GPU running on "
     "node 0, 1 pending job of 2 GPUs - consolidate", "consolidation_nodes", MostFreeFirstV8()),
], ids=["reclaim-final-victims", "consolidation-node-order"])
def test_kais_multi_round_cases_need_v9s_rules(case: str, field: str, old: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/test_kai_rounds.py's KAI integration cases converge where KAI's tests expect
    under v9, and not with v8's rule in its place."""
    kai = next(c for c in rounds.CASES if c.kai_test.startswith(case))
    rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(kai, "native")
    without(monkeypatch, "kai-es/v9", field, old)
    with pytest.raises(AssertionError):
        rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(kai, "native")
