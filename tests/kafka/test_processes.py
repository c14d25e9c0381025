"""`kai-es scheduler` and `kai-es binder` as real processes on the real broker: a workload runs
to completion, `kai-es replay kafka://...` passes on the result, and a second scheduler with
the same transactional_id fences the first, which stops with one clear line and exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path


from tests.kafka.procs import (ROOT, Proc, end_checks, http_get, read_topic, served_address, workload_done,
                              workload_scenario)


def binder_and_two_schedulers(url: str, name: str, scenario: Path, tmp_path: Path,
                              *binder_args: str) -> tuple[Proc, Proc, Proc]:
    """A simulated cluster's binder, and two schedulers with ONE transactional id."""
    binder = Proc("binder", ["binder", "--log", f"{url}?transactional_id=b-{name}", "--scenario",
                             str(scenario), "--time-scale", "60", *binder_args], tmp_path)
    sched_args = ["scheduler", "--log", f"{url}?transactional_id=s-{name}",
                  "--scenario", str(scenario), "--time-scale", "60", "--period", "100ms"]
    return binder, Proc("scheduler-1", sched_args, tmp_path), Proc("scheduler-2", sched_args, tmp_path)


def small_run_done(kafka_bootstrap: str, name: str, tmp_path: Path, procs: list[Proc],
                   pods: int = 20) -> tuple[str, Proc, Proc]:
    """A binder and one scheduler run a small workload on topic `name` until it is done; the
    log's URL and the second scheduler (same transactional id as the first, not started)."""
    scenario = workload_scenario(tmp_path / "w.yaml", pods=pods, nodes=4, spread_s=60, run_for_s=30)
    url = f"kafka://{kafka_bootstrap}/{name}"
    binder, first, second = binder_and_two_schedulers(url, name, scenario, tmp_path)
    procs.extend([binder, first, second])
    binder.start()
    binder.wait_ready("binder")
    first.start()
    first.wait_ready("scheduler")
    deadline = time.monotonic() + 90
    while not workload_done(kafka_bootstrap, name, pods)[0]:
        assert time.monotonic() < deadline, workload_done(kafka_bootstrap, name, pods)[1]
        time.sleep(1)
    return url, first, second


def stops_fenced(proc: Proc) -> str:
    """`proc` exits 2 within 30 s; its last line."""
    assert proc.popen is not None
    rc = proc.popen.wait(30)
    lines = [line for line in proc.stderr().splitlines() if line.strip()]
    assert rc == 2, proc.stderr()[-2000:]
    assert lines[-1].startswith("error: ") and "took over" in lines[-1], lines[-5:]
    return lines[-1]


