"""kai-es/v6, KAI's decisions when the cluster is full: each rule's scenario (tests/scenarios/v6-*,
written as a KAI user writes manifests) holds under v6 on both packers (test_cycle_scenarios) and
fails with that one rule put back to its kai-es/v5 class — so each test here fails when its rule
is removed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.config import parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.move_decisions import MoveInReasonV5
from kai_es.scheduling.rules.preemptors import AllocateLeftoversV5
from kai_es.scheduling.rules.reclaim_victims import DominantShareReclaimV5
from kai_es.scheduling.rules.replacement import MoveVictims
from kai_es.scheduling.rules.victim_order import NewestFirstV5
from tests.test_cycle_scenarios import check, expectations

SCENARIOS = Path(__file__).parent / "scenarios"

#: scenario -> (the v6 rule it shows, that rule's kai-es/v5 value)
RULE_OF = {
    "v6-reclaim-alone": ("preemptors", AllocateLeftoversV5()),
    "v6-actions-in-any-order": ("preemptors", AllocateLeftoversV5()),
    "v6-reclaim-last-gpu-of-quota": ("reclaim_victims", DominantShareReclaimV5()),
    "hierarchy-quota-order": ("reclaim_victims", DominantShareReclaimV5()),
    "v6-replacement-keeps-a-victim-that-fits": ("replacement", MoveVictims()),
    "v6-elastic-victim-task-priority": ("victim_order", NewestFirstV5()),
}


def _without(monkeypatch: pytest.MonkeyPatch, rule: str, old: object) -> None:
    """Policy kai-es/v6, and every later version that kept v6's class of the rule (the
    scenarios run the default version; a later refinement of the class counts), with that one
    rule put back to its kai-es/v5 class."""
    new = type(getattr(policy.POLICIES["kai-es/v6"].rules, rule))
    for version, value in sorted(policy.POLICIES.items()):
        if isinstance(getattr(value.rules, rule), new):
            monkeypatch.setitem(policy.POLICIES, version,  # type: ignore[arg-type]
                                dataclasses.replace(value, rules=dataclasses.replace(value.rules, **{rule: old})))


@pytest.mark.parametrize("name", sorted(RULE_OF))
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_each_scenario_needs_its_rule(name: str, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SCENARIOS / f"{name}.yaml"
    check(one_cycle(load_scenario(path), load_packer(engine)), expectations(path))  # type: ignore[arg-type]
    rule, old = RULE_OF[name]
    _without(monkeypatch, rule, old)
    with pytest.raises(AssertionError):
        check(one_cycle(load_scenario(path), load_packer(engine)), expectations(path))  # type: ignore[arg-type]


def _evictions(outcome: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.evictiondecided"]


def test_a_move_is_one_decision_with_both_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    path = SCENARIOS / "consolidation-basic.yaml"
    outcome = one_cycle(load_scenario(path), load_packer("native"))
    [move] = _evictions(outcome)
    assert (move["data"]["node"], move["data"]["to_node"], move["schemaversion"]) == ("n2", "n1", 3)
    assert "n1" not in move["data"]["reason"]  # where it goes is a field, not English
    assert outcome["pods"]["default/b"] | {"gpuGroups": []} == {"status": "Releasing", "node": "n2", "movesTo": "n1",
                                                                 "gpuGroups": []}
    # explain shows it as a move, from the golden log of examples/consolidation.yaml
    from kai_es.adapters.file_log import FileEventLog
    from kai_es.explain import explain, render_text
    golden = Path(__file__).parent / "golden" / "consolidation.events.jsonl"
    # (the golden is the current version's: under kai-es/v9 the newest notebooks, node-c's, move)
    report = explain(FileEventLog(golden, readonly=True).scan(), "pod/default/notebook-14")
    [decided] = [e for e in report["timeline"] if e["kind"] == "evictionDecided"]
    assert decided["node"] == "node-c" and decided["toNode"].startswith("node-")
    assert any(f"moved from node-c to {decided['toNode']} by consolidation" in line for line in render_text(report))
    _without(monkeypatch, "move_decisions", MoveInReasonV5())
    [move] = _evictions(one_cycle(load_scenario(path), load_packer("native")))
    assert "to_node" not in move["data"] and move["schemaversion"] == 2 and "to node n1" in move["data"]["reason"]


def test_an_eviction_that_is_no_move_is_written_as_schema_version_2() -> None:
    """Only a move carries what schema version 3 added: an eviction's bytes are unchanged."""
    path = SCENARIOS / "reclaim-basic.yaml"
    evictions = _evictions(one_cycle(load_scenario(path), load_packer("native")))
    assert evictions and all(e["schemaversion"] == 2 and "to_node" not in e["data"] for e in evictions)


