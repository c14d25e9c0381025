"""Helpers for tests that run `kai-es scheduler` / `kai-es binder` as real processes against the
real test broker: a workload scenario generator, process handles that are always killed, and
the end-of-run checks (fold the topic; invariants; replay)."""

from __future__ import annotations

import collections
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.kafka_log import KafkaEventLog
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.invariants import check
from kai_es.state.reducer import fold

from tests.processes import ROOT, Proc

__all__ = ["ROOT", "Proc"]


async def append_file_log(bootstrap: str, topic: str, path: Path) -> int:
    """The file log at `path` appended to `topic` (fresh) as one transaction, so that its offsets
    are the file's positions; its length."""
    records = list(FileEventLog(path, readonly=True).scan())
    log = KafkaEventLog(bootstrap, topic, transactional_id=f"{topic}-w")
    try:
        positions = await log.append([r.envelope for r in records])
    finally:
        await log.close()
    assert positions == [r.position for r in records]
    return len(records)


def workload_scenario(path: Path, *, pods: int, nodes: int = 8, gpus: int = 8,
                      spread_s: int = 1200, run_for_s: int = 120) -> Path:
    """`pods` one-GPU pods in two queues, submitted over `spread_s` simulated seconds, each
    running `run_for_s`; `nodes` x `gpus` GPUs. A few pods ask for 2 GPUs or half a GPU.
    The scheduler runs allocate alone: the fault tests count exactly `pods` pods, and reclaim
    (on by default from kai-es/v3) evicts some when the two queues contend, and the simulated
    cluster recreates them as new pods."""
    docs = [f"""apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {{name: {path.stem}}}
spec:
  scheduler: {{stateDigestEvery: 1, actions: [allocate]}}
"""]
    for n in range(nodes):
        docs.append(f"""apiVersion: v1
kind: Node
metadata: {{name: node-{n:02d}}}
status: {{allocatable: {{cpu: "64", memory: 512Gi, nvidia.com/gpu: "{gpus}", pods: "110"}}}}
""")
    for q in ("team-a", "team-b"):
        docs.append(f"""apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {{name: {q}}}
""")
    for i in range(pods):
        q = "team-a" if i % 3 else "team-b"
        submit = i * spread_s // pods
        gpu = '"2"' if i % 17 == 0 else '"1"'
        docs.append(f"""apiVersion: v1
kind: Pod
metadata:
  name: w-{i:05d}
  labels: {{kai.scheduler/queue: {q}}}
  annotations: {{kai-es.io/submit-after: {submit}s, kai-es.io/run-for: {run_for_s + (i % 7) * 10}s}}
spec:
  schedulerName: kai-scheduler
  containers: [{{name: c, resources: {{requests: {{cpu: "1", memory: 4Gi, nvidia.com/gpu: {gpu}}}}}}}]
""")
    path.write_text("---\n".join(docs))
    return path


def live_binds(stats_path: Path) -> int:
    """Binds the binder processes performed so far (their --stats files; cheap to read)."""
    import json

    last: dict[int, int] = {}
    if stats_path.exists():
        for line in stats_path.read_text().splitlines():
            row = json.loads(line)
            last[row["pid"]] = row["binds"]
    return sum(last.values())


def read_topic(bootstrap: str, topic: str) -> tuple[list[Record], list[Any]]:
    """Every committed record of the topic, and the dead letters met on the way."""
    events = KafkaEventLog(bootstrap, topic, create=False)

    async def go() -> list[Record]:
        try:
            return [r async for r in events.read(0)]
        finally:
            await events.close()

    records = anyio.run(go)
    return records, list(events.dead_letters)


@dataclass
class Outcome:
    records: list[Record]
    state: ClusterState
    pods_submitted: int
    bound: dict[str, int]            # uid -> number of PodBound
    decided: dict[str, int]          # decision id -> number of outcomes
    unschedulable_last: set[str]


