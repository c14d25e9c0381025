"""What an adversary (or a tired user) hands the commands: each gets one clear line, or the
answer Kubernetes/KAI gives, and nothing is lost or overwritten.

Files that lose data, pipes and devices read as logs, malformed Kafka URLs (and a password in
one), scenario fields of the wrong type, YAML alias bombs, huge durations, a closed pipe, and
objects that used to be accepted silently (a Queue's resources as a list, a quota of `8Gi`,
`nvidia.com/gpu: "0.5"`, a sub-group loop, `--snapshot-every -1`, a glob that matches nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.ports import ObjectChange
from kai_es.services.informer import InformerService

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"
QUICKSTART = (ROOT / "examples" / "quickstart.yaml").read_text()


def _cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _one_error(run: subprocess.CompletedProcess[str], needle: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(("error:", "Error:")), run.stderr
    assert needle in lines[0], (needle, lines[0])


# --- no command overwrites its input or a file it did not write -----------------------------


def test_simulate_never_replaces_its_own_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(QUICKSTART)
    for spelling in (str(scenario), str(tmp_path / "." / "s.yaml")):
        _one_error(_cli("simulate", str(scenario), "--log", spelling, "--force", "--report", str(tmp_path / "r")),
                   "is also this command's input")
    link = tmp_path / "link.log"
    link.symlink_to(scenario)
    _one_error(_cli("simulate", str(scenario), "--log", str(link), "--force", "--report", str(tmp_path / "r")),
               "is also this command's input")
    assert scenario.read_text() == QUICKSTART


def test_no_command_overwrites_a_file_that_is_not_an_event_log(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("three weeks of notes\n")
    _one_error(_cli("simulate", "examples/quickstart.yaml", "--log", str(notes), "--force",
                    "--report", str(tmp_path / "r")), "not a kai-es event log")
    # whatif without --report used to overwrite it
    _one_error(_cli("whatif", str(GOLDEN), "--log", str(notes)), "not a kai-es event log")
    _one_error(_cli("whatif", str(GOLDEN), "--log", str(notes), "--force", "--report", str(tmp_path / "w")),
               "not a kai-es event log")
    _one_error(_cli("whatif", str(GOLDEN), "--log", str(GOLDEN)), "is also this command's input")
    assert notes.read_text() == "three weeks of notes\n"


def test_an_event_log_is_replaced_only_with_force(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(GOLDEN.read_bytes())
    _one_error(_cli("simulate", "examples/quickstart.yaml", "--log", str(log), "--report", str(tmp_path / "r")),
               "pass --force")
    assert log.read_bytes() == GOLDEN.read_bytes()
    run = _cli("simulate", "examples/quickstart.yaml", "--log", str(log), "--force", "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    # a log whose first append held many records starts with a "+" line: still a kai-es event
    # log, replaced with --force and only with it
    records = list(FileEventLog(GOLDEN, readonly=True).scan(0, 3))
    log.unlink()
    anyio.run(FileEventLog(log).append, [r.envelope for r in records])
    assert log.read_bytes()[8:9] == b"+"
    _one_error(_cli("simulate", "examples/quickstart.yaml", "--log", str(log), "--report", str(tmp_path / "r")),
               "pass --force")
    run = _cli("simulate", "examples/quickstart.yaml", "--log", str(log), "--force", "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    forged = tmp_path / "forged.log"  # a "+" line whose CRC is a tab line's is not one
    body = log.read_bytes().split(b"\n", 1)[0][9:]
    forged.write_bytes(b"%08x+%s\n" % (zlib.crc32(body), body))
    _one_error(_cli("simulate", "examples/quickstart.yaml", "--log", str(forged), "--force",
                    "--report", str(tmp_path / "r")), "not a kai-es event log")


def test_a_report_directory_holding_someone_elses_files_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"budget": 1}\n')
    _one_error(_cli("simulate", "examples/quickstart.yaml", "--log", str(tmp_path / "a.log"), "--report", str(mine)),
               "not written by kai-es")
    assert (mine / "summary.json").read_text() == '{"budget": 1}\n'
    ours = tmp_path / "ours"
    for attempt in range(2):  # a report directory kai-es wrote may be written again
        run = _cli("simulate", "examples/quickstart.yaml", "--log", str(tmp_path / f"b{attempt}.log"),
                   "--report", str(ours))
        assert run.returncode == 0, run.stderr
    assert (ours / ".kai-es-report").exists()


# --- pipes and devices are not empty logs ----------------------------------------------------


@pytest.mark.parametrize("command", [["events"], ["replay"], ["usage"], ["explain", "default/train-llm"]])
def test_a_pipe_or_a_device_is_refused_as_a_log_not_read_as_empty(tmp_path: Path, command: list[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in ((str(fifo), "is a pipe"), ("/dev/zero", "is a device"), ("/dev/urandom", "is a device"),
                       (str(tmp_path), "is a directory")):
        run = _cli(command[0], path, *command[1:])
        _one_error(run, what)
        assert "empty" not in run.stderr


def test_a_device_is_not_read_as_a_scenario_a_patch_or_a_config() -> None:
    _one_error(_cli("cycle", "/dev/urandom"), "is a device")
    _one_error(_cli("whatif", str(GOLDEN), "--config", "/dev/urandom"), "--config /dev/urandom: is a device")
    _one_error(_cli("whatif", str(GOLDEN), "--scenario-patch", "/dev/zero"), "--scenario-patch /dev/zero: is a device")


# --- Kafka URLs: checked once, permanent errors exit 2, credentials never printed ------------


@pytest.mark.parametrize("url,needle", [
    ("kafka://host:port/x", "the port must be a number from 1 to 65535"),
    ("kafka://[::1:59999/x", "needs its closing ']'"),
    ("kafka://127.0.0.1:99999/x", "the port must be a number from 1 to 65535, got '99999'"),
    ("kafka://127.0.0.1:9092/a%20b", "is not one Kafka accepts"),
    ("kafka://alice:hunter2@127.0.0.1:9092/x", "carries no user or password"),
])
def test_a_malformed_kafka_url_is_one_line_for_every_command(url: str, needle: str) -> None:
    for args in (["events", url], ["replay", url], ["scheduler", "--log", url], ["binder", "--log", url],
                 ["informer", "--log", url]):
        run = _cli(*args, timeout=60)  # a retried permanent error would run until the timeout
        _one_error(run, needle)
        assert "hunter2" not in run.stderr + run.stdout


# --- scenario fields of the wrong type, YAML shapes -------------------------------------------


def _variant(old: str, new: str) -> str:
    assert old in QUICKSTART
    return QUICKSTART.replace(old, new, 1)


PYTORCHJOB = """---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: pt, labels: {kai.scheduler/queue: team-a}}
spec:
  pytorchReplicaSpecs:
    KEY: {replicas: 1, template: {spec: {schedulerName: kai-scheduler, containers: [{name: c}]}}}
    Worker: {replicas: 2, template: {spec: {schedulerName: kai-scheduler, containers: [{name: c}]}}}
