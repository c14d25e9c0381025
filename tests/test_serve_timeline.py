"""A job's timeline in `kai-es serve` is the one the view keeps while it folds
(`kai_es.visibility.timelines`), not `explain` over the log again; it must still be exactly what
`kai-es explain LOG NS/NAME` reports over the same records, at every cut, for every job: jobs
observed before and after the view began following, while cycles are open, and on a log that
grows while it is served."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.explain import ExplainError, event_positions, explain, resolve
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from kai_es.serve.follow import Follower
from kai_es.serve.http import Site, records_at
from kai_es.visibility import pages
from kai_es.visibility.live import LiveView

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "scenarios"
#: logs with waits held by limits, quotas and gangs, pipelining, preemption, reclaim, consolidation
#: moves, stale gangs and pods of another scheduler
NAMES = ("hierarchy-quota-order", "queue-limit", "gang-does-not-fit", "pipelined-onto-releasing", "preempt-basic",
         "reclaim-basic", "consolidation-basic", "stale-gang-eviction", "scheduler-name-beside-kai", "elastic-extras")


def _records(name: str) -> list[Record]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario(str(SCENARIOS / f"{name}.yaml")), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def _jobs(records: list[Record]) -> list[str]:
    """Every job key and owner of the log's pods, in the order first observed."""
    out: dict[str, None] = {}
    for record in records:
        data = record.envelope.data
        if isinstance(data, p.PodObserved):
            out.setdefault(f"{data.namespace}/{data.podgroup}")
            if data.owner is not None:
                out.setdefault(f"{data.namespace}/{data.owner.name}")
    return list(out)


def _explain(records: list[Record], name: str) -> dict[str, Any] | str:
    try:
        return explain(records, name)
    except ExplainError as exc:
        return str(exc)


def _kept(view: LiveView, records: list[Record], name: str) -> dict[str, Any] | None:
    report = view.timeline(name)
    if report is None:
        return None
    return resolve(report, {at: records[at] for at in event_positions(report)})


