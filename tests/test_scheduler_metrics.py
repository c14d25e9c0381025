"""The scheduler's dashboard metrics (`kai_es.adapters.scheduler_metrics`): the per-queue numbers
equal `kai-es fairshare` on the same cut, pending pods and jobs are counted per queue,
evictions by action and failed searches by reason come from the cycle's decisions, a pod's
wait runs from first observed to first bound in log time, actions and the upkeep between cycles
are timed; the /metrics
exposition carries them, and every query of the Grafana dashboard in deploy/ names a metric the
process exports."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.adapters.scheduler_metrics import SchedulerMetrics
from kai_es.adapters.status_http import ProcessStatus, StatusServer
from kai_es.app import open_log
from kai_es.app import processes
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest.translate import subject_of
from kai_es.oneshot import fairshare_report
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.services.scheduler import SchedulerService
from tests.builders import MakeNode, MakePod, queue, scenario_text

ROOT = Path(__file__).parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "kai-es-queues.json"
SEC = 1_000_000_000


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def _scheduler(text: str, registry: CollectorRegistry, ticks: list[float] | None = None
                     ) -> tuple[SchedulerService, MemoryEventLog]:
    sc = load_scenario_text(text, "metrics.yaml")
    log = MemoryEventLog()
    await log.append([make_envelope(o.payload, event_id=f"e-{i}", source="test",  # type: ignore[arg-type]
                                    subject=subject_of(o.payload), logicaltime=10 * SEC)
                      for i, o in enumerate(sc.initial())])  # (what arrives later is not observed)
    clock_ticks = iter(ticks or [])
    metrics = SchedulerMetrics(registry, clock=lambda: next(clock_ticks, 0.0))
    sched = SchedulerService(log, sc.config, load_packer("reference"), SimClock(20 * SEC), SeededIds("m"),
                             observer=metrics)
    await sched.start()
    return sched, log


async def test_queue_numbers_equal_kai_es_fairshare_and_pending_counts_follow_the_cycle() -> None:
    registry = CollectorRegistry()
    sched, _ = await _scheduler(QUICKSTART.read_text(), registry)
    assert sched.observer is not None
    sched.observer.on_cycle(sched.state, sched.config, [])  # the numbers at the scenario's start...
    report = fairshare_report(load_scenario(QUICKSTART))["queues"]  # ...as `kai-es fairshare` gives them
    assert report, "the quickstart has queues"
    for queue, entry in report.items():
        parent = entry["parent"] or ""
        for resource, numbers in entry["resources"].items():
            labels = {"queue": queue, "parent": parent, "resource": resource}
            scale = 1000 if resource in ("gpu", "cpu") else 1
            assert _value(registry, "kai_es_queue_fair_share", **labels) == numbers["fairShare"] / scale, labels
            quota = numbers["quota"]
            assert _value(registry, "kai_es_queue_quota", **labels) == (quota / scale if quota >= 0 else -1)
    decisions = await sched.run_cycle_once()
    bound = {(d.data.namespace, d.data.name) for d in decisions if isinstance(d.data, p.BindingDecided)}
    assert bound, "the quickstart binds pods in its first cycle"
    state = sched.state
    for queue in report:
        pending = sum(len(j.pending) for j in state.jobs.values() if j.queue == queue)
        assert _value(registry, "kai_es_queue_pending_pods", queue=queue, parent=report[queue]["parent"] or "") == pending
    gpus_held = sum(pod.milli_gpu for pod in state.pods.values() if pod.status in ("Binding", "Running"))
    leaves = [q for q, e in report.items() if not any(o["parent"] == q for o in report.values())]
    assert sum(_value(registry, "kai_es_queue_allocated", queue=q, parent=report[q]["parent"] or "",
                      resource="gpu") or 0 for q in leaves) == gpus_held / 1000


async def test_a_pods_wait_runs_from_first_observed_to_first_bound_in_log_time() -> None:
    registry = CollectorRegistry()
    sched, log = await _scheduler(QUICKSTART.read_text(), registry)
    decisions = await sched.run_cycle_once()
    first = next(d.data for d in decisions if isinstance(d.data, p.BindingDecided))
    queue = first.queue
    parent = sched.state.queues[queue].spec.parent
    await log.append([make_envelope(p.PodBound(namespace=first.namespace, name=first.name, uid=first.uid,
                                               node=first.node, decision_id="d"),
                                    event_id="bound-1", source="kai-es/binder",
                                    subject=f"pod/{first.namespace}/{first.name}", logicaltime=100 * SEC)])
    await sched.catch_up()
    assert _value(registry, "kai_es_pod_wait_seconds_count", queue=queue, parent=parent) == 1
    assert _value(registry, "kai_es_pod_wait_seconds_sum", queue=queue, parent=parent) == 90.0  # observed at 10 s, bound at 100 s
    await log.append([make_envelope(p.PodBound(namespace=first.namespace, name=first.name, uid=first.uid,
                                               node=first.node, decision_id="d"),
                                    event_id="bound-2", source="kai-es/binder",
                                    subject=f"pod/{first.namespace}/{first.name}", logicaltime=200 * SEC)])
    await sched.catch_up()
    assert _value(registry, "kai_es_pod_wait_seconds_count", queue=queue, parent=parent) == 1  # only the first bind counts


async def test_evictions_by_action_failed_searches_by_reason_and_action_durations() -> None:
    registry = CollectorRegistry()
    text = (ROOT / "tests" / "scenarios" / "v10-background-pods-give-way.yaml").read_text()
    # actions: allocate, consolidation, reclaim, preempt, stalegangeviction; the fake clock ticks
    sched, _ = await _scheduler(text, registry, ticks=[0.0, 0.5, 0.75, 1.0, 1.25, 3.25])
    await sched.run_cycle_once()
    # the victim's queue: the health check's, `maintenance`, a top queue
    assert _value(registry, "kai_es_evictions_total", action="backgroundpods", queue="maintenance", parent="") == 1
    assert _value(registry, "kai_es_action_duration_seconds_sum", action="allocate") == 0.5
    assert _value(registry, "kai_es_action_duration_seconds_sum", action="stalegangeviction") == 2.0
    assert _value(registry, "kai_es_action_duration_seconds_count", action="reclaim") == 1
    full = load_scenario_text(text, "x.yaml")
    assert full.config.action_list[0] == "allocate"
    reclaiming = (ROOT / "tests" / "scenarios" / "reclaim-bounded-no-room.yaml").read_text()
    registry2 = CollectorRegistry()
    sched2, _ = await _scheduler(reclaiming, registry2)
    decisions = await sched2.run_cycle_once()
    reasons = [(r.code, d.data.queue) for d in decisions if isinstance(d.data, p.PodUnschedulable)
               for r in d.data.reasons]
    assert {code for code, _ in reasons} >= {"VictimsCannotMakeRoom", "PreemptNotPossible"}
    for action, code in (("reclaim", "VictimsCannotMakeRoom"), ("preempt", "PreemptNotPossible")):
        for queue in {q for c, q in reasons if c == code}:  # by the waiting pod's queue
            assert _value(registry2, "kai_es_failed_victim_searches_total", action=action, reason=code, queue=queue,
                          parent=sched2.state.queues[queue].spec.parent) == reasons.count((code, queue))


async def test_the_upkeep_before_each_cycle_is_timed() -> None:
    registry = CollectorRegistry()
    sched, _ = await _scheduler(QUICKSTART.read_text(), registry, ticks=[])
    await sched.run(SEC, cycles=1)  # a cycle, then the wait before the next with its upkeep
    assert sched.upkeeps_run == 1
    assert _value(registry, "kai_es_scheduler_upkeep_duration_seconds_count") == 1
    assert (_value(registry, "kai_es_scheduler_upkeep_duration_seconds_sum") or 0.0) >= 0.0


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (identifiers that are not functions, keywords or labels)."""
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", without_ranges))
    grouping = set(re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", without_ranges))
    labels = {w.strip() for g in grouping for w in g.split(",")}
    functions = set(re.findall(r"([A-Za-z_]+)\s*\(", without_ranges)) | AGGREGATIONS
    return {w for w in words - labels - functions - {"by", "without", "le"} if not re.fullmatch(r"[0-9.]+", w)}


#: PromQL aggregation operators (they take `by (...)` before their parenthesis)
AGGREGATIONS = {"sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "stddev", "stdvar", "group"}


async def test_every_dashboard_query_names_a_metric_the_scheduler_exports() -> None:
    status = ProcessStatus("scheduler")
    # preempt-basic: evictions, failed searches and a pipelined pod, which the test then binds
    sched, log = await _scheduler((ROOT / "tests" / "scenarios" / "preempt-basic.yaml").read_text(),
                                  status.registry, ticks=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    decisions = await sched.run_cycle_once()
    bind = next(d.data for d in decisions if isinstance(d.data, p.PodPipelined))
    await log.append([make_envelope(p.PodBound(namespace=bind.namespace, name=bind.name, uid=bind.uid,
                                               node=bind.node, decision_id="d"), event_id="bound", source="binder",
                                    subject=f"pod/{bind.namespace}/{bind.name}", logicaltime=30 * SEC)])
    await sched.catch_up()  # (a labelled histogram shows once it has a sample: one pod bound)
    status.cycle_seconds.observe(0.01)
    server = StatusServer(status, "127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10) as response:  # noqa: S310
            text = response.read().decode()
    finally:
        server.close()
    exported = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)", text, re.M))
    assert "kai_es_queue_fair_share" in exported and "kai_es_evictions_total" in exported
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"]["query"].replace("label_values(", "").split(",")[0])
    assert len(exprs) >= 10
    for expr in exprs:
        names = _metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)


def test_the_metric_name_reader_finds_names_and_not_functions() -> None:
    assert _metric_names('histogram_quantile(0.95, sum by (le, queue) (rate(x_bucket{a="b"}[5m])))') == {"x_bucket"}
    assert _metric_names("sum by (queue) (a{resource=\"gpu\"}) / b") == {"a", "b"}


def _created_at(pod: dict[str, object], seconds: int) -> dict[str, object]:
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    meta["creationTimestamp"] = f"2026-01-01T00:00:{seconds:02d}Z"
    return pod


#: a KAI user's cluster: one 8-GPU node, a queue under a department, two one-GPU pods created 4 s
#: and 6 s after the scenario's start (2026-01-01T00:00:00Z)
TWO_PODS = scenario_text(
    MakeNode("n1").gpus(8).obj(), queue("dept", gpu_quota=8), queue("team-a", gpu_quota=8, parent="dept"),
    _created_at(MakePod("p1").gpu(1).obj(), 4), _created_at(MakePod("p2").gpu(1).obj(), 6))


async def _bind_all(log: MemoryEventLog, decisions: list[Envelope], at_ns: int) -> None:
    await log.append([make_envelope(p.PodBound(namespace=d.data.namespace, name=d.data.name, uid=d.data.uid,
                                               node=d.data.node, decision_id=d.id),
                                    event_id=f"bound-{d.id}", source="kai-es/binder",
                                    subject=f"pod/{d.data.namespace}/{d.data.name}", logicaltime=at_ns)
                      for d in decisions if isinstance(d.data, p.BindingDecided)])


async def test_a_later_session_folding_the_log_again_counts_no_wait_twice() -> None:
    registry = CollectorRegistry()
    first, log = await _scheduler(TWO_PODS, registry)
    await _bind_all(log, await first.run_cycle_once(), 100 * SEC)  # (told at 10 s)
    await first.catch_up()
    labels = {"queue": "team-a", "parent": "dept"}
    assert _value(registry, "kai_es_pod_wait_seconds_count", **labels) == 2
    # the process's next session (its log connection failed) folds the same log again from the
    # start, with the process's one metrics object
    again = SchedulerService(log, first.config, load_packer("reference"), SimClock(200 * SEC), SeededIds("m2"),
                             observer=first.observer)
    await again.start()
    await again.run_cycle_once()
    assert _value(registry, "kai_es_pod_wait_seconds_count", **labels) == 2
    assert _value(registry, "kai_es_pod_wait_seconds_sum", **labels) == 2 * 90.0


async def test_pods_a_restored_state_holds_pending_wait_from_their_creation() -> None:
    _, log = await _scheduler(TWO_PODS, CollectorRegistry())
    folded = SchedulerService(log, load_scenario_text(TWO_PODS, "x.yaml").config, load_packer("reference"),
                              SimClock(20 * SEC), SeededIds("f"))
    await folded.start()  # another process folded the pods' first observation (a snapshot)
    registry = CollectorRegistry()
    restored = SchedulerService(log, folded.config, load_packer("reference"), SimClock(20 * SEC), SeededIds("r"),
                                observer=SchedulerMetrics(registry))
    restored.state = folded.state  # as restore_snapshot leaves it
    await restored.start()
    start = load_scenario_text(TWO_PODS, "x.yaml").start_ns
    await _bind_all(log, await restored.run_cycle_once(), start + 100 * SEC)
    await restored.catch_up()
    labels = {"queue": "team-a", "parent": "dept"}
    assert _value(registry, "kai_es_pod_wait_seconds_count", **labels) == 2
    assert _value(registry, "kai_es_pod_wait_seconds_sum", **labels) == (100 - 4) + (100 - 6)


async def test_a_scheduler_process_whose_first_session_fails_serves_its_metrics_from_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "events.jsonl")
    sc = load_scenario_text(TWO_PODS, "x.yaml")
    log = open_log(url, fresh=True)
    await log.append([make_envelope(o.payload, event_id=f"e-{i}", source="test",
                                    subject=subject_of(o.payload), logicaltime=10 * SEC)
                      for i, o in enumerate(sc.initial())])
    await log.close()
    failed: list[str] = []

    def opening(url: str, **kwargs: Any) -> Any:  # the first session's log refuses its claim
        opened = open_log(url, **kwargs)
        if not failed:
            failed.append(url)

            async def refuse() -> None:
                raise ConnectionError("the broker went away")
            setattr(opened, "claim_writer", refuse)  # noqa: B010
        return opened

    monkeypatch.setattr(processes, "open_log", opening)
    status = ProcessStatus("scheduler")
    with anyio.fail_after(20):
        await processes.run_scheduler(url, sc.config, load_packer("reference"), cycles=1, period_s=0.01,
                                      status=status)
    assert failed and _value(status.registry, "kai_es_session_restarts_total") == 1
    assert _value(status.registry, "kai_es_queue_quota", queue="team-a", parent="dept", resource="gpu") == 8
    assert _value(status.registry, "kai_es_queue_pending_pods", queue="team-a", parent="dept") == 0
