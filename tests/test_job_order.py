"""KAI's `/get-job-order` (its `reflectjoborder` plugin's endpoint) on kai-es's scheduler: the
last cycle's tried order in KAI's shape, so a tool or agent written for KAI asks kai-es the same
way (`kai_es.visibility.job_order`, `kai_es.adapters.status_http`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.adapters.scheduler_metrics import SchedulerMetrics
from kai_es.adapters.status_http import ProcessStatus, StatusServer
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest.translate import subject_of
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.services.scheduler import SchedulerService
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.visibility.job_order import job_order
from tests.builders import MakeNode, MakePod, queue, scenario_text
from tests.test_policy_v13 import _short, _teams

SEC = 1_000_000_000


def _get(server: StatusServer, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://{server.address}{path}", timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def test_the_document_is_kais_shape_with_the_order_the_cycle_used() -> None:
    records = _teams()
    state = ClusterState()
    for record in records:
        apply(state, record)
        if isinstance(record.envelope.data, p.CycleCompleted):
            break
    doc = job_order(state)
    assert doc is not None and sorted(doc) == ["global_order", "queue_order"]
    assert [_short(e["id"]) for e in doc["global_order"]] == ["a-1", "b-1", "a-2"]
    assert all(e["priority"] == state.jobs[e["id"]].priority and sorted(e) == ["id", "priority"]
               for e in doc["global_order"])
    assert {q: [_short(e["id"]) for e in entries] for q, entries in doc["queue_order"].items()} == {
        "team-a": ["a-1", "a-2"], "team-b": ["b-1"]}
    assert job_order(ClusterState()) is None  # no cycle recorded an order


async def _scheduler(status: ProcessStatus, version: str | None = None) -> SchedulerService:
    spec: dict[str, Any] = {"start": "2026-01-01T12:00:00Z"}
    if version is not None:
        spec["scheduler"] = {"policyVersion": version}
    pods = [MakePod(f"j{i}").gpu(2) for i in range(1, 5)]  # four 2-GPU jobs on a 4-GPU node
    sc = load_scenario_text(scenario_text(MakeNode("n1").gpus(4).obj(), queue("team-a"),
                                          *(pod.obj() for pod in pods), settings=spec), "order.yaml")
    log = MemoryEventLog()
    await log.append([make_envelope(o.payload, event_id=f"e-{i}", source="test",  # type: ignore[arg-type]
                                    subject=subject_of(o.payload), logicaltime=10 * SEC)
                      for i, o in enumerate(sc.initial())])
    sched = SchedulerService(log, sc.config, load_packer("reference"), SimClock(20 * SEC), SeededIds("o"),
                             observer=SchedulerMetrics(status.registry, status=status))
    await sched.start()
    return sched


async def test_the_scheduler_serves_it_after_each_cycle() -> None:
    status = ProcessStatus("scheduler")
    sched = await _scheduler(status)
    server = StatusServer(status, "127.0.0.1:0")
    try:
        code, _, body = _get(server, "/get-job-order")
        assert code == 503 and b"no cycle has completed yet" in body
        await sched.run_cycle_once()
        code, ctype, body = _get(server, "/get-job-order")
        assert code == 200 and ctype == "application/json"
        doc = json.loads(body)
        assert [e["id"] for e in doc["global_order"]] == sched.state.tried_order
        assert [_short(e["id"]) for e in doc["queue_order"]["team-a"]] == ["j1", "j2", "j3", "j4"]
        await sched.run_cycle_once()  # j1 and j2 run: the next cycle tries j3 and j4
        doc = json.loads(_get(server, "/get-job-order")[2])
        assert [_short(e["id"]) for e in doc["global_order"]] == ["j3", "j4"]
    finally:
        server.close()


async def test_an_older_policy_says_why_there_is_none_and_other_processes_have_no_such_endpoint() -> None:
    status = ProcessStatus("scheduler")
    sched = await _scheduler(status, "kai-es/v12")
    server = StatusServer(status, "127.0.0.1:0")
    try:
        await sched.run_cycle_once()
        code, _, body = _get(server, "/get-job-order")
        assert code == 503 and b"policy kai-es/v12 records no order (kai-es/v13 on)" in body
    finally:
        server.close()
    other = StatusServer(ProcessStatus("binder"), "127.0.0.1:0")
    try:
        assert _get(other, "/get-job-order")[0] == 404
    finally:
        other.close()


def test_kai_es_serve_answers_it_for_any_log_it_follows() -> None:
    """`kai-es serve`'s site answers `/get-job-order` from the log it follows, the same document
    the scheduler published at that point; a log that recorded no order is a 404 saying so."""
    import threading

    from kai_es.serve.follow import Follower
    from kai_es.serve.http import Site
    from kai_es.visibility.live import LiveView

    def site_over(records: list[Any]) -> Site:
        view, lock = LiveView(), threading.Lock()
        for record in records:
            view.feed(record)
        return Site(view, lock, Follower(MemoryEventLog(), view, lock), source="memory:",
                    job_records=lambda: iter(records))

    records = _teams()
    state = ClusterState()
    for record in records:
        apply(state, record)
    status, ctype, body = site_over(records).handle("/get-job-order")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body) == job_order(state)
    status, _, body = site_over(_teams("kai-es/v12")).handle("/get-job-order")
    assert status == 404 and b"recorded one (policy kai-es/v13 on)" in body
