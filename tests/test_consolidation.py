"""Consolidation (policy kai-es/v4): each rule's scenario in tests/scenarios/consolidation-*.yaml
states what a cycle does; here each rule that keeps pods where they are is shown to be the
reason, by changing only that in the same cluster and seeing the move happen; the decision
stream says where a moved pod goes; and in the simulator the move completes (the replacement
lands where room was made, the waiting job runs) and is not undone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import payloads as p
from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import ConfigError, config_to_dict, parse_config
from kai_es.scheduling.packing import load_packer
from tests.builders import MakeNode, MakePod, queue, scenario_text

SCENARIOS = Path(__file__).parent / "scenarios"


def _docs(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((SCENARIOS / f"{name}.yaml").read_text()))


def _cycle(docs: list[dict[str, Any]], engine: str = "native") -> dict[str, Any]:
    text = yaml.safe_dump_all(docs, sort_keys=False)
    return one_cycle(load_scenario_text(text, "consolidation.yaml"), load_packer(engine))


def _status(outcome: dict[str, Any], pod: str) -> tuple[str, str | None]:
    got = outcome["pods"][f"default/{pod}"]
    return got["status"], got.get("node")


def _scheduler(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = docs[0].setdefault("spec", {})
    if not isinstance(spec.get("scheduler"), dict):
        spec["scheduler"] = {}
    scheduler: dict[str, Any] = spec["scheduler"]
    return scheduler


def _evictions(outcome: dict[str, Any]) -> list[dict[str, Any]]:
    return [d["data"] for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.evictiondecided"]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_the_eviction_says_where_the_pod_moves_and_the_move_is_no_placement(engine: str) -> None:
    outcome = _cycle(_docs("consolidation-basic"), engine)
    (moved,) = _evictions(outcome)
    assert moved["action"] == "consolidation" and moved["name"] == "b" and moved["preemptor"] == "default/big"
    # kai-es/v6: one decision with both nodes as fields; kai-es/v5 named the new node in the text
    assert moved["node"] == "n2" and moved["to_node"] == "n1"
    assert moved["reason"] == "moved to make room for default/big"
    assert moved["numbers"] == {"moved_jobs": 1, "moved_pods": 1, "requested_milli_gpu": 4000}
    old = _docs("consolidation-basic")
    _scheduler(old)["policyVersion"] = "kai-es/v5"
    (before,) = _evictions(_cycle(old, engine))
    assert before["reason"] == "moved from node n2 to node n1 to make room for default/big" and "to_node" not in before
    placed = [(d["type"], d["data"]["name"]) for d in outcome["decisions"]
              if d["type"] in ("kai.scheduler.pod.bindingdecided", "kai.scheduler.pod.pipelined")]
    assert placed == [("kai.scheduler.pod.pipelined", "big")]  # b's re-placement is not announced
    pipelined = next(d["data"] for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.pipelined")
    assert pipelined["waiting_for"] == ["default/b"]


def test_the_default_actions_of_v4_include_consolidation_and_v3_refuses_it() -> None:
    assert parse_config({}).action_list == ["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]
    assert "consolidation" not in parse_config({"policyVersion": "kai-es/v3"}).action_list
    with pytest.raises(ConfigError, match="consolidation is not implemented by policy kai-es/v3"):
        parse_config({"policyVersion": "kai-es/v3", "actions": ["allocate", "consolidation"]})
    docs = _docs("consolidation-basic")
    _scheduler(docs)["policyVersion"] = "kai-es/v3"
    assert _status(_cycle(docs), "big") == ("Pending", None)  # v3 decides as it always did


def test_the_move_budget_is_what_keeps_the_pods_in_place() -> None:
    docs = _docs("consolidation-budget")
    assert _status(_cycle(docs), "big") == ("Pending", None)
    _scheduler(docs)["maxConsolidationPreemptees"] = 2
    outcome = _cycle(docs)
    assert _status(outcome, "big")[0] == "Pipelined"
    assert len({e["podgroup"] for e in _evictions(outcome)}) == 2
    _scheduler(docs)["maxConsolidationPreemptees"] = -1  # no limit
    assert _status(_cycle(docs), "big")[0] == "Pipelined"
    _scheduler(docs)["maxConsolidationPreemptees"] = 0  # off
    assert _status(_cycle(docs), "big") == ("Pending", None)


def test_the_budget_is_validated_and_left_out_of_the_logged_config_at_its_default() -> None:
    with pytest.raises(ConfigError, match=r"must be >= -1 .* at `\$.maxConsolidationPreemptees`"):
        parse_config({"maxConsolidationPreemptees": -2})
    assert "maxConsolidationPreemptees" not in config_to_dict(parse_config({}))
    assert config_to_dict(parse_config({"maxConsolidationPreemptees": 3}))["maxConsolidationPreemptees"] == 3


def test_spread_is_what_turns_consolidation_off() -> None:
    docs = _docs("consolidation-off-with-spread")
    assert _status(_cycle(docs), "big") == ("Pending", None)
    _scheduler(docs)["placementStrategy"] = {"gpu": "binpack", "cpu": "spread"}
    assert _status(_cycle(docs), "big") == ("Pending", None)  # CPU spread turns it off too
    _scheduler(docs)["placementStrategy"] = {"gpu": "binpack"}
    assert _status(_cycle(docs), "big") == ("Pipelined", "n2")


def test_a_non_preemptible_job_does_not_consolidate_but_a_preemptible_one_does() -> None:
    docs = _docs("consolidation-nonpreemptible-preemptor")
    assert _status(_cycle(docs), "big") == ("Pending", None)
    big = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "big")
    big["spec"]["priorityClassName"] = "train"
    assert _status(_cycle(docs), "big")[0] == "Pipelined"


def test_moved_pods_need_room_now_elsewhere() -> None:
    docs = _docs("consolidation-moved-pods-need-room")
    assert _status(_cycle(docs), "big") == ("Pending", None)
    # one more free GPU on n1 (c gone): n1 lacks one GPU, and one of its pods fits n2's free GPU
    docs = [d for d in docs if d["metadata"]["name"] != "c"]
    outcome = _cycle(docs)
    assert _status(outcome, "big") == ("Pipelined", "n1")
    (moved,) = _evictions(outcome)
    assert moved["name"] in ("a", "b") and moved["to_node"] == "n2"


def _simulated(docs: list[dict[str, Any]]) -> list[Any]:
    docs[0]["spec"]["simulation"] = {"until": "60s", "cyclePeriod": "1s"}
    text = yaml.safe_dump_all(docs, sort_keys=False)
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "consolidation.yaml"), log, load_packer("native")))
    return [r.envelope for r in log._records]  # noqa: SLF001 - the test reads the whole log


def test_in_the_simulator_the_moved_pod_lands_where_room_was_made_and_nothing_moves_again() -> None:
    envelopes = _simulated(_docs("consolidation-basic"))
    evictions = [e.data for e in envelopes if isinstance(e.data, p.EvictionDecided)]
    assert [(e.name, e.action) for e in evictions] == [("b", "consolidation")]
    bound = {e.data.name: e.data.node for e in envelopes if isinstance(e.data, p.PodBound)}
    assert bound["big"] == "n2"
    replacement = [name for name in bound if name.startswith("b-r")]
    assert replacement and bound[replacement[0]] == "n1"  # the controller's new pod, where room was


def test_only_pods_that_can_move_are_taken() -> None:
    """The twin of consolidation-only-movable-pods: with room for w elsewhere (a free GPU more on
    n3: t3 gone), w — the cheapest victim — is what moves, and the pods of n2 stay."""
    docs = [d for d in _docs("consolidation-only-movable-pods") if d["metadata"]["name"] != "t3"]
    outcome = _cycle(docs)
    assert [e["name"] for e in _evictions(outcome)] == ["w"]
    assert _status(outcome, "big") == ("Pipelined", "n1")


def test_restoring_gangs_first_is_v4s_and_v3_keeps_the_queue_order() -> None:
    docs = _docs("restore-gangs-first")
    _scheduler(docs)["policyVersion"] = "kai-es/v3"
    outcome = _cycle(docs)
    assert _status(outcome, "x") == ("Binding", "n1") and _status(outcome, "g-1") == ("Pending", None)


def test_a_gang_moved_in_part_is_whole_again_in_the_simulator_and_never_stale() -> None:
    docs = _docs("consolidation-gang-moves-only-pods-in-the-way")
    envelopes = _simulated(docs)
    evictions = [(e.data.name, e.data.action) for e in envelopes if isinstance(e.data, p.EvictionDecided)]
    assert evictions == [("g-1", "consolidation")]  # no stale-gang eviction follows
    bound = {e.data.name: e.data.node for e in envelopes if isinstance(e.data, p.PodBound)}
    assert bound["big"] == "n2" and bound["g-1-r1"] == "n1"


def test_jobs_running_before_the_log_began_did_not_wait(tmp_path: Path) -> None:
    """The report (and what-if's per-job waits) counts a job first seen running as started then:
    in the consolidation example the notebooks ran all along, only the training job waited."""
    from kai_es.adapters.file_log import FileEventLog
    from kai_es.report import summarize

    golden = Path(__file__).parent / "golden" / "consolidation.events.jsonl"
    summary = summarize(FileEventLog(golden, readonly=True).scan())
    train = next(job for key, job in summary.jobs.items() if "train-8gpu" in key)
    assert train.started_ns is not None and train.started_ns - train.arrived_ns == 5 * 10**9
    notebooks = [job for key, job in summary.jobs.items() if "notebook" in key and "-r1" not in key]
    assert len(notebooks) == 15 and all(job.started_ns == job.arrived_ns for job in notebooks)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_preempt_moves_the_victims_that_fit_elsewhere_and_v3_evicts_them_all(engine: str) -> None:
    docs = _docs("preempt-moves-victims-that-fit-elsewhere")
    moved = {e["name"]: e for e in _evictions(_cycle(docs, engine))}
    assert sorted(moved) == ["t-0", "t-1", "t-2", "t-3"] and all(e["action"] == "preempt" for e in moved.values())
    # kai-es/v6 re-places the victims in job order (KAI's): the two oldest get n2's two free GPUs
    assert [name for name, e in sorted(moved.items()) if e.get("to_node") == "n2"
            and e["reason"].startswith("preempted in queue q")] == ["t-0", "t-1"]
    _scheduler(docs)["policyVersion"] = "kai-es/v5"  # the move said in the reason's text
    moved = {e["name"]: e for e in _evictions(_cycle(docs, engine))}
    assert [name for name, e in sorted(moved.items()) if e["reason"].startswith("moved from node n1 to node n2 instead "
                                                                                  "of evicted: preempted in queue q")] \
        == ["t-2", "t-3"]  # kai-es/v5: the newest two (cheapest, evicted first)
    _scheduler(docs)["policyVersion"] = "kai-es/v3"
    assert not any(e["reason"].startswith("moved") for e in _evictions(_cycle(docs, engine)))


def test_kai_es_events_shows_where_a_moved_pod_goes() -> None:
    import subprocess
    import sys

    golden = Path(__file__).parent / "golden" / "consolidation.events.jsonl"
    run = subprocess.run([sys.executable, "-m", "kai_es", "events", str(golden), "--type",
                          "kai.scheduler.pod.evictiondecided"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    # kai-es/v6: a move is one decision, shown with both nodes (v5's log said it in the reason);
    # kai-es/v9: of the three nodes alike, the one of the newest notebooks (KAI's victim order)
    assert len(lines) == 5 and all("consolidation: moves node-c -> node-" in line for line in lines)
    history = golden.parent / "history" / "consolidation.policy-v5-schema-v4.events.jsonl"
    run = subprocess.run([sys.executable, "-m", "kai_es", "events", str(history), "--type",
                          "kai.scheduler.pod.evictiondecided"], capture_output=True, text=True)
    assert all("consolidation: moved from node node-a to node node-" in line for line in run.stdout.splitlines())
    run = subprocess.run([sys.executable, "-m", "kai_es", "events", str(golden), "--type",
                          "kai.scheduler.cycle.completed"], capture_output=True, text=True)
    assert "5 evicted" in run.stdout



def _victim_order() -> str:
    """n1: a priority-10 and a `train` one-GPU pod that may move, a `build` one that may not; n2:
    three GPUs of `build`, one idle; a two-GPU `train` job waits."""
    low = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "low"}, "value": 10}
    return scenario_text(
        low, MakeNode("n1").gpus(4).obj(), MakeNode("n2").gpus(4).obj(), queue("q"),
        MakePod("hi", queue="q").priority_class("train").gpu(1).running_on("n1").obj(),
        MakePod("lo", queue="q").priority_class("low").gpu(1).running_on("n1").obj(),
        MakePod("fixed", queue="q").priority_class("build").gpu(1).running_on("n1").obj(),
        MakePod("fixed2", queue="q").priority_class("build").gpu(3).running_on("n2").obj(),
        MakePod("big", queue="q").priority_class("train").gpu(2).obj())


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_of_two_pods_either_of_which_makes_room_the_cheaper_victim_moves(engine: str) -> None:
    """KAI's victim order within a node: n1 holds a priority-10 and a `train` (50) one-GPU pod and
    a `build` one that cannot move; a two-GPU job waits and n2 has one GPU idle. Moving either
    movable pod to n2 makes room on n1: the lower-priority one is taken, the other stays."""
    outcome = one_cycle(load_scenario_text(_victim_order(), "consolidation-victim-order.yaml"), load_packer(engine))
    (moved,) = _evictions(outcome)
    assert (moved["action"], moved["name"], moved["node"], moved["to_node"]) == ("consolidation", "lo", "n1", "n2")
    assert _status(outcome, "hi") == ("Running", "n1")
    assert _status(outcome, "big") == ("Pipelined", "n1")
