"""The audit side against a REAL broker: `kai-es explain` on `kafka://`, `kai-es events --follow`
with resume, and the example consumer (tools/audit_consumer.py: aiokafka, read_committed,
every event validated against its JSON Schema)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
from aiokafka import AIOKafkaProducer

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.kafka_log import KafkaEventLog
from kai_es.explain import explain
from tests.kafka.procs import append_file_log
from tests.processes import Follower

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "quickstart.events.jsonl"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


async def _golden_topic(bootstrap: str, topic: str) -> int:
    """The golden log appended as one transaction (so offsets equal its positions); its length."""
    return await append_file_log(bootstrap, topic, GOLDEN)


async def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process([sys.executable, *args], cwd=REPO, env=ENV, check=False)


async def test_explain_reads_a_kafka_log(kafka_bootstrap: str, unique_name: str) -> None:
    await _golden_topic(kafka_bootstrap, unique_name)
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    proc = await _run("-m", "kai_es", "explain", url, "default/finetune-1", "-o", "json")
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout) == explain(FileEventLog(GOLDEN, readonly=True).scan(), "default/finetune-1")
    usage = await _run("-m", "kai_es", "usage", url, "-o", "json")
    assert usage.returncode == 0, usage.stderr.decode()
    assert {r["name"] for r in json.loads(usage.stdout)["rows"]} == {"research", "team-a", "team-b"}


async def test_events_follow_streams_new_events_and_resumes(kafka_bootstrap: str, unique_name: str) -> None:
    count = await _golden_topic(kafka_bootstrap, unique_name)
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    records = list(FileEventLog(GOLDEN, readonly=True).scan())
    following = Follower(["events", url, "--follow", "-o", "json", "--from", str(count - 2), "--limit", "5"],
                         timeout_s=60, env=ENV)
    with following as follower:
        first = json.loads(follower.stdout.readline() if follower.stdout else b"")  # it is reading
        assert first["position"] == count - 2
        log = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"{unique_name}-w2")
        try:  # three more events, appended while it follows
            later = await log.append([r.envelope for r in records[:3]])
        finally:
            await log.close()
        out = follower.stdout.read() if follower.stdout else b""  # the rest, from the same buffer
        follower.wait(timeout=60)
    assert following.returncode == 0, following.stderr
    rows = [first] + [json.loads(line) for line in out.decode().splitlines()]
    assert [r["position"] for r in rows] == [count - 2, count - 1, *later]
    assert [r["event"]["id"] for r in rows[2:]] == [r.envelope.id for r in records[:3]]
    # resuming from the last position seen + 1 gives exactly what follows, nothing twice
    resumed = await _run("-m", "kai_es", "events", url, "-o", "json", "--from", str(rows[2]["position"] + 1))
    assert [json.loads(line)["position"] for line in resumed.stdout.decode().splitlines()] == later[1:]


async def test_example_consumer_validates_every_committed_event(kafka_bootstrap: str, unique_name: str) -> None:
    count = await _golden_topic(kafka_bootstrap, unique_name)
    # an aborted transaction holding a record that is no event at all: read_committed never sees it
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-abort")
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(unique_name, b"not an event", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    tool = str(REPO / "tools" / "audit_consumer.py")
    base = [tool, "--bootstrap", kafka_bootstrap, "--topic", unique_name]
    proc = await _run(*base, "--print")
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"{count} events valid, 0 invalid" in proc.stderr.decode()
    printed = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [p["position"] for p in printed] == list(range(count))
    # resume: the first part, then from the position it reports, gives every event exactly once
    part = await _run(*base, "--limit", "30", "--print")
    resume_at = int(part.stderr.decode().rsplit("next position: ", 1)[1])
    assert resume_at == 30
    rest = await _run(*base, "--from", str(resume_at), "--print")
    ids = [json.loads(line)["event"]["id"] for line in (part.stdout + rest.stdout).decode().splitlines()]
    assert ids == [p["event"]["id"] for p in printed]
    # a committed record that breaks its schema is named, with its position, and fails the run
    pod_event = next(p["event"] for p in printed if p["event"]["type"] == "kai.cluster.pod.observed")
    bad = json.loads(json.dumps(pod_event))
    del bad["data"]["name"]
    bad["id"] = "broken"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(unique_name, json.dumps(bad).encode(), partition=0)
    finally:
        await producer.stop()
    broken = await _run(*base, "--from", str(count))
    assert broken.returncode == 1
    assert f"position {meta.offset}: kai.cluster.pod.observed v" in broken.stderr.decode()
    assert "'name' is a required property" in broken.stderr.decode()
