"""`kai-es usage` against an independent sum over the log's own events: here a pod's charge is
worked out from the raw PodBound event (its devices), the pod's observed request and the node's
GPU memory, up to the first terminal event of that pod (Succeeded/Failed, removed, evicted) or
the log's last event — without the reducer — and GPU over quota by sweeping interval endpoints."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import payloads as p
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from kai_es.app.simulation import simulate
from kai_es.usage import hours, usage

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"
HOUR = 3_600_000_000_000


@pytest.fixture(scope="module")
def chargeback(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("usage") / "chargeback.log"
    scenario = load_scenario(ROOT / "tests" / "data" / "usage" / "chargeback.yaml")
    anyio.run(lambda: simulate(scenario, FileEventLog(path), load_packer("native")))
    return path


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("usage") / "day.log"
    scenario = load_scenario(ROOT / "examples" / "cluster-day.yaml")
    anyio.run(lambda: simulate(scenario, FileEventLog(path), load_packer("native"), until_ns=3 * HOUR))
    return path


def _intervals(path: Path) -> tuple[list[dict[str, Any]], int, int, dict[str, int]]:
    """Independent: (intervals, first time, last time, GPU quota per queue) from the raw events."""
    spec: dict[str, p.PodObserved] = {}
    gpu_mem: dict[str, int] = {}
    group_queue: dict[str, str] = {}
    quota: dict[str, int] = {}
    parents: dict[str, str] = {}
    open_: dict[str, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    first = last = None
    for record in FileEventLog(path, readonly=True).scan():
        env = record.envelope
        d = env.data
        t = env.logicaltime
        first = t if first is None else first
        last = t
        if isinstance(d, p.NodeObserved):
            gpu_mem[d.name] = d.gpu_memory_mib
        elif isinstance(d, p.QueueObserved):
            quota[d.name] = d.gpu.quota
            parents[d.name] = d.parent
        elif isinstance(d, p.PodGroupObserved):
            group_queue[f"{d.namespace}/{d.name}"] = d.queue
        elif isinstance(d, p.PodObserved):
            spec[d.uid] = d
            if d.uid in open_ and d.phase in ("Succeeded", "Failed"):
                done.append({**open_.pop(d.uid), "end": t})
        elif isinstance(d, (p.PodRemoved, p.PodEvicted)):
            uid = d.uid or next((u for u, s in spec.items() if (s.namespace, s.name) == (d.namespace, d.name)), "")
            if uid in open_:
                done.append({**open_.pop(uid), "end": t})
        elif isinstance(d, p.PodBound) and d.uid not in open_:
            s = spec[d.uid]
            g = s.gpu
            if g.whole:
                per = 1000
            elif g.fraction_milli:
                per = g.fraction_milli
            elif g.gpu_memory_mib:
                per = min(1000, -(-g.gpu_memory_mib * 1000 // gpu_mem[d.node]))
            else:
                per = 0
            job = f"{s.namespace}/{s.podgroup}"
            open_[d.uid] = {"start": t, "gpu": per * len(d.gpu_devices), "cpu": s.requests.milli_cpu,
                            "mem": s.requests.memory_bytes, "namespace": s.namespace, "job": job,
                            "queue": group_queue.get(job) or s.queue}
    assert first is not None and last is not None
    done.extend({**iv, "end": last} for iv in open_.values())
    for iv in done:  # the queue and its ancestors, each charged for the pod
        chain, at = [], iv["queue"]
        while at and at not in chain:
            chain.append(at)
            at = parents.get(at, "")
        iv["queues"] = chain
    return done, first, last, quota


def _expected(path: Path, by: str, lo: int | None = None, hi: int | None = None) -> dict[str, tuple[int, int, int]]:
    intervals, first, last, _ = _intervals(path)
    lo = first if lo is None else lo
    hi = last if hi is None else hi
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for iv in intervals:
        dt = max(0, min(iv["end"], hi) - max(iv["start"], lo))
        row = out[iv[by]]
        row[0] += iv["gpu"] * dt
        row[1] += iv["cpu"] * dt
        row[2] += iv["mem"] * dt
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _got(path: Path, by: str, lo: int | None = None, hi: int | None = None, leaves_only: bool = True
         ) -> dict[str, tuple[int, int, int]]:
    report = usage(FileEventLog(path, readonly=True).scan(), by, lo, hi)
    parents = {r.parent for r in report.rows.values() if r.parent}
    return {r.name: (r.gpu_milli_ns, r.cpu_milli_ns, r.memory_byte_ns) for r in report.rows.values()
            if not (leaves_only and by == "queue" and r.name in parents)}


@pytest.mark.parametrize("by", ["queue", "namespace", "job"])
def test_usage_matches_an_independent_sum(chargeback: Path, day: Path, by: str) -> None:
    for path in (GOLDEN, chargeback, day):
        assert _got(path, by) == _expected(path, by), path.name


def test_a_window_charges_only_what_falls_inside(chargeback: Path, day: Path) -> None:
    for path in (chargeback, day):
        _, first, _, _ = _intervals(path)
        lo, hi = first + 30 * 60 * 10**9, first + 2 * HOUR - 7
        assert _got(path, "namespace", lo, hi) == _expected(path, "namespace", lo, hi)


def test_chargeback_numbers_by_hand(chargeback: Path) -> None:
    report = usage(FileEventLog(chargeback, readonly=True).scan(), "queue")
    rows = report.rows
    # team-a: 4 GPUs for 2 h + half a GPU for 30 min; its quota is 2 GPUs
    assert rows["team-a"].gpu_milli_ns == (4000 * 2 + 500 // 2) * HOUR
    assert rows["team-a"].gpu_over_quota_milli_ns == (2000 * 2 + 500 // 2) * HOUR
    # team-b: 10 GiB of a 40 GiB GPU (250 milli-GPU) for 1 h; 2 GPUs from 20 min to the log's last
    # event (2 h: the run went on to 3 h, but nothing more was logged), within its quota of 4
    assert rows["team-b"].gpu_milli_ns == 250 * HOUR + 2000 * (HOUR * 100 // 60)
    assert rows["team-b"].gpu_over_quota_milli_ns == 0
    assert report.still_running == 1
    # the parent totals its children; with no GPU quota of its own it is never over it
    assert rows["research"].gpu_milli_ns == rows["team-a"].gpu_milli_ns + rows["team-b"].gpu_milli_ns
    assert rows["research"].parent is None and rows["team-a"].parent == "research"
    assert hours(rows["team-a"].gpu_milli_ns, 1000) == "8.250000"


def test_over_quota_matches_a_sweep_over_interval_endpoints(day: Path) -> None:
    for path in (GOLDEN, day):
        intervals, _, _, quota = _intervals(path)
        points = sorted({iv["start"] for iv in intervals} | {iv["end"] for iv in intervals})
        expected: dict[str, int] = defaultdict(int)
        for a, b in zip(points, points[1:]):
            held: dict[str, int] = defaultdict(int)
            for iv in intervals:
                if iv["start"] <= a and iv["end"] >= b:
                    for q in iv["queues"]:
                        held[q] += iv["gpu"]
            for q, milli in held.items():
                if quota.get(q, -1) >= 0 and milli > quota[q]:
                    expected[q] += (milli - quota[q]) * (b - a)
        report = usage(FileEventLog(path, readonly=True).scan(), "queue")
        charged = {q for iv in intervals for q in iv["queues"]}
        assert {q: report.rows[q].gpu_over_quota_milli_ns for q in charged} == {q: expected[q] for q in charged}
        assert any(expected.values())
    # by hand on the golden log: team-a's 12 GPUs against its quota of 4, for the 10 minutes until
    # team-b's finetune reclaims the gang (kai-es/v6) and for the 2 h of its rerun from t+45m
    golden = usage(FileEventLog(GOLDEN, readonly=True).scan(), "queue").rows
    assert golden["team-a"].gpu_over_quota_milli_ns == 8000 * (2 * HOUR + 10 * 60 * 10**9)


def test_cli_outputs(chargeback: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kai_es", "usage", str(chargeback), *args], cwd=ROOT,
                              capture_output=True, text=True)

    rows = list(csv.DictReader(io.StringIO(cli("--by", "job", "-o", "csv").stdout)))
    assert {r["job"] for r in rows} == set(_expected(chargeback, "job"))
    data = json.loads(cli("--from", "2026-01-01T00:30:00Z", "--until", "1h", "-o", "json").stdout)
    team_a = next(r for r in data["rows"] if r["name"] == "team-a")
    # 30 min of a-train's 4 GPUs, and the last 10 min of a-infer's half GPU (it ran 10..40 min)
    assert team_a["gpuMilliNs"] == 4000 * HOUR // 2 + 500 * 10 * 60 * 10**9
    table = cli()
    assert table.returncode == 0 and "still held capacity at the log's last event" in table.stdout
    bad = cli("--from", "soon")
    assert bad.returncode == 2 and "--from" in bad.stderr and "Traceback" not in bad.stderr
