"""Integers a cluster can send, up to 2**128 and as sums of many maxima, crash nothing.

KAI's Queue quota is a float, so the API server takes a GPU quota of 1e20 or a memory quota of
10^15 MB; a Pod may request 4Ei of memory on each of many nodes; `status.startTime` may be in
year 9999. Each used to overflow the state digest's msgpack encoding (integers above 2**64 - 1)
and crash-loop the scheduler. These tests run such clusters through every command, the
scheduler process included, and set every integer of every event of a recorded log to
extremes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from kai_es.adapters.file_log import frame
from kai_es.cli import main
from kai_es.state.incremental_digest import encode_form, entity_hash

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"
#: what msgpack itself carries
MSGPACK_RANGE = (-(2**63), 2**64 - 1)
BIG = st.integers(min_value=-(2**128), max_value=2**128)
FORMS = st.recursive(st.one_of(BIG, st.text(max_size=4), st.booleans(), st.none()),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                     max_leaves=12)


@given(FORMS)
def test_the_digest_encodes_any_integer_and_old_forms_as_before(form: Any) -> None:
    data = encode_form(("queue", "q", form))
    assert isinstance(entity_hash("queue", "q", form), int)
    plain = msgspec.msgpack.Encoder(order="deterministic")
    try:
        expected = plain.encode(("queue", "q", form))
    except OverflowError:
        return
    assert data == expected, "a form msgpack can carry must hash as it always did (old logs replay)"


@given(st.integers(min_value=-(2**128), max_value=2**128), st.integers(min_value=-(2**128), max_value=2**128))
def test_the_digest_tells_big_integers_apart(a: int, b: int) -> None:
    if a != b:
        assert entity_hash("queue", "q", {"x": a}) != entity_hash("queue", "q", {"x": b})


def test_a_struct_holding_a_sum_past_2_to_64_is_hashed() -> None:
    from kai_es.state.snapshot import QueueSnap
    from kai_es.events import payloads as p
    spec = p.QueueObserved(name="q", uid="u")
    snap = QueueSnap(spec=spec, allocated_milli_cpu=0, allocated_memory_bytes=16 * 2**62, allocated_milli_gpu=0,
                     nonpreemptible_milli_cpu=0, nonpreemptible_memory_bytes=0, nonpreemptible_milli_gpu=0)
    assert entity_hash("queue", "q", snap) != entity_hash("queue", "q", msgspec.structs.replace(
        snap, allocated_memory_bytes=16 * 2**62 + 1))


# --- whole runs: sums of many maxima --------------------------------------------------------

MAX_MEMORY = "4Ei"              # 2**62 bytes: the most one pod or node may have
MAX_MILLI_CPU = str(2**62) + "m"


def _scenario(nodes: int, pods_per_node: int, gpu_quota: str, memory_quota: str, start_year: int) -> str:
    docs = [f"""apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {{name: maxima}}
spec:
  start: "2026-01-01T00:00:00Z"
  simulation: {{until: idle, cyclePeriod: 1s}}
""", f"""apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {{name: q}}
spec:
  resources:
    gpu: {{quota: {gpu_quota}, limit: -1}}
    memory: {{quota: {memory_quota}}}
    cpu: {{quota: 1e30, limit: 1e30}}
"""]
    for n in range(nodes):
        docs.append(f"""apiVersion: v1
kind: Node
metadata: {{name: n{n}}}
status:
  allocatable: {{cpu: "{MAX_MILLI_CPU}", memory: {MAX_MEMORY}, nvidia.com/gpu: "8", pods: "110"}}
""")
        for i in range(pods_per_node):
            docs.append(f"""apiVersion: v1
kind: Pod
metadata:
  name: running-{n}-{i}
  labels: {{kai.scheduler/queue: q}}
  creationTimestamp: "{start_year:04d}-12-31T23:59:59Z"
spec:
  schedulerName: kai-scheduler
  nodeName: n{n}
  containers: [{{name: c, resources: {{requests: {{memory: {MAX_MEMORY}, cpu: "{MAX_MILLI_CPU}"}}}}}}]
status: {{phase: Running, startTime: "{start_year:04d}-12-31T23:59:59Z"}}
""")
        docs.append(f"""apiVersion: v1
kind: Pod
metadata: {{name: new-{n}, labels: {{kai.scheduler/queue: q}}, annotations: {{kai-es.io/run-for: 1h}}}}
spec:
  schedulerName: kai-scheduler
  containers: [{{name: c, resources: {{requests: {{memory: {MAX_MEMORY}, nvidia.com/gpu: 1}}}}}}]
""")
    return "---\n".join(docs)


def _ok(result: Any, what: str) -> str:
    out = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (what, out, result.exception)
    assert "Traceback" not in out, (what, out)
    assert result.exit_code == 0, (what, result.exit_code, out)
    return str(out)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.integers(1, 4), pods_per_node=st.integers(1, 5),
       gpu_quota=st.sampled_from(["1e20", "1e30", "4611686018427387904", "8", "-1"]),
       memory_quota=st.sampled_from(["1000000000000000", "1e30", "-1"]),
       start_year=st.sampled_from([1, 1969, 2262, 2554, 9999]))
def test_sums_of_many_maxima_run_through_every_command(tmp_path_factory: pytest.TempPathFactory, nodes: int,
                                                       pods_per_node: int, gpu_quota: str, memory_quota: str,
                                                       start_year: int) -> None:
    """4 nodes x 5 pods of 4Ei: the queue's memory in use is 20 * 2**62 bytes."""
    tmp = tmp_path_factory.mktemp("maxima")
    scenario = tmp / "s.yaml"
    scenario.write_text(_scenario(nodes, pods_per_node, gpu_quota, memory_quota, start_year))
    log = str(tmp / "s.log")
    runner = CliRunner()
    out = _ok(runner.invoke(main, ["simulate", str(scenario), "--log", log, "--report", str(tmp / "r")]), "simulate")
    note(out)
    assert "OK:" in _ok(runner.invoke(main, ["replay", log]), "replay")
    _ok(runner.invoke(main, ["usage", log, "-o", "json"]), "usage")
    explained = _ok(runner.invoke(main, ["explain", log, "default/new-0", "-o", "json"]), "explain")
    assert json.loads(explained)["timeline"]
    _ok(runner.invoke(main, ["events", log]), "events")
    _ok(runner.invoke(main, ["cycle", str(scenario)]), "cycle")
    _ok(runner.invoke(main, ["fairshare", str(scenario)]), "fairshare")
    _ok(runner.invoke(main, ["whatif", log, "--set", "queue.q.gpu.quota=1e30", "--log", str(tmp / "w.log"),
                             "--report", str(tmp / "w"), "--compare-with", "recorded"]), "whatif")