"""
WRONG_TYPES = {
    "scenario metadata a string": (_variant("metadata: {name: quickstart}", "metadata: foo"), "at metadata: must be a map"),
    "scenario spec a list": (_variant("spec:\n  start:", "spec: [1]\nx:\n  start:"), "at spec: must be a map"),
    "annotations a list": (_variant('annotations: {kai.scheduler/batch-min-member: "3", kai-es.io/run-for: 2h}',
                                    "annotations: [a, b]"), "at metadata.annotations: must be a map"),
    "labels a list": (_variant("labels: {kai.scheduler/queue: team-a}", "labels: [x]"), "at metadata.labels: must be a map"),
    "replica keys that do not sort": (QUICKSTART + PYTORCHJOB.replace("KEY", "1"), "the key 1 is not a string"),
    "a null replica key": (QUICKSTART + PYTORCHJOB.replace("KEY", "null"), "the key None is not a string"),
    "a queue's resources as a list": (_variant("  resources:\n    gpu: {quota: 8, limit: -1, overQuotaWeight: 1}",
                                               "  resources: [gpu]"), "at spec.resources: must be a map"),
    "a GPU quota of 8Gi": (_variant("gpu: {quota: 8,", "gpu: {quota: 8Gi,"), "must be a plain number of GPUs"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_scenario_field_of_the_wrong_type_is_one_line(tmp_path: Path, case: str) -> None:
    text, needle = WRONG_TYPES[case]
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    for command in ("cycle", "simulate"):
        _one_error(_cli(command, str(scenario), "--log", str(tmp_path / "s.log"), "--report", str(tmp_path / "r"))
                   if command == "simulate" else _cli(command, str(scenario)), needle)


def _aliases(levels: int, fan: int) -> list[str]:
    lines = [f"x0: &a0 [{', '.join(['x'] * fan)}]"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels)]
    return lines


def test_yaml_alias_bombs_and_self_reference_are_refused(tmp_path: Path) -> None:
    bomb = "\n".join("    " + line for line in _aliases(9, 10))  # 10**9 values when expanded
    deep = "\n".join("        " + line for line in [f"x0: &a0 [x]"] + [f"x{i}: &a{i} [*a{i - 1}]" for i in range(1, 5000)])
    cases = {
        "bomb": (QUICKSTART + f"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n  annotations:\n{bomb}\n"
                 "spec: {schedulerName: kai-scheduler, containers: [{name: c}]}\n", "an alias bomb"),
        "deep": (QUICKSTART + "---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: j, labels: {kai.scheduler/queue: team-a}}\n"
                 f"spec:\n  template:\n    metadata:\n      defs:\n{deep}\n    spec:\n      schedulerName: kai-scheduler\n"
                 "      containers: [{name: c}]\n      junk: *a4999\n", "nests deeper than 200 levels"),
        "self": (QUICKSTART + "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: r\n  labels: &l {a: *l}\n"
                 "spec: {schedulerName: kai-scheduler, containers: [{name: c}]}\n", "contains itself"),
    }
    for name, (text, needle) in cases.items():
        scenario = tmp_path / f"{name}.yaml"
        scenario.write_text(text)
        run = _cli("cycle", str(scenario), timeout=120)
        assert run.returncode != -11, f"{name}: SIGSEGV"
        _one_error(run, needle)


def test_a_huge_duration_is_refused_not_overflowed() -> None:
    _one_error(_cli("usage", str(GOLDEN), "--until", "99999999999999999999999999999999h"), "--until")
    _one_error(_cli("usage", str(GOLDEN), "--until", "1000000h"), "longer than the longest duration accepted")
    _one_error(_cli("simulate", "examples/quickstart.yaml", "--until", "876001h", "--log", "memory:"),
               "longer than the longest duration accepted")


def test_a_closed_pipe_is_a_normal_end() -> None:
    """`kai-es events LOG | head -1`: the reader goes away; exit 0, nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "kai_es", "events", str(GOLDEN), "-o", "json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert stderr == b""