def analyse(records: list[Record]) -> Outcome:
    state = fold(records)
    bound: collections.Counter[str] = collections.Counter()
    decided: dict[str, int] = {}
    submitted: set[str] = set()
    for r in records:
        d = r.envelope.data
        if isinstance(d, p.PodObserved) and d.name.startswith("w-"):
            submitted.add(d.uid)
        elif isinstance(d, p.BindingDecided):
            decided.setdefault(r.envelope.id, 0)
        elif isinstance(d, (p.PodBound, p.PodBindFailed)):
            decided[d.decision_id] = decided.get(d.decision_id, 0) + 1
            if isinstance(d, p.PodBound):
                bound[d.uid] += 1
    return Outcome(records=records, state=state, pods_submitted=len(submitted), bound=dict(bound),
                   decided=decided, unschedulable_last=set())


def workload_done(bootstrap: str, topic: str, pods: int) -> tuple[bool, str]:
    records, _ = read_topic(bootstrap, topic)
    out = analyse(records)
    ours_left = [k for k in out.state.pods if k.startswith("default/w-")]
    waiting = [d for d, n in out.decided.items() if n == 0]
    done = (out.pods_submitted == pods and len(out.bound) == pods and not ours_left
            and not waiting)
    return done, (f"{len(records)} records, {out.pods_submitted}/{pods} submitted, "
                  f"{len(out.bound)} bound, {len(ours_left)} in state, {len(waiting)} decisions "
                  "without outcome")


def end_checks(bootstrap: str, topic: str, pods: int, stats_path: Path | None) -> dict[str, Any]:
    """The strong invariants after a (faulty) run; returns measured numbers."""
    records, dead = read_topic(bootstrap, topic)
    out = analyse(records)
    twice = {u: n for u, n in out.bound.items() if n > 1}
    assert not twice, f"pods bound twice: {list(twice.items())[:5]}"
    wrong = [(d, n) for d, n in out.decided.items() if n != 1]
    assert not wrong, f"decisions without exactly one outcome: {wrong[:5]}"
    refused = [r for r in records if isinstance(r.envelope.data, p.PodBindFailed)
               and "already bound" in r.envelope.data.message]
    assert not refused, f"the cluster saw a double bind: {refused[0].envelope.data}"
    assert out.pods_submitted == pods, f"{out.pods_submitted}/{pods} pods ever observed"
    for key, pod in out.state.pods.items():
        if key.startswith("default/w-"):
            assert pod.status == "Pending" and pod.last_unschedulable, \
                f"pod {key} lost: {pod.status} without reasons"
    never = pods - len(out.bound) - sum(1 for k in out.state.pods if k.startswith("default/w-"))
    assert never <= 0, f"{never} pods neither bound nor pending"
    violations = check(out.state, strict=True)
    assert not violations, violations[:5]
    result = replay(records, load_packer("native"))
    assert result.divergence is None, result.divergence
    stats: dict[str, int] = collections.Counter()
    if stats_path is not None and stats_path.exists():
        import json

        last: dict[int, dict[str, int]] = {}
        for line in stats_path.read_text().splitlines():
            row = json.loads(line)
            last[row["pid"]] = row
        for row in last.values():
            for k, v in row.items():
                if k != "pid":
                    stats[k] += v
        assert stats["already"] == 0, f"a decision was performed twice on a live cluster: {stats}"
        assert stats["refusedOtherNode"] == 0, stats
    cycles_started = sum(1 for r in records if isinstance(r.envelope.data, p.CycleStarted))
    return {"records": len(records), "cycles": result.cycles, "abandoned": result.abandoned,
            "cyclesStarted": cycles_started, "decisions": result.decisions,
            "bound": len(out.bound), "deadLetters": [d.offset for d in dead], **stats}


def served_address(proc: Proc) -> str:
    """The base URL a process started with `--http-bind-address` serves on (from its log)."""
    match = re.search(r"serving /healthz, /readyz and /metrics on (http://\S+)", proc.stderr())
    assert match, proc.stderr()[-2000:]
    return match.group(1)


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
