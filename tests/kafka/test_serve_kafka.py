"""`kai-es serve kafka://…` against a real broker: the view folds what the topic holds, answers
while it does, and follows records appended later (through the same EventLog port as a file
log). The pages themselves are tested in tests/test_serve_pages.py and, in a browser,
tests/test_serve_browser.py."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import msgspec

from kai_es.adapters.kafka_log import KafkaEventLog
from kai_es.app import open_log
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.explain import explain, explain_queue
from kai_es.ports import EventLog
from kai_es.serve.follow import Follower
from kai_es.serve.http import Site, records_at
from kai_es.visibility import pages
from kai_es.visibility.live import LiveView
from tests.kafka.procs import ROOT
from tests.test_serve_timeline import _jobs
from tests.test_serve_timeline import _records as _memory_records

SCENARIO = ROOT / "tests" / "scenarios" / "hierarchy-quota-order.yaml"


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback, a URL the test made
        return int(resp.status), resp.read().decode()


def _wait_position(base: str, want: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        _, last = _get(base + "api/position")
        if int(last) >= want:
            return
        time.sleep(0.2)
    raise AssertionError(f"kai-es serve folded {last.strip()} of {want} records after {timeout_s}s")


async def _append(bootstrap: str, topic: str, envelopes: list[Envelope], writer: str) -> None:
    log = KafkaEventLog(bootstrap, topic, transactional_id=writer)
    try:
        for start in range(0, len(envelopes), 500):
            await log.append(envelopes[start:start + 500])
    finally:
        await log.close()


def test_serve_folds_a_kafka_topic_and_follows_what_is_appended(kafka_bootstrap: str, unique_name: str,
                                                                 tmp_path: Path) -> None:
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    sim = subprocess.run([sys.executable, "-m", "kai_es", "simulate", str(SCENARIO), "--log", url,
                          "--report", str(tmp_path / "report")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert sim.returncode == 0, sim.stderr[-2000:]
    records = _records(url)
    assert len(records) > 10
    proc = subprocess.Popen([sys.executable, "-m", "kai_es", "serve", url, "--bind", "127.0.0.1:0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+/)", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        base = found.group(1)
        _wait_position(base, len(records))
        # the queue's numbers at the last cycle, as `kai-es explain --queue` gives them
        want = explain_queue(records, "team-a1")
        status, page = _get(base + "queue?name=team-a1")
        assert status == 200
        last = want["runs"][-1]["numbers"]["gpu"]
        for field in ("fairShare", "allocated", "quota"):
            assert f'data-field="gpu.{field}" data-value="{last[field]}"' in page, (field, last, page[:3000])
        # appended after the view caught up: followed, not refolded
        observed = next(r.envelope for r in records if isinstance(r.envelope.data, p.QueueObserved))
        late = msgspec.structs.replace(observed, id=f"{unique_name}-late", subject="queue/late-queue",
                                       data=msgspec.structs.replace(observed.data, name="late-queue"))
        anyio.run(_append, kafka_bootstrap, unique_name, [late], f"{unique_name}-w2")
        _wait_position(base, len(records) + 1)
        status, events = _get(base + "events?subject=queue/late-queue")
        assert status == 200 and "late-queue" in events
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)  # (closes the pipes)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]  # SIGTERM: a clean stop


def _records(url: str) -> list[Record]:
    async def read() -> list[Record]:
        log = open_log(url, readonly=True)
        try:
            return [r async for r in log.read()]
        finally:
            await log.close()
    return anyio.run(read)


class _Starts:
    """A log whose reads note where they start (the rest is the log's own)."""

    def __init__(self, log: EventLog, starts: list[int]) -> None:
        self.log, self.starts = log, starts

    def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        self.starts.append(from_position)
        return self.log.read(from_position, follow=follow)

    async def close(self) -> None:
        await self.log.close()


def test_a_jobs_page_reads_its_records_by_offset(kafka_bootstrap: str, unique_name: str) -> None:
    """On a Kafka log a job's page reads the records of its timeline's events where they are
    (seeking to their offsets), never the topic from its start, and is `kai-es explain`'s page."""
    simulated = _memory_records("preempt-basic")
    anyio.run(_append, kafka_bootstrap, unique_name, [r.envelope for r in simulated], f"{unique_name}-w")
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    records = _records(url)  # (Kafka's offsets: the transaction markers take some)
    view, lock = LiveView(), threading.Lock()
    follower = Follower(open_log(url, readonly=True), view, lock)
    follower.start()
    deadline = time.monotonic() + 60
    while view.fed < len(records):
        assert time.monotonic() < deadline and follower.error is None, (view.fed, follower.error)
        time.sleep(0.05)
    from_start: list[int] = []
    starts: list[int] = []

    def job_records() -> Iterator[Record]:
        from_start.append(1)
        return iter(records)

    site = Site(view, lock, follower, source=url, job_records=job_records,
                records_at=records_at(open_log(url, readonly=True), lambda: _Starts(open_log(url, readonly=True), starts)))
    jobs = _jobs(records)
    assert len(jobs) >= 3
    for job in jobs:
        status, _, body = site.handle(f"/job?name={job}")
        assert status == 200, body
        assert pages.job_page(explain(records, job)) in body.decode(), job
    assert not from_start  # every page came from the kept timelines and reads by offset
    assert starts and min(starts) > records[0].position  # none read the topic from its start
