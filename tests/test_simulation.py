"""End to end on the embedded defaults: simulate -> log -> replay; determinism; golden logs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zlib
from array import array
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling.packing import Placement, Strategy, TaskShape, load_packer
from kai_es.scheduling.packing.model import PackTable
from kai_es.scheduling.policy import CURRENT_POLICY
from kai_es.scheduling.tables import build_tables, tables
from kai_es.app.simulation import simulate
from kai_es.state import ClusterState, fold
from kai_es.state.invariants import check
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=ROOT, capture_output=True, text=True)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_simulate_twice_gives_identical_bytes(tmp_path: Path) -> None:
    for i in (1, 2):
        run = _cli("simulate", "examples/quickstart.yaml", "--log", str(tmp_path / f"{i}.log"),
                   "--report", str(tmp_path / f"r{i}"))
        assert run.returncode == 0, run.stderr
    assert _sha(tmp_path / "1.log") == _sha(tmp_path / "2.log")
    # kai-es/v6: team-b's finetune reclaims the 3-pod gang at t+10m; its three pods are re-created
    # (as the Job controller would) and scheduled again: 10 pods in all
    assert "10/10 pods scheduled" in run.stdout
    assert (tmp_path / "r2" / "gpu-allocation.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "r2" / "summary.json").read_text())
    queues = summary["queues"]
    # leaves: team-a ran the 3-pod gang twice (reclaimed once), team-b 2 inference pods and 2
    # fine-tune pods; the parent 'research' rolls both up
    assert (queues["team-a"]["scheduled"], queues["team-b"]["scheduled"]) == (6, 4)
    assert queues["research"]["scheduled"] == 10 and queues["team-a"]["parent"] == "research"
    assert queues["research"]["gpuMilliNs"] == queues["team-a"]["gpuMilliNs"] + queues["team-b"]["gpuMilliNs"]


def test_native_and_reference_packers_write_the_same_log(tmp_path: Path) -> None:
    for engine in ("native", "reference"):
        run = _cli("simulate", "examples/quickstart.yaml", "--log", str(tmp_path / f"{engine}.log"),
                   "--report", str(tmp_path / engine), "--packer", engine)
        assert run.returncode == 0, run.stderr
    assert _sha(tmp_path / "native.log") == _sha(tmp_path / "reference.log")


def test_golden_log_replays_byte_for_byte() -> None:
    run = _cli("replay", str(GOLDEN / "quickstart.events.jsonl"))
    assert run.returncode == 0, run.stderr
    cycles = sum(1 for line in (GOLDEN / "quickstart.events.jsonl").read_text().splitlines()
                 if "kai.scheduler.cycle.completed" in line)
    assert run.stdout.startswith(f"OK: {cycles} cycles, ")


HISTORY = sorted((GOLDEN / "history").glob("*.events.jsonl"))


@pytest.mark.parametrize("log", HISTORY, ids=lambda p: p.name)
def test_logs_written_by_older_versions_still_replay_byte_for_byte(log: Path) -> None:
    """tests/golden/history/ keeps logs exactly as earlier versions wrote them (never
    regenerated): schema-v1 is from before pod labels, affinities and ports existed."""
    run = _cli("replay", str(log))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("OK: ")


def test_history_is_not_empty() -> None:
    assert HISTORY, "tests/golden/history/ must keep at least one log written by an older version"


def test_the_consolidation_golden_log_replays_and_is_still_written(tmp_path: Path) -> None:
    """examples/consolidation.yaml under the current policy: five moves and a pipelined 8-GPU
    job, replayed byte for byte and written again identically."""
    golden = GOLDEN / "consolidation.events.jsonl"
    run = _cli("replay", str(golden))
    assert run.returncode == 0 and run.stdout.startswith("OK: "), run.stderr
    moves = [json.loads(line[9:]) for line in golden.read_bytes().splitlines()]
    assert sum(1 for e in moves if e["type"] == "kai.scheduler.pod.evictiondecided"
               and e["data"]["action"] == "consolidation") == 5
    run = _cli("simulate", "examples/consolidation.yaml", "--log", str(tmp_path / "c.log"), "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "c.log").read_bytes() == golden.read_bytes(), \
        "decisions changed: if intended, run tools/make_golden.py and review the diff"


def test_current_code_still_writes_the_golden_log(tmp_path: Path) -> None:
    run = _cli("simulate", "examples/quickstart.yaml", "--log", str(tmp_path / "q.log"), "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "q.log").read_bytes() == (GOLDEN / "quickstart.events.jsonl").read_bytes(), \
        "decisions changed: if intended, run tools/make_golden.py and review the diff"


def test_altered_golden_log_fails_replay_naming_the_cycle() -> None:
    run = _cli("replay", str(GOLDEN / "quickstart.altered.events.jsonl"))
    assert run.returncode == 1
    lines = (GOLDEN / "quickstart.events.jsonl").read_text().splitlines()
    started = next(i for i, line in enumerate(lines) if "kai.scheduler.cycle.started" in line)
    assert f"DIVERGED at cycle 1 (CycleStarted at position {started}), decision #2" in run.stderr
    assert "data.node: replay='node-a' log='node-b'" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_non_deterministic_scheduler_is_caught_by_replay() -> None:
    """A must-fail golden history: the quickstart scheduled by a packer that picks a random
    fitting node (tools/make_golden.py, seeded). Replay must fail at its first decision that
    differs from the deterministic golden log, naming that decision's cycle and position."""
    must_fail = GOLDEN / "quickstart.nondeterministic.events.jsonl"
    ours = (GOLDEN / "quickstart.events.jsonl").read_bytes().splitlines()
    theirs = must_fail.read_bytes().splitlines()
    first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    bad = json.loads(theirs[first][9:])
    based = bad["basedon"]
    assert bad["type"] == "kai.scheduler.pod.bindingdecided" and based is not None, \
        "the must-fail history is stale: regenerate it with tools/make_golden.py"
    cycle = json.loads(theirs[based][9:])["data"]["cycle"]
    index = sum(1 for line in theirs[based + 1:first] if json.loads(line[9:]).get("basedon") == based)

    records = list(FileEventLog(must_fail, readonly=True).scan())
    result = replay(records, load_packer("native"))
    failures = int(not result.ok)
    assert failures >= 1
    div = result.divergence
    assert div is not None
    assert (div.cycle, div.position, div.index, div.found_at) == (cycle, based, index, first)
    run = _cli("replay", str(must_fail))
    assert run.returncode == 1
    assert f"DIVERGED at cycle {cycle} (CycleStarted at position {based}), decision #{index}" in run.stderr