def test_option_values_out_of_range_are_refused() -> None:
    run = _cli("scheduler", "--log", "memory:", "--snapshot-every", "-1")
    assert run.returncode == 2 and "-1 is not in the range x>=0" in run.stderr
    run = _cli("scheduler", "--log", "memory:", "--cycles", "0")
    assert run.returncode == 2 and "0 is not in the range x>=1" in run.stderr


def test_a_glob_that_cannot_match_is_said_so() -> None:
    _one_error(_cli("events", str(GOLDEN), "--type", "kai.schedular.*"), "matches no event type")
    _one_error(_cli("events", str(GOLDEN), "--subject", "pod/[default"), "a '[' without its ']'")
    run = _cli("events", str(GOLDEN), "--subject", "pod/nobody/*")
    assert run.returncode == 0 and run.stdout == ""
    assert "warning: none of the" in run.stderr and "pod/nobody/*" in run.stderr


# --- objects once accepted silently: rejected alone, naming the field ------------------------


def _rejected(obj: dict[str, Any]) -> p.ObjectRejected:
    informer = InformerService(MemoryEventLog(), None, SimClock(1), SeededIds("t"))  # type: ignore[arg-type]
    env = informer.translate(ObjectChange(kind=str(obj["kind"]), action="ADDED", obj=obj))
    assert env is not None and isinstance(env.data, p.ObjectRejected), env
    return env.data


