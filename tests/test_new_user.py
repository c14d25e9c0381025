"""What a new user hits: the log is never destroyed or misreported, results are not silently
wrong, messages are readable one-liners that user data cannot garble or forge."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_es import scenario as scenario_module
from kai_es.adapters.file_log import FileEventLog
from kai_es.replay import replay
from kai_es.replay_parallel import replay_file
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from tests.builders import MakeNode, MakePod, queue, scenario_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
HOUR = 3_600_000_000_000


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=cwd, capture_output=True, text=True)


def _one_line_error(run: subprocess.CompletedProcess[str], needle: str) -> None:
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], run.stderr


def _frame(event: dict[str, Any]) -> bytes:
    body = json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return b"%08x\t%s\n" % (zlib.crc32(body), body)


def _golden_events() -> list[dict[str, Any]]:
    return [json.loads(line[9:]) for line in GOLDEN.read_bytes().splitlines()]


# --- simulate: never destroy a log, never write outside out/ ------------------------------------


def test_simulate_refuses_to_overwrite_an_existing_log_unless_forced(tmp_path: Path) -> None:
    log = tmp_path / "precious.log"
    log.write_bytes(GOLDEN.read_bytes())
    run = _cli("simulate", str(QUICKSTART), "--log", str(log), "--report", str(tmp_path / "r"))
    _one_line_error(run, f"--log {log} already exists")
    assert "--force" in run.stderr
    assert log.read_bytes() == GOLDEN.read_bytes()
    for flag in ("--force", "--overwrite"):
        run = _cli("simulate", str(QUICKSTART), "--log", str(log), "--report", str(tmp_path / "r"), flag)
        assert run.returncode == 0, run.stderr
    assert log.read_bytes() == GOLDEN.read_bytes()  # replaced by the same run's bytes


def test_an_empty_existing_file_may_be_used_as_the_log(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.touch()
    assert _cli("simulate", str(QUICKSTART), "--log", str(log), "--report", str(tmp_path / "r")).returncode == 0
    assert log.read_bytes() == GOLDEN.read_bytes()


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", "/abs"])
def test_a_scenario_name_cannot_write_outside_out(tmp_path: Path, name: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    text = QUICKSTART.read_text().replace("metadata: {name: quickstart}", f"metadata: {{name: {json.dumps(name)}}}")
    (work / "s.yaml").write_text(text)
    run = _cli("simulate", "s.yaml", cwd=work)
    _one_line_error(run, f"the Scenario name {name!r} cannot name files under out/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert sorted(p.name for p in work.iterdir()) == ["s.yaml"]
    # with both paths given, the name names no file and the run goes ahead
    run = _cli("simulate", "s.yaml", "--log", "l.log", "--report", "r", cwd=work)
    assert run.returncode == 0, run.stderr


# --- simulate: the summary is right -------------------------------------------------------------


def _forever_scenario(tmp_path: Path) -> Path:
    """A pod that never ends (4 of 8 GPUs) and two 8-GPU pods that can never run, in a leaf
    queue under a parent."""
    path = tmp_path / "forever.yaml"
    path.write_text(scenario_text(
        MakeNode("n").gpus(8).obj(), queue("parent"), queue("team-a", parent="parent"),
        MakePod("forever").gpu(4).obj(), MakePod("big-1").gpu(8).obj(), MakePod("big-2").gpu(8).obj(),
        settings={"simulation": {"until": "idle"}}))
    return path


def test_until_with_a_pod_that_never_ends_reports_the_whole_span(tmp_path: Path) -> None:
    run = _cli("simulate", str(_forever_scenario(tmp_path)), "--until", "5h", "--log", str(tmp_path / "l"),
               "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    assert "simulated 5h (time limit)" in run.stdout
    assert "GPU utilization 50.0%" in run.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["end"] == "2026-01-01T05:00:00Z"
    assert summary["gpuUtilizationPermille"] == 500
    assert summary["queues"]["team-a"]["gpuMilliNs"] == 4000 * 5 * HOUR
    assert summary["queues"]["parent"]["gpuMilliNs"] == 4000 * 5 * HOUR


def test_parents_show_their_childrens_pending_and_waits_include_pods_that_never_ran(tmp_path: Path) -> None:
    run = _cli("simulate", str(_forever_scenario(tmp_path)), "--until", "5h", "--log", str(tmp_path / "l"),
               "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    queues = json.loads((tmp_path / "r" / "summary.json").read_text())["queues"]
    assert queues["team-a"]["pendingAtEnd"] == 2 and queues["parent"]["pendingAtEnd"] == 2
    # waits: forever 0s; big-1 and big-2 still waiting after 5h (censored at the end)
    for name in ("team-a", "parent"):
        assert queues[name]["waitsCensored"] == 2
        assert queues[name]["waitP50Ns"] == 5 * HOUR and queues[name]["waitP95Ns"] == 5 * HOUR
    assert "waits include 2 pod(s) that never ran: each counts its wait from arrival to the end of the run" in run.stdout
    table = run.stdout.split("per queue", 1)[1]
    parent_row = next(line for line in table.splitlines() if " parent " in line)
    assert parent_row.rstrip(" │").endswith("2") and "5h" in parent_row


# --- events -------------------------------------------------------------------------------------


def test_events_limit_zero_prints_nothing_and_a_negative_limit_is_refused() -> None:
    run = _cli("events", str(GOLDEN), "--limit", "0")
    assert run.returncode == 0 and run.stdout == "", run.stdout
    run = _cli("events", str(GOLDEN), "--limit", "-1")
    assert run.returncode == 2 and "--limit" in run.stderr and "Traceback" not in run.stderr


def test_names_with_control_characters_cannot_forge_event_lines(tmp_path: Path) -> None:
    events = _golden_events()
    forged = "evil\n     9999 2026-01-01T00:00:00Z kai.binder.pod.bound  pod/default/x  bound to node-z\x1b[31m"
    index = next(i for i, e in enumerate(events) if e["type"] == "kai.cluster.pod.observed")
    events[index]["subject"] = f"pod/default/{forged}"
    events[index]["data"]["name"] = forged
    log = tmp_path / "forged.log"
    log.write_bytes(b"".join(_frame(e) for e in events))
    run = _cli("events", str(log))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(events)
    assert "evil\\n     9999" in lines[index] and "\\x1b[31m" in lines[index] and "\x1b" not in run.stdout
    assert len(events) < 9999 and not any(line.lstrip().startswith("9999 ") for line in lines)


# --- replay: never "OK" on what it did not verify ----------------------------------------------


def _replay_refuses(path: Path, needle: str) -> subprocess.CompletedProcess[str]:
    run = _cli("replay", str(path))
    assert run.returncode != 0, run.stdout
    assert "OK" not in run.stdout and "Traceback" not in run.stderr
    assert needle in run.stderr, run.stderr
    return run


def test_replay_of_nothing_is_not_ok(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.touch()
    assert _replay_refuses(Path("/dev/null"), "/dev/null: is a device: an event log must be a regular file").returncode == 2
    assert _replay_refuses(empty, "no complete record to verify: it is empty").returncode == 2


def test_replay_of_random_bytes_is_not_ok(tmp_path: Path) -> None:
    rng = random.Random(9)
    noise = tmp_path / "noise.log"
    noise.write_bytes(bytes(rng.getrandbits(8) for _ in range(4096)).replace(b"\n", b"") + b"\n" +
                      bytes(rng.getrandbits(8) for _ in range(100)))
    assert _replay_refuses(noise, "record at position 0 is corrupt").returncode == 2
    unterminated = tmp_path / "unterminated.log"
    unterminated.write_bytes(bytes(rng.getrandbits(8) for _ in range(4096)).replace(b"\n", b""))
    assert _replay_refuses(unterminated, "no complete record to verify: it ends with 4").returncode == 2


def test_replay_of_a_log_cut_in_half_says_what_it_verified_and_fails(tmp_path: Path) -> None:
    data = GOLDEN.read_bytes()
    half = tmp_path / "half.log"
    half.write_bytes(data[:len(data) // 2])
    run = _replay_refuses(half, "the log ends with a torn record at position")
    assert run.returncode == 2
    assert run.stdout.startswith("verified: ") and "cycles" in run.stdout
    assert half.read_bytes() == data[:len(data) // 2]  # a read-only replay changes nothing


def test_replay_of_a_log_cut_before_any_complete_cycle_is_not_ok(tmp_path: Path) -> None:
    lines = GOLDEN.read_bytes().splitlines(keepends=True)
    first_cycle = next(i for i, line in enumerate(lines) if b"kai.scheduler.cycle.started" in line)
    observations = tmp_path / "observations.log"
    observations.write_bytes(b"".join(lines[:first_cycle]))
    assert _replay_refuses(observations, "no complete scheduling cycle").returncode == 2
    inside = tmp_path / "inside.log"
    inside.write_bytes(b"".join(lines[:first_cycle + 1]))  # the cycle started, nothing more
    assert _replay_refuses(inside, "1 abandoned").returncode == 2


def test_a_flipped_bit_in_the_last_line_is_corruption(tmp_path: Path) -> None:
    data = bytearray(GOLDEN.read_bytes())
    data[-20] ^= 0x01
    flipped = tmp_path / "flipped.log"
    flipped.write_bytes(bytes(data))
    last = len(GOLDEN.read_bytes().splitlines()) - 1
    run = _replay_refuses(flipped, f"record at position {last} is corrupt: CRC mismatch")
    assert run.returncode == 2 and flipped.read_bytes() == bytes(data)


def _with_outcome_changed(tmp_path: Path, change: Any) -> tuple[Path, int]:
    events = _golden_events()
    index = next(i for i, e in enumerate(events) if e["type"] == "kai.binder.pod.bound")
    change(events[index])
    path = tmp_path / "crafted.log"
    path.write_bytes(b"".join(_frame(e) for e in events))
    return path, index


IMPOSSIBLE = {
    "unknown decision": (lambda e: e["data"].update(decision_id="00000000-0000-0000-0000-000000000000"),
                         "which is not in the log before it"),
    "node never existed": (lambda e: e["data"].update(node="node-zz"),
                           "does not match its decision"),
    "pod never existed": (lambda e: e["data"].update(name="ghost", uid="ghost-uid"),
                          "does not match its decision"),
    "time runs back to 1970": (lambda e: e.update(logicaltime=0, time="1970-01-01T00:00:00Z"),
                               "logical time runs back"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_binder_outcomes_fail_replay_with_their_position(tmp_path: Path, case: str) -> None:
    change, needle = IMPOSSIBLE[case]
    path, index = _with_outcome_changed(tmp_path, change)
    run = _cli("replay", str(path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"impossible record at position {index}:" in run.stderr and needle in run.stderr
    one = replay(FileEventLog(path, readonly=True).scan(), load_packer("native"))
    many = replay_file(path, jobs=3, min_records=1)
    assert one.divergence is not None and one.divergence.found_at == index
    assert many.divergence == one.divergence


def test_real_outcomes_pass_the_outcome_checks() -> None:
    result = replay(FileEventLog(GOLDEN, readonly=True).scan(), load_packer("native"))
    assert result.ok and result.last_position == len(GOLDEN.read_bytes().splitlines()) - 1


# --- messages -----------------------------------------------------------------------------------


def test_error_text_is_not_rich_markup(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(scenario_text(MakeNode("n").obj(), queue("team-a"), MakePod("p", queue="nope").obj()))
    run = _cli("cycle", str(bad))
    _one_line_error(run, "at metadata.labels[kai.scheduler/queue]")
    bold = tmp_path / "bold.yaml"
    bold.write_text(scenario_text(MakeNode("n").obj(), queue("team-a"),
                                  MakePod("[/bold]x").req(cpu="two").obj()))
    for command in ("cycle", "simulate"):
        run = _cli(command, str(bold))
        _one_line_error(run, "[/bold]x")


def test_a_binary_scenario_is_one_line(tmp_path: Path) -> None:
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(bytes(range(256)) * 4)
    for command in ("simulate", "cycle", "fairshare"):
        _one_line_error(_cli(command, str(blob)), f"{blob}: not a text file")


def _small_files() -> None:
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_an_unwritable_log_or_a_full_disk_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    run = _cli("simulate", str(QUICKSTART), "--log", str(a_file / "l.log"), "--report", str(tmp_path / "r"))
    _one_line_error(run, f"--log {a_file / 'l.log'}: cannot create the log: {a_file}: File exists")
    # a device is not a log file: refused before anything is written
    run = _cli("simulate", str(QUICKSTART), "--log", "/dev/full", "--report", str(tmp_path / "r"))
    _one_line_error(run, "--log /dev/full is not a regular file")
    # a full disk: the file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) fails the log's writes
    # past 4 KiB with EFBIG, as a full file system fails them with ENOSPC
    full = subprocess.run([sys.executable, "-m", "kai_es", "simulate", str(QUICKSTART), "--log",
                           str(tmp_path / "full.log"), "--report", str(tmp_path / "r")],
                          capture_output=True, text=True, preexec_fn=_small_files)
    _one_line_error(full, f"--log {tmp_path / 'full.log'}: writing the log failed: File too large")
    run = _cli("simulate", str(QUICKSTART), "--log", str(tmp_path / "ok.log"), "--report", str(a_file / "r"))
    _one_line_error(run, f"--report {a_file / 'r'}: cannot write the report: {a_file / 'r'}: Not a directory")


# --- scenario loading ---------------------------------------------------------------------------


def test_scenarios_are_parsed_by_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert yaml.__with_libyaml__, "PyYAML was installed without libyaml"
    assert scenario_module.YAML_LOADER is yaml.CSafeLoader
    used: list[type] = []
    real = yaml.load_all

    def spy(stream: Any, Loader: type) -> Any:  # noqa: N803 - PyYAML's keyword
        used.append(Loader)
        return real(stream, Loader=Loader)

    monkeypatch.setattr(yaml, "load_all", spy)
    load_scenario_text(QUICKSTART.read_text(), "quickstart.yaml")
    assert used == [yaml.CSafeLoader]


def test_actions_that_do_not_run_are_warned_about_in_one_line(tmp_path: Path) -> None:
    """Policy kai-es/v1 accepts action names it never ran (old logs list them): a config that
    lists them says so in one warning line. The current policy refuses them outright."""
    run = _cli("cycle", str(QUICKSTART))
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(QUICKSTART.read_text().replace(
        "placementStrategy: {gpu: binpack, cpu: binpack}",
        "placementStrategy: {gpu: binpack, cpu: binpack}\n    policyVersion: kai-es/v1\n"
        "    actions: [allocate, reclaim, preempt]"))
    for command in ("cycle", "simulate"):
        args = [command, str(legacy)] + (["--log", str(tmp_path / "l.log"), "--report", str(tmp_path / "r"),
                                          "--force"] if command == "simulate" else [])
        run = _cli(*args)
        assert run.returncode == 0, run.stderr
        warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
        assert warnings == ["warning: the scheduler config lists actions that do not run: reclaim, preempt "
                            "(policy kai-es/v1 runs only allocate)"], run.stderr
    current = tmp_path / "current.yaml"
    current.write_text(QUICKSTART.read_text().replace(
        "placementStrategy: {gpu: binpack, cpu: binpack}",
        "placementStrategy: {gpu: binpack, cpu: binpack}\n    policyVersion: kai-es/v3\n"
        "    actions: [allocate, consolidation]"))
    _one_line_error(_cli("cycle", str(current)), "consolidation is not implemented by policy kai-es/v3")


def test_the_readme_documents_the_scenario_format_inside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](../" not in readme, "a link that leads outside the repository"
    assert "](docs/scenarios.md)" in readme
    doc = (ROOT / "docs" / "scenarios.md").read_text()
    for term in ("kai-es.io/v1alpha1", "kai-es.io/submit-after", "kai-es.io/run-for", "kai-es.io/recreate",
                 "cyclePeriod", "until", "placementStrategy", "PyTorchJob", "Deployment"):
        assert term in doc, term
