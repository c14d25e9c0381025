"""`kai-es explain` on the golden log and on simulated logs of scenarios written the way users
write them (tests/data/explain/): each names the rule that held a pod back and its numbers,
and the queue's numbers at the cut, derived here by hand from the scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import payloads as p
from kai_es.explain import ExplainError, explain, explain_queue, render_text
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from kai_es.app.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "explain"
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("limit", "quota", "gang", "no-fit"):
        path = tmp_path_factory.mktemp("explain") / f"{name}.log"
        scenario = load_scenario(DATA / f"held-by-{name}.yaml")
        anyio.run(lambda: simulate(scenario, FileEventLog(path), load_packer("native")))
        out[name] = path
    return out


def _explain(path: Path, target: str) -> dict[str, Any]:
    return explain(FileEventLog(path, readonly=True).scan(), target)


def _waits(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in report["timeline"] if e["kind"] == "wait"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=ROOT, capture_output=True, text=True)


def test_held_by_the_queue_limit(logs: dict[str, Path]) -> None:
    report = _explain(logs["limit"], "default/second")
    [wait] = _waits(report)
    [verdict] = wait["verdicts"]
    assert verdict["rule"] == "QueueLimit"
    assert verdict["reasons"][0]["numbers"] == {"requested": 2000, "allocated": 3000, "limit": 4000}
    # one queue on 8 GPUs: quota 2, limit 4; it asks 3 (running) + 2 (pending), capped at the
    # limit: its fair share is 4 GPUs, of which `first` holds 3
    gpu = wait["queueAtFirst"]["gpu"]
    assert (gpu["allocated"], gpu["fairShare"], gpu["quota"], gpu["limit"], gpu["pending"]) == (
        3000, 4000, 2000, 4000, 2000)
    kinds = [e["kind"] for e in report["timeline"]]
    assert kinds == ["observed", "wait", "bindingDecided", "bound", "phase", "phase"]
    assert "held by its queue's limit" in "\n".join(render_text(report))


def test_held_by_quota_as_a_non_preemptible_job(logs: dict[str, Path]) -> None:
    report = _explain(logs["quota"], "default/serve")
    [wait] = _waits(report)
    [verdict] = wait["verdicts"]
    assert verdict["rule"] == "NonPreemptibleOverQuota"
    assert verdict["reasons"][0]["numbers"] == {"requested": 3000, "allocated": 0, "quota": 2000}
    # `train` (4 GPUs, preemptible) runs; the queue asks 4 + 3 of 8 GPUs: fair share 7
    gpu = wait["queueAtFirst"]["gpu"]
    assert (gpu["allocated"], gpu["fairShare"], gpu["quota"], gpu["pending"]) == (4000, 7000, 2000, 3000)
    # it never runs: the timeline ends saying so
    assert report["timeline"][-1]["kind"] == "atEnd" and report["timeline"][-1]["status"] == "Pending"


def test_held_by_its_gang(logs: dict[str, Path]) -> None:
    report = _explain(logs["gang"], "default/llm")  # the PyTorchJob, by its name
    assert report["subject"]["kind"] == "job"
    assert report["subject"]["pods"] == ["default/llm-master-0", "default/llm-worker-0", "default/llm-worker-1"]
    # kai-es/v6: preempt's reason alternates as the CPU-only pods come and go (with them it has
    # victims to try, without them none), so the wait is told in several stretches, all the gang's
    waits = _waits(report)
    assert waits and all([v["rule"] for v in w["verdicts"]] == ["GangUnsatisfied"] for w in waits)
    wait = waits[0]
    [verdict] = wait["verdicts"]
    assert len(verdict["pods"]) == 3
    gang, no_fit, *refused = verdict["reasons"]
    assert gang["numbers"] == {"min_member": 3, "needed": 3, "fit": 2}
    # kai-es/v6: each action that tried the gang and could not help says why, by name
    assert [r["code"] for r in refused] == ["ConsolidationNotPossible", "ReclaimNotPossible", "PreemptNotPossible"]
    assert all(r["message"].startswith(("consolidation: ", "reclaim: ", "preempt: ")) for r in refused)
    # node-a is held whole by `batch`; node-b takes two 4-GPU pods; the third fits nowhere
    assert no_fit["code"] == "NoNodeFits" and no_fit["numbers"] == {"nodes": 2, "insufficient_gpu": 2}
    gpu = wait["queueAtFirst"]["gpu"]
    assert (gpu["allocated"], gpu["fairShare"], gpu["pending"]) == (8000, 16000, 12000)
    binds = [e for e in report["timeline"] if e["kind"] == "bindingDecided"]
    assert len(binds) == 3 and binds[0]["position"] > waits[-1]["until"]["position"]


def test_held_because_no_node_fits(logs: dict[str, Path]) -> None:
    report = _explain(logs["no-fit"], "pod/default/want")
    [wait] = _waits(report)
    [verdict] = wait["verdicts"]
    assert verdict["rule"] == "NoNodeFits"
    # node-b is tainted (not tolerated), node-a has 2 idle GPUs of 8
    assert verdict["reasons"][0]["numbers"] == {"nodes": 2, "not_eligible": 1, "insufficient_gpu": 1}
    gpu = wait["queueAtFirst"]["gpu"]
    assert (gpu["allocated"], gpu["fairShare"], gpu["pending"]) == (6000, 10000, 4000)


def _completed_cycles_between(path: Path, after: int, before: int) -> int:
    """Completed cycles whose cut lies in (after, before), counted from the raw log."""
    started: set[int] = set()
    completed = 0
    for record in FileEventLog(path, readonly=True).scan():
        data = record.envelope.data
        if isinstance(data, p.CycleStarted) and after < record.position < before:
            started.add(record.position)
        if isinstance(data, p.CycleCompleted) and record.envelope.basedon in started:
            completed += 1
    return completed


def test_unchanged_verdicts_are_collapsed_into_one_entry(logs: dict[str, Path]) -> None:
    path = logs["limit"]
    report = _explain(path, "default/second")
    observed = next(e for e in report["timeline"] if e["kind"] == "observed")
    bind = next(e for e in report["timeline"] if e["kind"] == "bindingDecided")
    waited = _completed_cycles_between(path, observed["position"], bind["cycleCut"])
    recorded = [r for r in FileEventLog(path, readonly=True).scan()
                if isinstance(r.envelope.data, p.PodUnschedulable) and r.envelope.data.name == "second"]
    assert len(recorded) == 1  # the log states the verdict once ...
    assert waited > 5  # ... while the pod waited through many cycles
    waits = _waits(report)
    assert len(waits) == 1 and waits[0]["cycles"] == waited
    assert waits[0]["verdicts"][0]["recorded"] is True
    text = [line for line in render_text(report) if "pending for" in line]
    assert len(text) == 1 and f"pending for {waited} cycle(s)" in text[0]


def test_golden_log_pod_that_waited_for_gpus() -> None:
    # kai-es/v6: team-b (1 of its 5 GPU fair share) reclaims for finetune-1 the moment it arrives;
    # it is pipelined onto what train-llm-0 releases and bound a cycle later
    report = explain(FileEventLog(GOLDEN, readonly=True).scan(), "default/finetune-1")
    [wait] = _waits(report)
    [verdict] = wait["verdicts"]
    assert wait["cycles"] == 1 and verdict["status"] == "Pipelined" and verdict["node"] == "node-a"
    assert verdict["waitingFor"] == ["default/train-llm-0"]
    assert (wait["queueAtFirst"]["gpu"]["allocated"], wait["queueAtFirst"]["gpu"]["fairShare"]) == (1000, 5000)
    assert [e["kind"] for e in report["timeline"]] == [
        "observed", "wait", "bindingDecided", "bound", "phase", "phase"]
    assert report["subject"]["queues"] == ["team-b"]
    # the gang it displaced waits, re-created, held by its gang until GPUs free up
    report = explain(FileEventLog(GOLDEN, readonly=True).scan(), "default/train-llm-0-r1")
    waits = _waits(report)
    assert waits and all(w["verdicts"][0]["rule"] == "GangUnsatisfied" for w in waits)
    assert waits[0]["verdicts"][0]["reasons"][1]["numbers"] == {"nodes": 2, "insufficient_gpu": 2}


def test_queue_explain_collapses_equal_cuts(logs: dict[str, Path]) -> None:
    path = logs["limit"]
    report = explain_queue(FileEventLog(path, readonly=True).scan(), "team-a")
    runs = report["runs"]
    assert sum(r["cycles"] for r in runs) == _completed_cycles_between(path, -1, 10**9)
    assert all(a["numbers"] != b["numbers"] for a, b in zip(runs, runs[1:]))
    golden = explain_queue(FileEventLog(GOLDEN, readonly=True).scan(), "team-b")["runs"]
    assert golden[-1]["cycles"] == 2 and golden[-1]["numbers"]["gpu"]["allocated"] == 0
    assert sum(r["cycles"] for r in golden) == _completed_cycles_between(GOLDEN, -1, 10**9)
    peak = max(r["numbers"]["gpu"]["allocated"] for r in runs)
    assert peak == 3000  # the limit (4) never let `second` join `first`
    with pytest.raises(ExplainError, match="never observed a queue"):
        explain_queue(FileEventLog(path, readonly=True).scan(), "nope")


def test_cli_json_is_the_same_data_and_errors_are_one_line(logs: dict[str, Path]) -> None:
    run = _cli("explain", str(logs["gang"]), "default/llm", "-o", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == _explain(logs["gang"], "default/llm")
    text = _cli("explain", str(logs["gang"]), "default/llm")
    assert text.returncode == 0 and "held by its gang" in text.stdout
    queue = _cli("explain", str(logs["gang"]), "--queue", "team-a", "-o", "json")
    assert queue.returncode == 0 and json.loads(queue.stdout)["queue"] == "team-a"
    missing = _cli("explain", str(logs["gang"]), "default/nope")
    assert missing.returncode == 2 and "no pod or job 'default/nope'" in missing.stderr
    assert "Traceback" not in missing.stderr and missing.stderr.strip().count("\n") == 0
    neither = _cli("explain", str(logs["gang"]))
    assert neither.returncode == 2 and "--queue" in neither.stderr


def test_evicted_by_whom_and_why_and_the_preemptor_pipelined(tmp_path: Path) -> None:
    path = tmp_path / "reclaim.log"
    scenario = load_scenario(ROOT / "tests" / "scenarios" / "reclaim-basic.yaml")
    anyio.run(lambda: simulate(scenario, FileEventLog(path), load_packer("native")))
    victim = _explain(path, "default/b-7")
    assert [e["kind"] for e in victim["timeline"]] == ["observed", "evictionDecided", "evicted", "removed"]
    evicted = victim["timeline"][1]
    assert (evicted["action"], evicted["preemptor"]) == ("reclaim", "default/a")
    # team-b holds all 8 GPUs against a fair share of 6; team-a, owed 2, holds none
    assert {k: evicted["numbers"][k] for k in ("victim_queue_allocated_milli_gpu", "victim_queue_fair_milli_gpu",
                                               "reclaimer_queue_allocated_milli_gpu", "requested_milli_gpu")} == {
        "victim_queue_allocated_milli_gpu": 8000, "victim_queue_fair_milli_gpu": 6000,
        "reclaimer_queue_allocated_milli_gpu": 0, "requested_milli_gpu": 2000}
    assert "evicted by reclaim to make room for default/a" in "\n".join(render_text(victim))
    job = _explain(path, "default/a")
    [wait] = _waits(job)
    [verdict] = wait["verdicts"]
    assert verdict["status"] == "Pipelined" and verdict["waitingFor"] == ["default/b-6", "default/b-7"]
    assert len(verdict["pods"]) == 2
    assert sum(e["kind"] == "bound" for e in job["timeline"]) == 2


def test_held_by_its_topology_constraint_then_placed_in_one_rack(tmp_path: Path) -> None:
    """examples/topology.yaml (kai-es/v5): `wide` waits while no rack holds 16 free GPUs, and
    explain names the rule and the level; every gang is bound inside one rack."""
    path = tmp_path / "topology.log"
    scenario = load_scenario(ROOT / "examples" / "topology.yaml")
    anyio.run(lambda: simulate(scenario, FileEventLog(path), load_packer("native")))
    report = _explain(path, "default/wide")
    [wait] = _waits(report)
    [verdict] = wait["verdicts"]
    assert verdict["rule"] == "TopologyUnsatisfied"
    topology = verdict["reasons"][1]
    assert topology["code"] == "TopologyUnsatisfied"
    assert "level 'cloud.provider.com/topology-rack'" in topology["message"]
    assert topology["numbers"] == {"domains": 3, "too_small": 3, "tried": 0, "unlabelled_nodes": 0, "pods": 2}
    assert "held by its topology constraint" in "\n".join(render_text(report))
    rack_of = {o.payload.name: o.payload.labels["cloud.provider.com/topology-rack"]
               for o in scenario.objects if isinstance(o.payload, p.NodeObserved)}
    bound: dict[str, set[str]] = {}
    for record in FileEventLog(path, readonly=True).scan():
        data = record.envelope.data
        if isinstance(data, p.BindingDecided):
            bound.setdefault(data.name.rsplit("-", 1)[0], set()).add(rack_of[data.node])
    assert bound == {"pretrain": {"a1"}, "finetune": {"b1"}, "wide": {"a1"}}
    from kai_es.replay import replay

    for engine in ("native", "reference"):  # a kai-es/v5 log replays byte for byte on both packers
        result = replay(list(FileEventLog(path, readonly=True).scan()), load_packer(engine))  # type: ignore[arg-type]
        assert result.ok and result.cycles > 0, result.divergence
