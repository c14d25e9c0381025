"""`kai-es whatif` and the run report's new sections, end to end through the CLI on small
simulated scenarios built like examples/cluster-day.yaml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.report import summarize

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=ROOT, capture_output=True, text=True)


def _header(name: str, scheduler: str = "{}", until: str = "idle") -> str:
    return f"""apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {{name: {name}}}
spec:
  start: '2026-01-05T00:00:00Z'
  scheduler: {scheduler}
  simulation: {{until: {until}, cyclePeriod: 5s}}
"""


def _node(name: str, gpus: int = 8) -> str:
    return f"""---
apiVersion: v1
kind: Node
metadata: {{name: {name}}}
status: {{allocatable: {{cpu: '128', memory: 1024Gi, nvidia.com/gpu: '{gpus}', pods: '110'}}}}
"""


def _queue(name: str, quota: int, parent: str = "") -> str:
    parent_line = f", parentQueue: {parent}" if parent else ""
    return f"""---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {{name: {name}}}
spec: {{resources: {{gpu: {{quota: {quota}, overQuotaWeight: 1}}}}{parent_line}}}
"""


def _pod(name: str, queue: str, gpus: int, submit: str, run_for: str | None, extra_spec: str = "",
         priority: str = "train") -> str:
    run = f", kai-es.io/run-for: {run_for}" if run_for else ""
    return f"""---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{kai.scheduler/queue: {queue}}}
  annotations: {{kai-es.io/submit-after: {submit}{run}}}
spec:
  schedulerName: kai-scheduler
  priorityClassName: {priority}
  {extra_spec}
  containers: [{{name: c, resources: {{requests: {{cpu: '4', memory: 16Gi, nvidia.com/gpu: '{gpus}'}}}}}}]
