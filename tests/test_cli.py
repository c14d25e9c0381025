"""CLI behaviour a user sees: readable one-line errors (exit 2), filters, help."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=cwd, capture_output=True, text=True)


def test_invalid_scenario_is_one_readable_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n"
                   "  - name: c\n    resources: {requests: {cpu: two}}\n")
    for cmd in ("simulate", "cycle"):
        run = _cli(cmd, str(bad))
        assert run.returncode == 2
        assert "Traceback" not in run.stderr
        assert run.stderr.strip().count("\n") == 0
        assert "bad.yaml: document 1 (Pod default/a) at spec.containers[0].resources.requests.cpu" in run.stderr


def test_missing_and_corrupt_logs(tmp_path: Path) -> None:
    run = _cli("replay", str(tmp_path / "nope.log"))
    assert run.returncode == 2 and "no such log file" in run.stderr
    corrupt = tmp_path / "c.log"
    corrupt.write_bytes(b"00000000\t{}\n00000000\t{}\n")
    run = _cli("events", str(corrupt))
    assert run.returncode == 2 and "position 0" in run.stderr and "Traceback" not in run.stderr


def test_events_filters_by_type_and_subject(tmp_path: Path) -> None:
    log = str(ROOT / "tests" / "golden" / "quickstart.events.jsonl")
    run = _cli("events", log, "--type", "kai.scheduler.pod.*", "--subject", "pod/default/train-*", "-o", "json")
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    # what the filters should keep, read off the log itself
    wanted = [line for line in Path(log).read_text().splitlines()
              if fnmatch.fnmatchcase(json.loads(line[9:])["type"], "kai.scheduler.pod.*")
              and fnmatch.fnmatchcase(json.loads(line[9:])["subject"], "pod/default/train-*")]
    assert len(rows) == len(wanted) > 0
    # the quickstart's gang is bound, evicted by reclaim (kai-es/v6) and bound again
    assert {r["event"]["type"] for r in rows} >= {"kai.scheduler.pod.bindingdecided", "kai.scheduler.pod.evictiondecided"}
    assert all(r["event"]["type"].startswith("kai.scheduler.pod.") for r in rows)
    assert all(r["event"]["subject"].startswith("pod/default/train-") for r in rows)
    assert [r["position"] for r in rows] == sorted(r["position"] for r in rows)
    text = _cli("events", log, "--type", "kai.binder.*", "--limit", "2")
    assert len(text.stdout.splitlines()) == 2 and "bound to" in text.stdout


def test_until_must_be_a_duration(tmp_path: Path) -> None:
    run = _cli("simulate", "examples/quickstart.yaml", "--until", "soon", "--log", str(tmp_path / "l"))
    assert run.returncode == 2 and "--until" in run.stderr


def test_simulate_until_stops_early(tmp_path: Path) -> None:
    run = _cli("simulate", "examples/quickstart.yaml", "--until", "20m", "--log", str(tmp_path / "l"),
               "--report", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    assert "simulated 20m (time limit)" in run.stdout


def test_help_lists_the_commands() -> None:
    run = _cli("--help")
    for cmd in ("simulate", "cycle", "replay", "events"):
        assert cmd in run.stdout


def test_every_command_is_registered_with_its_options() -> None:
    """The commands a user and the process tests rely on exist, through `kai-es` itself (the
    service commands are defined in kai_es.cli_services and added to the group by kai_es.cli)."""
    run = _cli("--help")
    assert run.returncode == 0, run.stderr
    listed = {line.split()[0] for line in run.stdout.split("Commands:", 1)[1].splitlines() if line.strip()}
    assert {"simulate", "cycle", "replay", "events", "fairshare", "scheduler", "informer", "binder"} <= listed
    expected = {
        "scheduler": ["--log", "--scenario", "--period", "--snapshot-every", "--time-scale", "--cycles"],
        "binder": ["--log", "--kubeconfig", "--scenario", "--time-scale", "--poll", "--stats"],
        "informer": ["--log", "--kubeconfig"],
        "fairshare": ["--output"],
    }
    for command, options in expected.items():
        help_run = _cli(command, "--help")
        assert help_run.returncode == 0, help_run.stderr
        for option in options:
            assert option in help_run.stdout, (command, option)


def test_lazy_command_table_names_every_command_of_its_module() -> None:
    """`kai_es.cli.LAZY_COMMANDS` is the whole of each command module's `COMMANDS`, no more: a
    command missing from the table would vanish from `kai-es`, one named in the wrong module
    would fail when run."""
    import importlib

    from kai_es.cli import LAZY_COMMANDS

    by_module: dict[str, set[str]] = {}
    for name, module in LAZY_COMMANDS.items():
        by_module.setdefault(module, set()).add(name)
    for module, names in by_module.items():
        assert {c.name for c in importlib.import_module(module).COMMANDS} == names, module


def test_a_file_log_command_loads_neither_kafka_nor_the_other_commands() -> None:
    """`kai-es events` on a file log imports no Kafka client and none of the command modules it
    does not run (each costs every command its import time); a Kafka error is still one line
    once a command has loaded the backend (tests/kafka)."""
    log = str(ROOT / "tests" / "golden" / "quickstart.events.jsonl")
    code = ("import sys\nfrom kai_es.cli import main\n"
            f"try:\n    main(['events', {log!r}, '--limit', '1'])\nexcept SystemExit as e:\n    assert e.code == 0, e\n"
            "print(sorted(m for m in sys.modules if m.startswith(('aiokafka', 'kai_es.cli_', 'kai_es.serve'))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "['kai_es.cli_common']"


def test_fairshare_runs_from_the_command_line() -> None:
    run = _cli("fairshare", "examples/quickstart.yaml", "-o", "json")
    assert run.returncode == 0, run.stderr
    assert {"research", "team-a", "team-b"} <= set(json.loads(run.stdout)["queues"])


def test_service_commands_refuse_a_missing_log_option() -> None:
    for command in ("scheduler", "informer", "binder"):
        run = _cli(command)
        assert run.returncode == 2 and "--log" in run.stderr and "Traceback" not in run.stderr


def test_the_binder_refuses_contradictory_options(tmp_path: Path) -> None:
    scenario = "examples/quickstart.yaml"
    for args, why in ((["--scenario", scenario, "--kubeconfig", scenario], "exclude each other"),
                      (["--stats", str(tmp_path / "s")], "needs --scenario"),
                      (["--time-scale", "60"], "needs --scenario")):
        run = _cli("binder", "--log", str(tmp_path / "log"), *args)
        assert run.returncode == 2 and why in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_kubernetes_process_without_a_cluster_config_says_so(tmp_path: Path) -> None:
    for command in ("informer", "binder"):
        run = _cli(command, "--log", str(tmp_path / "log"), "--kubeconfig", str(tmp_path / "missing"))
        assert run.returncode == 2 and "missing" in run.stderr and "Traceback" not in run.stderr, run.stderr