def _cuts(records: list[Record]) -> list[int]:
    """Cuts inside the log: a third, two thirds, and one while a cycle is open (after its start)."""
    n = len(records)
    starts = [r.position for r in records if isinstance(r.envelope.data, p.CycleStarted)]
    inside = starts[len(starts) // 2] + 2 if starts else n // 2
    return sorted({n // 3, inside, 2 * n // 3, n})


@pytest.mark.parametrize("name", NAMES)
def test_every_jobs_timeline_is_explains_at_every_cut(name: str) -> None:
    records = _records(name)
    view = LiveView()
    fed = 0
    late = 0
    for cut in _cuts(records):
        for record in records[fed:cut]:
            view.feed(record)
        jobs = _jobs(records[:cut])
        late += len(set(jobs) - set(_jobs(records[:fed])))
        fed = cut
        for job in jobs:
            want = _explain(records[:cut], job)
            assert isinstance(want, dict), (job, want)
            assert _kept(view, records, job) == want, (name, cut, job)
    assert late  # jobs observed after the view had folded a part of the log


def test_a_subject_without_a_kept_timeline_is_left_to_explain() -> None:
    records = _records("gang-does-not-fit")
    view = LiveView()
    for record in records:
        view.feed(record)
    pods = [f"{d.namespace}/{d.name}" for d in (r.envelope.data for r in records) if isinstance(d, p.PodObserved)]
    jobs = set(_jobs(records))
    assert any(pod not in jobs for pod in pods)
    for pod in pods:
        if pod not in jobs:
            assert view.timeline(pod) is None  # a pod that is not a job: explain it from the log
    job = next(iter(jobs))
    assert view.timeline(f"job/{job}") is None and view.timeline("default/nope") is None


def _pod(name: str, t: int, **kw: Any) -> p.PodObserved:
    return p.PodObserved(namespace="default", name=name, uid=f"u-{name}", podgroup=kw.pop("podgroup", name),
                         queue="q", gpu=p.GpuRequest(whole=kw.pop("gpus", 1)), created_ns=t, **kw)


def test_a_subject_named_before_its_job_was_observed_is_left_to_explain() -> None:
    """A pod named like a job observed later was followed by explain from its first record: the
    view, which starts a job's timeline at its first pod, must not claim that timeline."""
    t = 1_800_000_000 * 10**9
    payloads: list[tuple[p.Payload, str]] = [
        (p.QueueObserved(name="q", gpu=p.QueueResource(quota=8000)), "queue/q"),
        (p.NodeObserved(name="n", milli_cpu=64_000, memory_bytes=2**38, gpus=8, gpu_memory_mib=81920), "node/n"),
        (_pod("alone", t, podgroup="other"), "pod/default/alone"),  # pod default/alone, job default/other
        (_pod("member", t, podgroup="alone"), "pod/default/member"),  # job default/alone: named like the pod
        (_pod("stray", t, terminating=True), "pod/default/stray"),  # pending, but not in the pending index
        (p.CycleStarted(cycle=1, config_digest=""), "cycle/1"),
        (p.CycleCompleted(cycle=1, decisions=0), "cycle/1"),
    ]
    records = [Record(n, make_envelope(data, event_id=f"e{n}", source="test", subject=subject, logicaltime=t,
                                       basedon=5 if isinstance(data, p.CycleCompleted) else None))
               for n, (data, subject) in enumerate(payloads)]
    view = LiveView()
    for record in records:
        view.feed(record)
    assert view.timeline("default/alone") is None
    assert _kept(view, records, "default/other") == explain(records, "default/other")
    stray = explain(records, "default/stray")
    assert [e["kind"] for e in stray["timeline"]] == ["observed", "wait", "atEnd"]
    assert _kept(view, records, "default/stray") == stray


def _write(path: Path, records: list[Record]) -> None:
    log = FileEventLog(path)
    anyio.run(lambda: log.append([r.envelope for r in records]))


def _until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_served_timeline_is_explains_while_the_log_grows(tmp_path: Path) -> None:
    records = _records("preempt-basic")
    path = tmp_path / "served.events.jsonl"
    half = len(records) // 2
    _write(path, records[:half])
    log = FileEventLog(path, readonly=True)
    view, lock = LiveView(), threading.Lock()
    follower = Follower(log, view, lock)
    follower.start()
    read_from_start = []

    def job_records() -> Any:
        read_from_start.append(1)
        return FileEventLog(path, readonly=True).scan()

    site = Site(view, lock, follower, source=str(path), job_records=job_records, records_at=records_at(log))

    def page(job: str, upto: int) -> None:
        status, _, body = site.handle(f"/job?name={job}")
        assert status == 200, body
        assert pages.job_page(explain(records[:upto], job)) in body.decode(), job

    _until(lambda: view.fed == half)
    early = _jobs(records[:half])
    for job in early:
        page(job, half)
    _write(path, records[half:])  # the log grows while it is served
    _until(lambda: view.fed == len(records))
    later = [job for job in _jobs(records) if job not in early]
    assert later  # jobs first observed after the server began following
    for job in early + later:
        page(job, len(records))
    assert not read_from_start  # every page came from the kept timelines
    pod = next(f"{d.namespace}/{d.name}" for d in (r.envelope.data for r in records)
               if isinstance(d, p.PodObserved) and f"{d.namespace}/{d.name}" not in early + later)
    page(pod, len(records))  # a pod that is no job: explain over the log, the same page
    assert read_from_start


def test_records_are_read_by_position_near_or_far(tmp_path: Path) -> None:
    """A job's records are read in one pass where close together and one by one where far apart
    (`http.READ_GAP`): either way exactly the records asked for, in order, duplicates once."""
    t = 1_800_000_000 * 10**9
    records = [Record(n, make_envelope(_pod(f"p{n}", t), event_id=f"e{n}", source="test", subject=f"pod/default/p{n}",
                                       logicaltime=t)) for n in range(1200)]
    path = tmp_path / "positions.events.jsonl"
    _write(path, records)
    read = records_at(FileEventLog(path, readonly=True))
    assert read is not None
    wanted = [0, 1, 5, 300, 301, 700, 1199, 5, 1000]
    got = read(wanted)
    assert [r.position for r in got] == sorted(set(wanted))
    assert [r.envelope.id for r in got] == [records[at].envelope.id for at in sorted(set(wanted))]
    assert read([]) == []


@pytest.mark.parametrize("name", ["preempt-basic", "reclaim-basic"])
def test_finished_jobs_timelines_are_dropped_past_the_limit_and_read_from_the_log(name: str) -> None:
    """`kai-es serve --keep-timelines N`: past N kept timelines a cycle's end drops those of jobs
    with no pod left (evicted and removed here), oldest first; such a job's page is `explain`
    over the log, the same page; a job with a pod in the state keeps its timeline."""
    records = _records(name)
    view, lock = LiveView(keep_timelines=1), threading.Lock()
    for record in records:
        view.feed(record)
    jobs = _jobs(records)
    kept = set(view.timelines.timelines)
    dropped = [job for job in jobs if job not in kept]
    assert dropped  # evicted jobs, gone from the state, past a limit of 1
    pods = view.state.pods
    for job in kept:
        assert _kept(view, records, job) == explain(records, job), job
    for job in dropped:
        assert view.timeline(job) is None
        assert job not in pods and not any(pod.job_key == job for pod in pods.values()), job
    for job in jobs:  # a job with a pod in the state is never dropped
        if any(pod.job_key == job for pod in pods.values()):
            assert job in kept, job
    read_from_start: list[int] = []

    def job_records() -> Any:
        read_from_start.append(1)
        return iter(records)

    site = Site(view, lock, Follower(MemoryEventLog(), view, lock), source="memory", job_records=job_records)
    for job in dropped:
        status, _, body = site.handle(f"/job?name={job}")
        assert status == 200, body
        assert pages.job_page(explain(records, job)) in body.decode(), job
    assert read_from_start  # the dropped ones came from the log


def test_a_page_whose_records_the_log_no_longer_holds_says_so() -> None:
    """A kept timeline whose records the log lost since (a Kafka topic's retention) is a 404
    naming the positions, not a server error."""
    records = _records("preempt-basic")
    log = MemoryEventLog()
    view, lock = LiveView(), threading.Lock()
    for record in records:
        view.feed(record)
    job = _jobs(records)[0]
    site = Site(view, lock, Follower(log, view, lock), source="memory:", job_records=lambda: iter(records),
                records_at=lambda positions: [])
    status, _, body = site.handle(f"/job?name={job}")
    assert status == 404, body
    assert b"no longer holds its records at positions" in body