def test_fenced_scheduler_stops_and_workload_completes(kafka_bootstrap: str, unique_name: str,
                                                       tmp_path: Path, procs: list[Proc]) -> None:
    pods = 300
    scenario = workload_scenario(tmp_path / "w.yaml", pods=pods, nodes=4, spread_s=600,
                                 run_for_s=60)
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    binder, first, second = binder_and_two_schedulers(url, unique_name, scenario, tmp_path,
                                                      "--stats", str(tmp_path / "stats.jsonl"))
    procs.extend([binder, first, second])
    binder.start()
    binder.wait_ready("binder")
    first.start()
    first.wait_ready("scheduler")
    time.sleep(2)
    second.start()
    second.wait_ready("scheduler")
    assert "s-" + unique_name in stops_fenced(first)
    deadline = time.monotonic() + 90
    while not workload_done(kafka_bootstrap, unique_name, pods)[0]:
        assert second.alive(), second.stderr()[-2000:]
        assert time.monotonic() < deadline, workload_done(kafka_bootstrap, unique_name, pods)[1]
        time.sleep(1)
    end_checks(kafka_bootstrap, unique_name, pods, tmp_path / "stats.jsonl")
    out = subprocess.run([sys.executable, "-m", "kai_es", "replay", url], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "OK:" in out.stdout, out.stdout + out.stderr


def test_idle_fenced_scheduler_stops(kafka_bootstrap: str, unique_name: str, tmp_path: Path,
                                     procs: list[Proc]) -> None:
    """The takeover comes when the workload is done and the first scheduler has nothing left to
    append: it learns of it by checking its writer role (`EventLog.check_writer`), not by
    waiting for a write that never comes."""
    _, first, second = small_run_done(kafka_bootstrap, unique_name, tmp_path, procs)
    # the last pod's Succeeded is still work: one more cycle may follow it; then nothing more
    deadline = time.monotonic() + 60
    before = len(read_topic(kafka_bootstrap, unique_name)[0])
    while True:
        time.sleep(3)
        now = len(read_topic(kafka_bootstrap, unique_name)[0])
        if now == before:
            break  # idle: nothing appended for 3 s
        assert time.monotonic() < deadline, f"the scheduler kept appending ({before} -> {now} records)"
        before = now
    assert first.alive(), first.stderr()[-2000:]
    second.start()
    second.wait_ready("scheduler")
    assert "nothing to write" in stops_fenced(first)
    assert second.alive(), second.stderr()[-2000:]


def test_processes_serve_probes_and_metrics(kafka_bootstrap: str, unique_name: str, tmp_path: Path,
                                            procs: list[Proc]) -> None:
    """`--http-bind-address`: /readyz turns 200 once a process is ready, /healthz is 200 while it
    runs, and /metrics counts the scheduler's cycles and decisions and the binder's outcomes."""
    pods = 20
    scenario = workload_scenario(tmp_path / "w.yaml", pods=pods, nodes=4, spread_s=60, run_for_s=600)
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    binder = Proc("binder", ["binder", "--log", f"{url}?transactional_id=b-{unique_name}",
                             "--scenario", str(scenario), "--time-scale", "60",
                             "--http-bind-address", "127.0.0.1:0"], tmp_path)
    scheduler = Proc("scheduler", ["scheduler", "--log", f"{url}?transactional_id=s-{unique_name}",
                                   "--scenario", str(scenario), "--time-scale", "60", "--period",
                                   "100ms", "--http-bind-address", "127.0.0.1:0"], tmp_path)
    procs.extend([binder, scheduler])
    binder.start()
    binder.wait_ready("binder")
    scheduler.start()
    scheduler.wait_ready("scheduler")
    served = {proc.name: served_address(proc) for proc in (binder, scheduler)}
    for base in served.values():
        assert http_get(base + "/readyz") == (200, "ok\n")
        assert http_get(base + "/healthz") == (200, "ok\n")
    deadline = time.monotonic() + 60
    while True:
        text = http_get(served["scheduler"] + "/metrics")[1]
        bound = re.search(r'kai_es_appended_events_total\{type="kai.scheduler.pod.bindingdecided"\} (\S+)', text)
        if bound and float(bound.group(1)) == pods:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.5)
    assert re.search(r"kai_es_cycle_duration_seconds_count [1-9]", text), text
    binder_text = http_get(served["binder"] + "/metrics")[1]
    while f'kai_es_appended_events_total{{type="kai.binder.pod.bound"}} {pods}.0' not in binder_text:
        assert time.monotonic() < deadline, binder_text
        time.sleep(0.5)
        binder_text = http_get(served["binder"] + "/metrics")[1]
    # KAI's /get-job-order (its reflectjoborder plugin's endpoint): the scheduler's last cycle's
    # tried order in KAI's JSON; the binder has no such endpoint
    code, body = http_get(served["scheduler"] + "/get-job-order")
    assert code == 200, body
    doc = json.loads(body)
    assert sorted(doc) == ["global_order", "queue_order"]
    assert [e["id"] for e in doc["global_order"]] == [e["id"] for q in doc["queue_order"].values() for e in q] \
        or len(doc["queue_order"]) > 1
    assert all(sorted(e) == ["id", "priority"] for e in doc["global_order"])
    assert http_get(served["binder"] + "/get-job-order")[0] == 404


def test_whatif_reads_a_live_run_from_kafka(kafka_bootstrap: str, unique_name: str, tmp_path: Path,
                                            procs: list[Proc]) -> None:
    """`kai-es whatif kafka://…` re-runs a workload two live processes recorded on the broker:
    every recorded pod arrives and is scheduled in the counterfactual, whose own log replays. The
    live run's timing is not the simulator's, so the counterfactual is compared with a re-run of
    the recorded settings, not with the record (whose waits include, e.g., the seconds before
    the scheduler process started)."""
    pods = 20
    url, _, _ = small_run_done(kafka_bootstrap, unique_name, tmp_path, procs, pods)
    cf_log = tmp_path / "cf.events.jsonl"
    out = subprocess.run([sys.executable, "-m", "kai_es", "whatif", url, "--set",
                          "queue.team-a.gpu.quota=16", "--log", str(cf_log), "--report",
                          str(tmp_path / "report"), "--output", "json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["changes"] == ["set queue.team-a.gpu.quota=16"]
    assert doc["runs"]["recorded"]["podsScheduled"] == doc["runs"]["counterfactual"]["podsScheduled"] == pods
    assert doc["comparedWith"] == "rerun"
    assert doc["runs"]["rerun"]["decisionDigest"] != doc["runs"]["recorded"]["decisionDigest"]
    assert doc["runs"]["rerun"]["podsScheduled"] == pods
    assert all("rerunWaitNs" in job for job in doc["jobsChangedMost"])
    replay = subprocess.run([sys.executable, "-m", "kai_es", "replay", str(cf_log)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0 and replay.stdout.startswith("OK:"), replay.stdout + replay.stderr