def test_an_empty_action_list_runs_kais_defaults_and_says_so_in_the_config() -> None:
    config = parse_config({"actions": []})
    assert config.actions == ["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]
    # older versions keep what they did: an empty list runs nothing
    assert parse_config({"policyVersion": "kai-es/v5", "actions": []}).actions == []


def test_a_job_an_action_could_not_help_is_told_which_action_and_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """team-a is at its fair share: reclaim refuses it with the numbers, preempt has no victim."""
    path = SCENARIOS / "preempt-basic.yaml"

    def reasons(outcome: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.unschedulable"
                and d["data"]["name"] == "same-priority" for r in d["data"]["reasons"]]

    got = {r["code"]: r for r in reasons(one_cycle(load_scenario(path), load_packer("native")))}
    assert got["ReclaimNotPossible"]["message"] == "reclaim: queue q would exceed its fair share in GPU: 5 GPU > 4 GPU"
    assert got["ReclaimNotPossible"]["numbers"] == {"allocated": 4000, "fair_share": 4000, "requested": 1000}
    assert got["PreemptNotPossible"]["message"] == \
        "preempt: no preemptible job of lower priority than 50 runs in queue q"
    _without(monkeypatch, "preemptors", AllocateLeftoversV5())
    assert [r["code"] for r in reasons(one_cycle(load_scenario(path), load_packer("native")))] == ["NoNodeFits"]


def test_reclaim_alone_says_why_it_did_not_help() -> None:
    """`actions: [reclaim]` and a queue whose fair share is 0 (no quota, no over-quota weight): a
    reason, not silence."""
    text = (SCENARIOS / "v6-reclaim-alone.yaml").read_text().replace(
        "spec: {resources: {gpu: {quota: 4, limit: -1, overQuotaWeight: 1}",
        "spec: {resources: {gpu: {quota: 0, limit: -1, overQuotaWeight: 0}", 1)
    outcome = one_cycle(load_scenario_text(text, "alone.yaml"), load_packer("native"))
    assert outcome["pods"]["default/a-0"]["status"] == "Pending"
    [decision] = [d for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.unschedulable"]
    assert [r["code"] for r in decision["data"]["reasons"]] == ["ReclaimNotPossible"]
    assert decision["data"]["reasons"][0]["message"] == \
        "reclaim: queue team-a would exceed its fair share in GPU: 1 GPU > 0 GPU"


# -- reclaim's saturation bound, compared just below the lowest common ancestor ------------------

def _tree() -> dict[str, Any]:
    """Roots P1 {a1, a2} and P2 {b1}; GPU only (milli-GPU), CPU and memory unused."""
    from kai_es.scheduling.session import QueueNode

    def q(name: str, parent: QueueNode | None, quota: int, allocated: int, fair: int) -> QueueNode:
        node = QueueNode(name=name, parent=parent, priority=0, created_ns=0, quota=(quota, -1, -1),
                         limit=(-1, -1, -1), allocated=(allocated, 0, 0), fair=(fair, 0, 0))
        if parent is not None:
            parent.children.append(node)
        return node

    p1 = q("P1", None, 2000, 3000, 2000)
    a1 = q("a1", p1, 2000, 1000, 2000)
    a2 = q("a2", p1, 0, 2000, 0)
    p2 = q("P2", None, 2000, 4000, 2000)
    b1 = q("b1", p2, 2000, 4000, 2000)
    for node in (p1, a1, a2, p2, b1):
        node.chain = node.ancestry()
    return {n.name: n for n in (p1, a1, a2, p2, b1)}


def _unit(queue: str, milli_gpu: int) -> Any:
    from types import SimpleNamespace

    from kai_es.scheduling.victims import Unit
    pod = SimpleNamespace(milli_gpu=milli_gpu, spec=SimpleNamespace(requests=SimpleNamespace(milli_cpu=0, memory_bytes=0)))
    return Unit(job=SimpleNamespace(queue=queue), pods=(pod,))  # type: ignore[arg-type]


def test_kai_reclaim_compares_the_sides_below_the_common_ancestor_by_saturation() -> None:
    from types import SimpleNamespace

    from kai_es.scheduling.rules.reclaim_victims import KaiReclaimStrategies
    queues = _tree()
    session = SimpleNamespace(queues=queues, roots=[queues["P1"], queues["P2"]])
    judge = KaiReclaimStrategies().judge(session)  # type: ignore[arg-type]
    a1, job, request = queues["a1"], SimpleNamespace(preemptible=True), (1000, 0, 0)
    # a1 stays within its fair share (2 of 2); its side P1 ends at 4 of 2 (ratio 2) against P2's
    # 3 of 2 (ratio 1.5) with one victim taken: P1 would not stay below P2 -> refused
    assert judge.may_start(a1, job, request)  # type: ignore[arg-type]
    assert not judge.admit(a1, job, request)(_unit("b1", 1000))  # type: ignore[arg-type]
    # with P2 far above its share (8 of 2: ratio 3.5 after the victim) the bound holds -> taken
    for name in ("P2", "b1"):
        queues[name].allocated = (8000, 0, 0)
    assert judge.admit(a1, job, request)(_unit("b1", 1000))  # type: ignore[arg-type]
    # a side whose fair share is zero in the resource is not compared (KAI skips it): P2 (no
    # quota, fair share 0) left with nothing after its last GPU is taken is at ratio 0, and P1
    # ending at ratio 2 still does not stop a1
    for name in ("P2", "b1"):
        queues[name].allocated, queues[name].fair, queues[name].quota = (1000, 0, 0), (0, 0, 0), (0, -1, -1)
    assert judge.admit(a1, job, request)(_unit("b1", 1000))  # type: ignore[arg-type]
    # the reclaimer side may end at exactly 1 (its whole fair share): not "above" 1
    for name in ("P2", "b1"):
        queues[name].allocated, queues[name].fair, queues[name].quota = (2500, 0, 0), (2000, 0, 0), (2000, -1, -1)
    queues["P1"].allocated = (1000, 0, 0)
    assert judge.admit(a1, job, request)(_unit("b1", 1000))  # type: ignore[arg-type]


# -- fair share during a reclaim: a leaving victim and its replacement are requested once ----------

LEAVING = """\
apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: leaving}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "4"}}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: a}
spec: {resources: {gpu: {quota: 0, limit: -1, overQuotaWeight: 1}}}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: b}
spec: {resources: {gpu: {quota: 0, limit: -1, overQuotaWeight: 1}}}
---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata: {name: workers}
spec: {minMember: 1, queue: b, priorityClassName: train}
---
apiVersion: v1
kind: Pod
metadata: {name: w-0, annotations: {pod-group-name: workers}, deletionTimestamp: "2026-01-01T00:00:00Z"}
spec: {schedulerName: kai-scheduler, nodeName: n1, containers: [{name: c, resources: {requests: {nvidia.com/gpu: "2"}}}]}
status: {phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: w-0-replacement, annotations: {pod-group-name: workers}}
spec: {schedulerName: kai-scheduler, containers: [{name: c, resources: {requests: {nvidia.com/gpu: "2"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: a-0, labels: {kai.scheduler/queue: a}}
spec: {schedulerName: kai-scheduler, containers: [{name: c, resources: {requests: {nvidia.com/gpu: "3"}}}]}
"""


def test_a_leaving_victim_and_its_replacement_are_requested_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """b's only job holds 2 GPUs on a leaving pod and waits with its 2-GPU replacement: it asks
    for 2 GPUs in all, not 4 (kai-es/v5 asked for both)."""
    from kai_es.oneshot import fairshare_report

    def shares() -> dict[str, Any]:
        out = fairshare_report(load_scenario_text(LEAVING, "leaving.yaml"))
        return {q: out["queues"][q]["resources"]["gpu"] for q in ("a", "b")}

    now = shares()
    assert (now["b"]["request"], now["b"]["allocated"]) == (2000, 2000)
    from kai_es.scheduling.rules.fair_share_division import WholeGpuDivision
    _without(monkeypatch, "fair_share_division", WholeGpuDivision())
    before = shares()
    assert (before["b"]["request"], before["b"]["allocated"]) == (4000, 2000)


# -- several cycles: a fragmented cluster reaches the fair split and stays there -------------------

def test_a_fragmented_cluster_reaches_the_fair_split_with_the_fewest_evictions_and_stays() -> None:
    """Three 8-GPU nodes; queue a (quota 12) runs 14 one-GPU pods spread 5/5/4 (recreated when
    evicted, as a Job would); at t+5s queue b (quota 12) submits a 3 x 4-GPU gang. No node has 4
    free but n2: b takes back exactly the 2 GPUs a holds above its share, one on each of n0 and n1,
    its gang runs, and in the simulated minute that follows nothing is evicted again (a's
    re-created pods wait: a is at its fair share)."""
    import anyio

    from kai_es.adapters.memory_log import MemoryEventLog
    from kai_es.app.simulation import simulate
    from kai_es.events import payloads as p
    from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

    docs = [MakeNode(f"n{k}").gpus(8).obj() for k in range(3)] + [queue("a", gpu_quota=12), queue("b", gpu_quota=12)]
    docs += [MakePod(f"a-{i}", queue="a").gpu(1).priority_class("train").running_on(f"n{i % 3}").obj() for i in range(14)]
    docs.append(podgroup("big", 3, "b", priorityClassName="train"))
    docs += [MakePod(f"b-{i}", queue="b").gpu(4).group("big").annotate("kai-es.io/submit-after", "5s").obj()
             for i in range(3)]
    text = scenario_text(*docs, settings={"scheduler": {}, "simulation": {"until": "60s", "cyclePeriod": "1s"}})
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "fragmented.yaml"), log, load_packer("native")))
    envelopes = [r.envelope for r in log._records]  # noqa: SLF001 - the test reads the whole log
    evicted = [e.data for e in envelopes if isinstance(e.data, p.EvictionDecided)]
    assert sorted((d.name, d.node) for d in evicted) == [("a-12", "n0"), ("a-13", "n1")]
    assert len({e.logicaltime for e in envelopes if isinstance(e.data, p.EvictionDecided)}) == 1  # one cycle
    bound = {e.data.name for e in envelopes if isinstance(e.data, p.PodBound)}
    assert {"b-0", "b-1", "b-2"} <= bound and not any(name.startswith("a-") for name in bound)