async def _all(log: MemoryEventLog) -> list:  # type: ignore[type-arg]
    return [r async for r in log.read()]


def _reframe(bodies: list[bytes]) -> bytes:
    return b"".join(b"%08x\t%s\n" % (zlib.crc32(body), body) for body in bodies)


@pytest.mark.parametrize(("version", "message"), [
    ("kai-es/v1", "cycle ran with config"),  # released, but not what the cycles ran with
    ("kai-es/v0", "the log's config in force does not validate: scheduler config: unknown policy "
                  "version 'kai-es/v0'"),
])
def test_replay_reports_a_config_that_does_not_match(tmp_path: Path, version: str, message: str) -> None:
    log_path = tmp_path / "q.log"
    assert _cli("simulate", "examples/quickstart.yaml", "--log", str(log_path), "--report", str(tmp_path / "r")).returncode == 0
    text = log_path.read_bytes().replace(f'"policyVersion":"{CURRENT_POLICY}"'.encode(),
                                         f'"policyVersion":"{version}"'.encode())
    assert version.encode() in text
    log_path.write_bytes(_reframe([line[9:] for line in text.splitlines()]))
    run = _cli("replay", str(log_path))
    assert run.returncode == 1
    # (position 34: the quickstart's two bare pods come with the PodGroups the podgrouper makes them)
    assert "DIVERGED at cycle 1 (CycleStarted at position 34), decision #0: " + message in run.stderr


def test_golden_log_records_the_incremental_state_digest() -> None:
    text = (GOLDEN / "quickstart.events.jsonl").read_bytes()
    assert f'"policyversion":"{CURRENT_POLICY}"'.encode() in text
    assert text.count(b'"statedigest":"mset-sha256:') == text.count(b'"statedigest":') > 0