def test_the_scheduler_process_keeps_scheduling_with_a_huge_quota(tmp_path: Path) -> None:
    """The crash loop: the scheduler process, without a snapshot and then from the one it wrote,
    on a log whose state holds integers above 2**64 (a 1e20-GPU quota, a memory quota of 10^15
    MB, 16 pods of 4Ei in one queue, pods started in year 9999)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(_scenario(4, 4, "1e20", "1000000000000000", 9999))
    recorded = tmp_path / "recorded.log"
    run = subprocess.run([sys.executable, "-m", "kai_es", "simulate", str(scenario), "--log", str(recorded),
                          "--report", str(tmp_path / "r")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    # the cluster's observations, as an informer appends them: the scheduler has work
    bodies = [line[9:] for line in recorded.read_bytes().splitlines()]
    first_cycle = next(i for i, b in enumerate(bodies) if b'"kai.scheduler.cycle.started"' in b)
    observed = [b for b in bodies[:first_cycle] if b'"type":"kai.cluster.' in b]
    log = tmp_path / "live.log"
    log.write_bytes(b"".join(frame(b) for b in observed))
    node = next(b for b in observed if b'"kai.cluster.node.observed"' in b)
    for attempt in range(2):  # the second start restores the snapshot the first one wrote
        run = subprocess.run([sys.executable, "-m", "kai_es", "scheduler", "--log", str(log), "--cycles", "1",
                              "--period", "10ms", "--snapshot-every", "1", "--verbose"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (attempt, run.stderr[-3000:])
        assert "Traceback" not in run.stderr and "restart" not in run.stderr.lower(), run.stderr[-3000:]
        if attempt == 1:
            assert "snapshot at" in run.stderr, run.stderr[-3000:]
        with log.open("ab") as f:
            f.write(frame(node))  # something new for the next start to schedule on
    cycles = log.read_bytes().count(b'"kai.scheduler.cycle.completed"')
    assert cycles == 2
    replayed = subprocess.run([sys.executable, "-m", "kai_es", "replay", str(log)], capture_output=True,
                              text=True, timeout=300)
    assert replayed.returncode == 0 and "OK: 2 cycles" in replayed.stdout, replayed.stdout + replayed.stderr


# --- crafted records: every integer of every event ------------------------------------------

EXTREMES = [2**128, -(2**128), 2**64, 2**64 - 1, 2**63, -(2**63) - 1, 2**62 + 1, -1, 10**30 * 1000]


def _int_leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int):
        return [path]
    if isinstance(obj, dict):
        return [q for k, v in obj.items() for q in _int_leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [q for i, v in enumerate(obj) for q in _int_leaves(v, (*path, i))]
    return []


BODIES = [line[9:] for line in GOLDEN.read_bytes().splitlines()]
LEAVES = [(i, path) for i, body in enumerate(BODIES) for path in _int_leaves(json.loads(body))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(LEAVES), st.sampled_from(EXTREMES))
def test_a_crafted_integer_in_any_event_field_is_refused_or_held(tmp_path_factory: pytest.TempPathFactory,
                                                                 leaf: tuple[int, tuple[Any, ...]], value: int) -> None:
    """A CRC-valid record can carry any integer anywhere: the commands that read logs report it
    (a decode error naming the position, a divergence, a rejected object) or hold it; none crashes."""
    index, path = leaf
    obj = json.loads(BODIES[index])
    node = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    note(f"{obj.get('type')} {path} = {value}")
    body = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    log = tmp_path_factory.mktemp("crafted") / "log.jsonl"
    log.write_bytes(b"".join(frame(b) for b in [*BODIES[:index], body, *BODIES[index + 1:]]))
    runner = CliRunner()
    for args in (["replay"], ["usage"], ["events"], ["explain", "default/train-llm"], ["explain", "--queue", "team-a"]):
        cmd = [args[0], str(log), *args[1:]]
        result = runner.invoke(main, cmd)
        assert result.exception is None or isinstance(result.exception, SystemExit), (cmd, result.exception)
        assert "Traceback" not in result.output, (cmd, result.output)
        assert result.exit_code in (0, 1, 2), (cmd, result.exit_code)
        if result.exit_code == 2:
            assert re.search(r"error: .*\S", result.output), (cmd, result.output)


def test_a_logical_time_outside_rfc_3339_is_a_decode_error_naming_the_position(tmp_path: Path) -> None:
    obj = json.loads(BODIES[5])
    obj["logicaltime"] = 2**128
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(frame(b) for b in [*BODIES[:5], json.dumps(obj, sort_keys=True).encode()]))
    result = CliRunner().invoke(main, ["events", str(log)])
    assert result.exit_code == 2
    assert "position 5" in result.output and "logicaltime" in result.output and "0001..9999" in result.output