def _queue(resources: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "a"},
            "spec": {"resources": resources}}


def test_the_informer_rejects_what_kubernetes_or_kai_would_refuse() -> None:
    r = _rejected(_queue(["gpu"]))
    assert r.path == "spec.resources" and "must be a map" in r.reason
    r = _rejected(_queue({"gpu": {"quota": "8Gi"}}))
    assert r.path == "spec.resources.gpu.quota" and "8Gi" in r.reason
    r = _rejected(_queue({"memory": {"quota": "512Gi"}}))
    assert r.path == "spec.resources.memory.quota" and "MB" in r.reason
    r = _rejected({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
                   "spec": {"schedulerName": "kai-scheduler", "containers": [
                       {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "0.5"}}}]}})
    assert r.path == "spec.containers[0].resources.requests[nvidia.com/gpu]" and "whole number" in r.reason
    assert "gpu-fraction" in r.reason
    r = _rejected({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                   "metadata": {"name": "g", "namespace": "d"},
                   "spec": {"subGroups": [{"name": "a", "parent": "b", "minSubGroup": 1},
                                          {"name": "b", "parent": "c", "minSubGroup": 1},
                                          {"name": "c", "parent": "a", "minSubGroup": 1}]}})
    assert r.path.startswith("spec.subGroups[") and "a -> b -> c -> a" in r.reason


def test_what_kubernetes_accepts_still_goes_through() -> None:
    """The counterparts: a quota as a number or a quoted number, fractional GPU quotas (KAI's are
    floats), whole GPUs as a string, memory in any Kubernetes form, a sub-group tree."""
    from kai_es.ingest import translate as tr
    q = tr.translate(_queue({"gpu": {"quota": "2.5", "limit": 1e20}, "memory": {"quota": 1024}}))
    assert isinstance(q, p.QueueObserved)
    assert q.gpu.quota == 2500 and q.gpu.limit == 10**23 and q.memory.quota == 1024 * 10**6
    pod = tr.translate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
                        "spec": {"schedulerName": "kai-scheduler", "containers": [
                            {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2", "memory": "1.5Gi",
                                                                      "example.com/rdma": 1}}}]}})
    assert isinstance(pod, p.PodObserved) and pod.gpu.whole == 2 and pod.scalar_requests == {"example.com/rdma": 1}
    group = tr.translate({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                          "metadata": {"name": "g", "namespace": "d"},
                          "spec": {"minSubGroup": 1, "subGroups": [{"name": "a", "minSubGroup": 1},
                                                                   {"name": "b", "parent": "a", "minMember": 1}]}})
    assert isinstance(group, p.PodGroupObserved)


def test_a_sub_group_that_is_its_own_parent_is_refused_as_kais_webhook_does() -> None:
    _one_error(_cli("cycle", "tests/data/podgroup-subgroup-loop.yaml"), "sub-group parents loop: a -> a")


def test_whatif_edits_go_through_the_queue_rules() -> None:
    _one_error(_cli("whatif", str(GOLDEN), "--set", "queue.team-a.gpu.limit=1"), "limit (1000) is below quota (4000)")
    _one_error(_cli("whatif", str(GOLDEN), "--set", "queue.team-a.gpu.quota=8Gi"), "must be a plain number of GPUs")
    _one_error(_cli("whatif", str(GOLDEN), "--set", "queue.team-a.priority=" + "9" * 30),
               "beyond the largest accepted magnitude")


def test_a_scenario_queue_that_is_its_own_parent_is_refused_naming_the_field(tmp_path: Path) -> None:
    scenario = tmp_path / "selfish.yaml"
    scenario.write_text("""apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: selfish}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: q}
spec: {parentQueue: q}
""")
    _one_error(_cli("cycle", str(scenario)), "spec.parentQueue: the parent chain never reaches a root queue: q -> q")