def test_replay_catches_a_state_that_differs_only_in_the_incremental_digest(tmp_path: Path) -> None:
    """An observation changed so that no decision changes but the state does (a node's uid):
    only the recorded incremental state digest can notice, at the first cycle after it."""
    bodies = [line[9:] for line in (GOLDEN / "quickstart.events.jsonl").read_bytes().splitlines()]
    events = [json.loads(b) for b in bodies]
    i = next(i for i, e in enumerate(events) if e["type"] == "kai.cluster.node.observed")
    events[i]["data"]["uid"] = "someone-else"
    bodies[i] = json.dumps(events[i], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    (tmp_path / "q.log").write_bytes(_reframe(bodies))
    run = _cli("replay", str(tmp_path / "q.log"))
    assert run.returncode == 1, run.stdout
    assert "DIVERGED at cycle 1 " in run.stderr and "statedigest: replay='mset-sha256:" in run.stderr
    assert "Traceback" not in run.stderr


def test_abandoned_cycle_is_counted_not_failed(tmp_path: Path) -> None:
    """A scheduler that died after CycleStarted leaves a cycle without decisions."""
    log_path = tmp_path / "q.log"
    assert _cli("simulate", "examples/quickstart.yaml", "--log", str(log_path), "--report", str(tmp_path / "r")).returncode == 0
    lines = log_path.read_bytes().splitlines(keepends=True)
    last_start = max(i for i, line in enumerate(lines) if b"kai.scheduler.cycle.started" in line)
    kept = [line for i, line in enumerate(lines) if not (i > last_start and b'"basedon":%d' % last_start in line)]
    log_path.write_bytes(b"".join(kept))
    run = _cli("replay", str(log_path))
    assert run.returncode == 0, run.stderr
    assert "1 abandoned" in run.stdout


def test_day_example_replays_and_keeps_invariants(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "examples" / "cluster-day.yaml")
    log = FileEventLog(tmp_path / "day.log")
    result = anyio.run(lambda: simulate(sc, log, load_packer("native"), until_ns=6 * 3_600_000_000_000))
    assert result.binds > 300 and result.bind_failures == 0
    state = ClusterState()
    cuts = 0
    for record in log.scan():
        fold([record], state)
        if isinstance(record.envelope.data, p.CycleStarted) and record.envelope.data.cycle % 25 == 0:
            assert check(state) == []
            cuts += 1
    assert cuts > 5
    assert replay(log.scan(), load_packer("native")).ok


# --- property: random small clusters through the whole pipeline ------------------------------

@st.composite
def small_scenarios(draw: st.DrawFn) -> str:
    docs = [MakeNode(f"n{i}").gpus(draw(st.integers(0, 4))).cpu(str(draw(st.integers(2, 16)))).obj()
            for i in range(draw(st.integers(1, 3)))]
    docs += [queue("team-a"), queue("team-b")]
    gangs = draw(st.integers(0, 2))
    for g in range(gangs):
        docs.append(podgroup(f"g{g}", draw(st.integers(1, 3)), draw(st.sampled_from(["team-a", "team-b"]))))
    for i in range(draw(st.integers(1, 10))):
        pod = MakePod(f"p{i}", queue=draw(st.sampled_from(["team-a", "team-b"])))
        shape = draw(st.sampled_from(["cpu", "whole", "frac", "mem"]))
        if shape == "whole":
            pod.gpu(draw(st.integers(1, 4)))
        elif shape == "frac":
            pod.fraction(draw(st.sampled_from(["0.25", "0.5", "0.75"])))
        elif shape == "mem":
            pod.gpu_memory(draw(st.sampled_from([10000, 30000])))
        pod.req(cpu=draw(st.sampled_from(["500m", "1", "4"])))
        pod.annotate("kai-es.io/submit-after", f"{draw(st.integers(0, 30))}s")
        pod.annotate("kai-es.io/run-for", f"{draw(st.integers(1, 120))}s")
        if gangs and draw(st.booleans()):
            pod.group(f"g{draw(st.integers(0, gangs - 1))}")
        if draw(st.integers(0, 5)) == 0:
            pod.priority_class(draw(st.sampled_from(["inference", "build"])))
        docs.append(pod.obj())
    for d in docs:
        if d["kind"] == "Node":
            d["metadata"]["labels"]["nvidia.com/gpu.memory"] = "40960"
    return scenario_text(*docs, settings={"simulation": {"until": "1h", "cyclePeriod": "1s"}})


@settings(max_examples=25, deadline=None)
@given(small_scenarios())
def test_random_clusters_stay_consistent_and_replay(text: str) -> None:
    sc = load_scenario_text(text, "random.yaml")
    log = MemoryEventLog()
    result = anyio.run(lambda: simulate(sc, log, load_packer("native")))
    assert result.bind_failures == 0  # the simulated kubelet never had to refuse a decision
    records = anyio.run(lambda: _all(log))
    state = ClusterState()
    for record in records:
        fold([record], state)
        if isinstance(record.envelope.data, (p.CycleStarted, p.CycleCompleted)):
            assert check(state) == [], record.position
            # the incrementally maintained packer tables equal a build from scratch
            names, _, idle, future = tables(state)
            fresh = build_tables(state)
            assert names == fresh[0]
            assert idle.snapshot() == fresh[2].snapshot() and future.snapshot() == fresh[3].snapshot()
    assert replay(records, load_packer("native")).ok
    assert result.stopped_because in ("idle", "time limit")


def test_fragmentation_strategy_end_to_end_on_both_packers() -> None:
    text = (ROOT / "examples" / "quickstart.yaml").read_text().replace(
        "placementStrategy: {gpu: binpack, cpu: binpack}", "placementStrategy: {gpu: fragmentation, cpu: binpack}")
    assert "fragmentation" in text
    sc = load_scenario_text(text, "frag.yaml")
    logs = {}
    for engine in ("native", "reference"):
        log = MemoryEventLog()
        result = anyio.run(lambda: simulate(sc, log, load_packer(engine)))  # type: ignore[arg-type]
        assert result.binds == 10 and result.bind_failures == 0  # the gang twice (see above)
        logs[engine] = log.raw_lines()
        assert replay(anyio.run(lambda: _all(log)), load_packer("native")).ok
    assert logs["native"] == logs["reference"]
