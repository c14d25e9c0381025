"""Fault tests: real broker, real `kai-es scheduler` / `kai-es binder` processes, a 2,000-pod
simulated workload (time-scaled), and faults: kill -9 of either process (repeatedly), a broker
restart, a malformed record written raw into the topic.

Which equality holds. Both processes run on (scaled) wall-clock time, so which pods are pending
at each cycle — and therefore the decisions — depend on timing; a faulty run cannot reproduce a
fault-free run's log or final digest byte for byte (two fault-free runs do not either). What must
hold, and is asserted (tests/kafka/procs.py `end_checks`): no pod bound twice (no two PodBound
for one uid, the simulated cluster never refused a bind because the pod was bound elsewhere,
and no decision was performed twice on a live cluster); every binding decision has exactly one
outcome; nothing lost (every submitted pod was bound; none is left except Pending with
reasons); `replay` re-derives every recorded cycle byte for byte (abandoned cycles allowed);
strict invariants of the final folded state. The byte-exact equality that DOES hold is replay's:
the log itself is a deterministic function of its inputs.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]

from tests.kafka.procs import (ROOT, Proc, end_checks, http_get, live_binds, served_address, workload_done,
                              workload_scenario)

PODS = 2000
SCALE = "240"
RUN_TIMEOUT_S = 150


class Run:
    def __init__(self, bootstrap: str, topic: str, tmp: Path, pods: int = PODS) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.tmp = tmp
        self.pods = pods
        self.scenario = workload_scenario(tmp / "workload.yaml", pods=pods, nodes=16)
        self.stats = tmp / "binder-stats.jsonl"
        base = f"kafka://{bootstrap}/{topic}"
        # (each serves its probes and metrics, as the Helm chart always runs them)
        self.binder = Proc("binder", ["binder", "--log", f"{base}?transactional_id=kai-es-binder.{topic}",
                                      "--scenario", str(self.scenario), "--time-scale", SCALE,
                                      "--poll", "30ms", "--stats", str(self.stats), "-v",
                                      "--http-bind-address", "127.0.0.1:0"], tmp)
        self.scheduler = Proc("scheduler", ["scheduler", "--log",
                                            f"{base}?transactional_id=kai-es-scheduler.{topic}",
                                            "--scenario", str(self.scenario), "--time-scale", SCALE,
                                            "--period", "150ms", "--snapshot-every", "2", "-v",
                                            "--http-bind-address", "127.0.0.1:0"], tmp)

    def start(self) -> None:
        self.binder.start()
        self.binder.wait_ready("binder")
        self.scheduler.start()
        self.scheduler.wait_ready("scheduler")

    def wait_done(self, timeout: float = RUN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        why = ""
        while time.monotonic() < deadline:
            for proc in (self.binder, self.scheduler):
                assert proc.alive(), f"{proc.name} died:\n{proc.stderr()[-3000:]}"
            done, why = workload_done(self.bootstrap, self.topic, self.pods)
            if done:
                return
            time.sleep(2)
        raise AssertionError(f"workload not finished after {timeout} s: {why}\n"
                             f"scheduler:\n{self.scheduler.stderr()[-2000:]}\n"
                             f"binder:\n{self.binder.stderr()[-2000:]}")

    def kill_all(self) -> None:
        for proc in (self.scheduler, self.binder):
            proc.kill9()


@pytest.fixture
def run(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> Iterator[Run]:
    r = Run(kafka_bootstrap, unique_name, tmp_path)
    try:
        yield r
    finally:
        r.kill_all()


def _kill_repeatedly(run: Run, proc: Proc, rng: random.Random, max_kills: int,
                     word: str, *, sometimes_after: str | None = None) -> None:
    """kill -9 `proc` at random moments until the workload is done or `max_kills` reached;
    with `sometimes_after`, every fourth kill waits until the current start wrote that text
    (so that what a restart should find — a snapshot — exists whatever the machine's speed)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while proc.kills < max_kills and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 1.2))
        if sometimes_after is not None and proc.kills % 4 == 1:
            while sometimes_after not in proc.current_stderr() and live_binds(run.stats) < run.pods:
                assert proc.alive() and time.monotonic() < deadline, proc.stderr()[-3000:]
                time.sleep(0.1)
        if live_binds(run.stats) >= run.pods:
            break
        proc.kill9()
        time.sleep(rng.uniform(0.0, 0.5))
        proc.start()
        if proc.kills % 3 == 0:  # sometimes kill during start-up too; otherwise let it work
            continue
        proc.wait_ready(word)


def _report(name: str, numbers: dict[str, Any]) -> None:
    print(f"\n{name}: {numbers}", file=sys.stderr)


def test_scheduler_killed_repeatedly(run: Run) -> None:
    t = time.monotonic()
    run.start()
    _kill_repeatedly(run, run.scheduler, random.Random(1), 20, "scheduler",
                     sometimes_after="bytes stored) written to")
    kills = run.scheduler.kills
    run.wait_done()
    numbers = end_checks(run.bootstrap, run.topic, run.pods, run.stats)
    stderr = run.scheduler.stderr()
    _report("scheduler kill -9", {"kills": kills, "wall_s": round(time.monotonic() - t, 1),
                                  "restartsFromSnapshot": stderr.count("(snapshot at"), **numbers})
    assert kills >= 8, f"only {kills} kills happened before the workload finished"
    assert "(snapshot at" in stderr, "no restart used a snapshot"
    assert "rejected" not in stderr


def test_binder_killed_repeatedly(run: Run) -> None:
    t = time.monotonic()
    run.start()
    _kill_repeatedly(run, run.binder, random.Random(2), 20, "binder")
    kills = run.binder.kills
    run.wait_done()
    numbers = end_checks(run.bootstrap, run.topic, run.pods, run.stats)
    _report("binder kill -9", {"kills": kills, "wall_s": round(time.monotonic() - t, 1),
                               "rebuilds": run.binder.stderr().count("cluster rebuilt"), **numbers})
    assert kills >= 8, f"only {kills} kills happened before the workload finished"
    assert "does not re-apply" not in run.binder.stderr()


def test_broker_restart_mid_run(run: Run, kafka_broker: Any) -> None:
    t = time.monotonic()
    run.start()
    time.sleep(6)
    t_restart = time.monotonic()
    kafka_broker.restart()
    restart_s = time.monotonic() - t_restart
    run.wait_done()
    numbers = end_checks(run.bootstrap, run.topic, run.pods, run.stats)
    # the scheduler went on serving its metrics, from the session its restart began (one metrics
    # object per process: a second one on the registry failed every session after the first)
    status, text = http_get(served_address(run.scheduler) + "/metrics")
    assert status == 200 and 'kai_es_queue_quota{' in text, text[-2000:]
    restarts = re.search(r"^kai_es_session_restarts_total (\S+)", text, re.M)
    assert "DuplicateTimeseries" not in run.scheduler.stderr()
    _report("broker restart", {"restart_s": round(restart_s, 1), "wall_s": round(time.monotonic() - t, 1),
                               "schedulerSessionRestarts": float(restarts.group(1)) if restarts else None,
                               **numbers})


async def _produce_raw(bootstrap: str, topic: str, value: bytes | None) -> int:
    """`value` (None: a record without one) produced as it is, by no kai-es writer; its offset."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, value=value, key=b"garbage", partition=0)
        return int(meta.offset)
    finally:
        await producer.stop()


async def _dead_letter_keys(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(f"{topic}.deadletter", 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        keys = []
        while await consumer.position(tp) < end:
            for msg in (await consumer.getmany(tp, timeout_ms=500)).get(tp, ()):
                keys.append(msg.key)
        return keys
    finally:
        await consumer.stop()


def test_malformed_record_mid_run(run: Run) -> None:
    from kai_es.app.processes import dead_letter_report  # noqa: PLC0415

    run.start()
    time.sleep(5)
    bad = anyio.run(_produce_raw, run.bootstrap, run.topic, b'{"specversion": "1.0", "type": ')
    run.wait_done()
    numbers = end_checks(run.bootstrap, run.topic, run.pods, run.stats)
    assert numbers["deadLetters"] == [bad]
    assert str(bad).encode() in anyio.run(_dead_letter_keys, run.bootstrap, run.topic)
    url = f"kafka://{run.bootstrap}/{run.topic}"
    out = subprocess.run([sys.executable, "-m", "kai_es", "replay", url], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK:" in out.stdout
    report = dead_letter_report(url)
    assert f"offset {bad}" in report, report
    _report("malformed record", {"offset": bad, "replay": out.stdout.strip(), "report": report,
                                 **numbers})