"""


def _gang(name: str, queue: str, gpus: int, workers: int, submit: str, run_for: str) -> str:
    return f"""---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
  labels: {{kai.scheduler/queue: {queue}}}
  annotations: {{kai-es.io/submit-after: {submit}, kai-es.io/run-for: {run_for}}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          schedulerName: kai-scheduler
          containers: [{{name: pytorch, resources: {{requests: {{cpu: '8', memory: 64Gi, nvidia.com/gpu: '{gpus}'}}}}}}]
    Worker:
      replicas: {workers}
      template:
        spec:
          schedulerName: kai-scheduler
          containers: [{{name: pytorch, resources: {{requests: {{cpu: '8', memory: 64Gi, nvidia.com/gpu: '{gpus}'}}}}}}]
"""


def _simulate(tmp_path: Path, name: str, text: str) -> Path:
    scenario = tmp_path / f"{name}.yaml"
    scenario.write_text(text)
    log = tmp_path / f"{name}.events.jsonl"
    run = _cli("simulate", str(scenario), "--log", str(log), "--report", str(tmp_path / f"{name}-report"))
    assert run.returncode == 0, run.stderr
    return log


def _whatif(tmp_path: Path, log: Path, tag: str, *changes: str) -> tuple[dict, subprocess.CompletedProcess[str]]:  # type: ignore[type-arg]
    run = _cli("whatif", str(log), "--log", str(tmp_path / f"{tag}.events.jsonl"),
               "--report", str(tmp_path / f"{tag}-report"), "--force", "--output", "json", *changes)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), run


def _contended() -> str:
    """Two leaf queues under one parent on one 8-GPU node, both asking for the whole node at
    once; reclaim on, so a queue's quota makes room by evicting the other's preemptible pods."""
    text = _header("contended", "{actions: [allocate, reclaim, preempt]}") + _node("gpu-0")
    text += _queue("org", -1) + _queue("a", 4, "org") + _queue("b", 4, "org")
    for i in range(8):
        text += _pod(f"a-{i}", "a", 1, f"{i}s", "40m")
    for i in range(8):
        text += _pod(f"b-{i}", "b", 1, f"{10 + i}s", "30m")
    return text


def _decisions(log: Path) -> list[tuple[object, ...]]:
    """Every scheduler and binder event of a log as plain data, without the ids a re-run draws
    afresh (event ids, the decision ids binder outcomes name, state digests)."""
    out = []
    for record in FileEventLog(log, readonly=True).scan():
        env = record.envelope
        if env.type.startswith(("kai.scheduler.", "kai.binder.")) and env.type != "kai.scheduler.config.applied":
            data = msgspec.to_builtins(env.data)
            data.pop("decision_id", None)
            out.append((record.position, env.type, env.subject, env.logicaltime, env.basedon, env.policyversion, data))
    return out


def test_whatif_with_the_recorded_config_reproduces_the_recorded_decisions(tmp_path: Path) -> None:
    text = _header("mixed", "{actions: [allocate, reclaim, preempt]}") + _node("gpu-0") + _node("gpu-1")
    text += _queue("research", 8) + _queue("product", 8)
    for i in range(12):
        text += _pod(f"r-{i}", "research", 1 + i % 2, f"{i * 7}s", f"{20 + 3 * i}m")
    text += _gang("train-0", "research", 4, 1, "2m", "45m")
    for i in range(6):
        text += _pod(f"p-{i}", "product", 2, f"{600 + i * 30}s", "25m", priority="train")
    log = _simulate(tmp_path, "mixed", text)
    recorded = summarize(FileEventLog(log, readonly=True).scan())
    assert recorded.evictions > 0  # reclaim evicted and the cluster recreated pods: that path is replayed too

    doc, _ = _whatif(tmp_path, log, "same")

    assert doc["identicalDecisions"] is True
    assert doc["runs"]["recorded"]["decisionDigest"] == doc["runs"]["counterfactual"]["decisionDigest"]
    assert doc["runs"]["recorded"]["decisions"] == doc["runs"]["counterfactual"]["decisions"] > 50
    # independently of the comparison code: the two logs' decisions, event by event
    recorded_decisions = _decisions(log)
    assert len(recorded_decisions) > 50
    assert recorded_decisions == _decisions(tmp_path / "same.events.jsonl")
    assert doc["jobsChangedMost"] == []
    # the counterfactual's own log replays exactly
    replay = _cli("replay", str(tmp_path / "same.events.jsonl"), "--jobs", "1")
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.startswith("OK:")


def test_whatif_with_more_quota_for_one_queue_shortens_its_waits(tmp_path: Path) -> None:
    log = _simulate(tmp_path, "contended", _contended())
    base, _ = _whatif(tmp_path, log, "base")
    more, run = _whatif(tmp_path, log, "more", "--set", "queue.b.gpu.quota=8", "--set", "queue.a.gpu.quota=0")

    assert base["identicalDecisions"] and not more["identicalDecisions"]
    # the simulator's own log: a re-run of the recorded settings makes the recorded decisions, so
    # the counterfactual is compared with the record itself
    assert "rerun" not in base["runs"] and base["comparedWith"] == "recorded"
    assert more["comparedWith"] == "recorded"
    assert more["runs"]["rerun"]["decisionDigest"] == more["runs"]["recorded"]["decisionDigest"]
    b_rec, b_cf = more["queues"]["b"]["recorded"], more["queues"]["b"]["counterfactual"]
    assert b_cf["waitP95Ns"] < b_rec["waitP95Ns"]
    assert b_cf["waitMaxNs"] < b_rec["waitMaxNs"]
    assert b_rec == base["queues"]["b"]["recorded"] == base["queues"]["b"]["counterfactual"]
    assert more["changes"] == ["set queue.b.gpu.quota=8", "set queue.a.gpu.quota=0"]
    assert any(j["queue"] == "b" and j["deltaNs"] < 0 for j in more["jobsChangedMost"])
    for plot in ("allocation.png", "waits.png"):
        assert (tmp_path / "more-report" / plot).stat().st_size > 10_000
    assert json.loads((tmp_path / "more-report" / "whatif.json").read_text()) == more
    recorded_only, _ = _whatif(tmp_path, log, "more-recorded", "--set", "queue.b.gpu.quota=8", "--set",
                               "queue.a.gpu.quota=0", "--compare-with", "recorded")
    assert "rerun" not in recorded_only["runs"]  # no re-run: the same comparison, half the work
    assert recorded_only["queues"] == {q: {k: v for k, v in e.items() if k != "rerun"}
                                       for q, e in more["queues"].items()}
    assert recorded_only["jobsChangedMost"] == more["jobsChangedMost"]


def test_whatif_is_deterministic_and_its_text_output_compares_side_by_side(tmp_path: Path) -> None:
    log = _simulate(tmp_path, "contended", _contended())
    outs = []
    for tag in ("one", "two"):
        run = _cli("whatif", str(log), "--log", str(tmp_path / f"{tag}.events.jsonl"), "--report",
                   str(tmp_path / "rep"), "--force", "--output", "json", "--set", "scheduler.placementStrategy.gpu=spread",
                   "--set", "queue.b.gpu.quota=6")
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    assert outs[0] == outs[1]
    assert (tmp_path / "one.events.jsonl").read_bytes() == (tmp_path / "two.events.jsonl").read_bytes()
    text = _cli("whatif", str(log), "--log", str(tmp_path / "t.events.jsonl"), "--report", str(tmp_path / "t"),
                "--set", "queue.b.gpu.quota=8", "--set", "queue.a.gpu.quota=0")
    assert text.returncode == 0, text.stderr
    assert "recorded -> counterfactual" in text.stdout and "jobs whose wait changed most" in text.stdout
    # the count of the counterfactual's records is said after the last records were let go
    written = sum(1 for _ in FileEventLog(tmp_path / "t.events.jsonl", readonly=True).scan())
    assert written > 0 and f"({written} events;" in " ".join(text.stdout.split())


@pytest.mark.parametrize("change, message", [
    ("queue.nope.gpu.quota=3", "the log has no queue 'nope'"),
    ("scheduler.actions=[allocate, teleport]", "scheduler config"),
    ("nodes.remove=gpu-9", "the log has no node 'gpu-9'"),
    ("frobnicate=1", "unknown key"),
    ("queue.a.gpu.quota=-5", "must be -1 (unlimited) or >= 0"),
])
def test_whatif_rejects_a_change_it_cannot_apply_in_one_line(tmp_path: Path, change: str, message: str) -> None:
    log = _simulate(tmp_path, "contended", _contended())
    run = _cli("whatif", str(log), "--log", str(tmp_path / "x.events.jsonl"), "--report", str(tmp_path / "x"),
               "--set", change)
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_whatif_scenario_patch_adds_nodes(tmp_path: Path) -> None:
    log = _simulate(tmp_path, "contended", _contended())
    patch = tmp_path / "patch.yaml"
    patch.write_text(_node("gpu-extra").removeprefix("---\n"))
    doc, _ = _whatif(tmp_path, log, "bigger", "--scenario-patch", str(patch))
    rec, cf = doc["runs"]["recorded"], doc["runs"]["counterfactual"]
    # with twice the GPUs nobody waits for capacity: every queue's longest wait shrinks
    for q in ("a", "b"):
        assert doc["queues"][q]["counterfactual"]["waitMaxNs"] < doc["queues"][q]["recorded"]["waitMaxNs"]
    assert cf["evictions"] == 0 < rec["evictions"]


def _fragmented() -> str:
    """Like the end of the cluster day: four 8-GPU nodes each keep one long 1-GPU pod, and two
    training gangs (a master and a worker of 8 GPUs each) need two whole free nodes at once."""
    text = _header("fragmented", until="2h") + "".join(_node(f"gpu-{i}") for i in range(4))
    text += _queue("research", -1)
    for i in range(4):
        text += _pod(f"hold-{i}", "research", 1, "0s", None,
                     extra_spec=f"nodeSelector: {{kubernetes.io/hostname: gpu-{i}}}")
    text += _gang("train-a", "research", 8, 1, "60s", "1h")
    text += _gang("train-b", "research", 8, 1, "90s", "1h")
    return text


def test_report_names_fragmentation_as_the_cause_of_idle_gpus(tmp_path: Path) -> None:
    scenario = tmp_path / "fragmented.yaml"
    scenario.write_text(_fragmented())
    run = _cli("simulate", str(scenario), "--log", str(tmp_path / "f.jsonl"), "--report", str(tmp_path / "rep"))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "simulated 2h (time limit)" in out
    assert "at the end: 28 of 32 GPUs idle, 4 pods pending (4 need GPUs)" in out
    assert ("fragmentation: 28 of 28 idle GPUs cannot be used by any waiting pod: 4 pods need 8 whole GPUs on one "
            "node in gangs that must place 2 pods at once, and the free GPUs fit only 0 such pods") in out
    assert "whole free GPUs by node: 4 nodes with 7 free" in out
    assert "waits include 4 pod(s) that never ran" in out
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    frag = summary["fragmentation"]
    assert (frag["idleMilliGpu"], frag["strandedMilliGpu"], frag["pendingGpuPods"]) == (28_000, 28_000, 4)
    assert frag["shapes"] == [{"wholeGpus": 8, "milliGpu": 0, "pods": 4, "jobs": 2, "minGang": 2, "maxGang": 2,
                               "fitting": 0, "slots": 0}]
    assert frag["nodesByWholeFreeGpus"] == {"7": 4}
    assert summary["queues"]["research"]["waitsCensored"] == 4
    # never-run waits count from arrival to the end: the gang submitted at 60s waited 2h - 60s
    assert summary["queues"]["research"]["waitMaxNs"] == (7200 - 60) * 10**9
    # stranded for the whole run after the gangs arrived (sampled at each cycle)
    assert summary["strandedGpuMilliNs"] >= 28_000 * (7200 - 90) * 10**9
    assert (tmp_path / "rep" / "fair-share.png").stat().st_size > 10_000


def test_report_fair_share_per_queue_over_time_rolls_up_parents(tmp_path: Path) -> None:
    log = _simulate(tmp_path, "contended", _contended())
    summary = json.loads((tmp_path / "contended-report" / "summary.json").read_text())
    queues = summary["queues"]
    for leaf in ("a", "b"):
        steps = queues[leaf]["gpu"]
        assert steps["fairShare"] and steps["quota"][0][1] == 4000
        # the queues ask for more than the node: each one's fair share is half of it at some cut
        assert 4000 in [v for _, v in steps["fairShare"]]
    alloc = dict(queues["org"]["gpu"]["allocated"])
    assert max(alloc.values()) == 8000  # the parent's allocation is its leaves' sum
    assert queues["org"]["pendingAtEnd"] == queues["a"]["pendingAtEnd"] + queues["b"]["pendingAtEnd"]
    s = summarize(FileEventLog(log, readonly=True).scan())
    assert s.fair_error_milli_ns > 0 and s.cycles > 0


def test_a_sweep_runs_each_value_as_its_own_whatif_and_tabulates_them(tmp_path: Path) -> None:
    """`--sweep queue.b.gpu.quota=0,4,8` on top of `--set queue.a.gpu.quota=0`: each value's entry
    is exactly the document of `whatif --set` with that value, the runs are in parallel
    processes, and the text table has a row per value with queue b's waits."""
    log = _simulate(tmp_path, "contended", _contended())
    sweep = _cli("whatif", str(log), "--set", "queue.a.gpu.quota=0", "--sweep", "queue.b.gpu.quota=0,4,8",
                 "--jobs", "2", "--output", "json")
    assert sweep.returncode == 0, sweep.stderr
    doc = json.loads(sweep.stdout)
    assert doc["sweep"] == "queue.b.gpu.quota" and doc["values"] == ["0", "4", "8"]
    for value, entry in zip(doc["values"], doc["whatifs"], strict=True):
        single, _ = _whatif(tmp_path, log, f"b{value}", "--set", "queue.a.gpu.quota=0", "--set",
                            f"queue.b.gpu.quota={value}")
        assert entry == single, value
    waits = [e["queues"]["b"]["counterfactual"]["waitP95Ns"] for e in doc["whatifs"]]
    assert waits[2] < waits[0]  # more quota for b, shorter waits in b
    text = _cli("whatif", str(log), "--sweep", "queue.b.gpu.quota=[0, 8]")
    assert text.returncode == 0, text.stderr
    rows = [line for line in text.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 3 and rows[0].startswith("│ (recorded)"), text.stdout
    assert "b wait p95" in text.stdout.replace("\n", " ") or "b wait" in text.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--sweep", "queue.b.gpu.quota"], "expected KEY=V1,V2"),
    (["--sweep", "queue.b.gpu.quota=1,,2"], "an empty value"),
    (["--sweep", "queue.b.gpu.quota=1,1"], "given twice"),
    (["--sweep", "queue.b.gpu.quota=[1"], "not a YAML list"),
    (["--sweep", "queue.nope.gpu.quota=1,2"], "nope"),
    (["--sweep", "queue.b.gpu.quota=1,2", "--log", "x.jsonl"], "writes no log or report"),
    (["--jobs", "2"], "needs --sweep"),
])
def test_a_wrong_sweep_is_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    log = _simulate(tmp_path, "contended", _contended())
    run = _cli("whatif", str(log), *args)
    assert run.returncode != 0 and message in run.stderr, run.stderr
