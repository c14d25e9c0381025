"""Queue positions (`kai_es.visibility.positions`, shown by `kai-es explain`): a waiting job's
place in its queue is the order a cycle takes the queue's jobs — higher priority first, then
older — computed from the folded state at each cycle's cut, so any log (older ones included)
has them and replay gives them back. `explain --queue Q` lists the queue's waiting jobs in that
order with what each waits for; `explain NS/NAME` gives a job's position over its waits. The
cluster-wide order a kai-es/v13 cycle records is tested in tests/test_policy_v13.py; the one
derived for older logs (`would_try`) here."""

from __future__ import annotations

from typing import Any

import anyio
from hypothesis import given, settings

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.explain import explain, explain_queue, render_queue_text, render_text
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.actions.allocate import nominated_jobs
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.visibility.positions import cluster_order, position, queue_order, would_try
from tests.builders import MakeNode, MakePod, queue, scenario_text
from tests.test_simulation import small_scenarios


def _run(*pods: MakePod, gpus: int = 2) -> list[Record]:
    """`pods` (documents in creation order) on one node of `gpus` GPUs for a few cycles."""
    text = scenario_text(MakeNode("n1").gpus(gpus).obj(), queue("team-a", gpu_quota=gpus),
                         *(pod.obj() for pod in pods),
                         settings={"start": "2026-01-01T12:00:00Z", "simulation": {"until": "5s", "cyclePeriod": "1s"}})
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "positions.yaml"), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def _names(waiting: list[dict[str, Any]]) -> list[str]:
    return [w["pods"][0].split("/")[1] for w in waiting]


def test_the_queue_lists_its_waiting_jobs_by_priority_then_age_not_by_name() -> None:
    records = _run(MakePod("z-old").gpu(2).priority_class("train"), MakePod("build-now").gpu(2).priority_class("build"),
                   MakePod("a-new").gpu(2).priority_class("train"), MakePod("m-build").gpu(2).priority_class("build"),
                   gpus=2)
    report = explain_queue(records, "team-a")
    waiting = report["pending"]
    # build-now (build, oldest of the builds) runs; m-build (build) is next, then the trains by age
    assert _names(waiting) == ["m-build", "z-old", "a-new"]
    assert [(w["position"], w["of"]) for w in waiting] == [(1, 3), (2, 3), (3, 3)]
    assert [w["rule"] for w in waiting] == ["NonPreemptibleOverQuota", "NoNodeFits", "NoNodeFits"]
    assert "quota 2 GPU" in waiting[0]["reasons"][0]["message"]  # what it waits for, with its numbers
    assert all(w["gpuRequested"] == 2000 for w in waiting)
    text = "\n".join(render_queue_text(report))
    assert "#1 of 3" in text and "m-build" in text.split("#1 of 3", 1)[1].split("\n", 1)[0]
    state = ClusterState()
    for record in records:
        apply(state, record)
    assert queue_order(state, "team-a") == [w["job"] for w in waiting]
    assert position(state, waiting[2]["job"]) == (3, 3)
    running = next(k for k, j in state.jobs.items() if "build-now" in k)
    assert position(state, running) is None


def test_a_jobs_position_over_time_moves_up_as_those_before_it_start() -> None:
    records = _run(MakePod("first").gpu(1), MakePod("second").gpu(1), MakePod("third").gpu(1),
                   MakePod("fourth").gpu(1), gpus=1)
    report = explain(records, "default/fourth")
    waits = [e for e in report["timeline"] if e["kind"] == "wait"]
    # nothing runs at the first cut; the cycle tries the four in their queue's order
    assert waits and waits[0]["positionAtFirst"] == {"inQueue": 4, "of": 4, "inCluster": 4, "clusterOf": 4}
    assert waits[-1]["positionAtLast"] == {"inQueue": 3, "of": 3, "inCluster": 3, "clusterOf": 3}  # `first` runs
    assert ("#3 of 3 waiting in its queue, #3 of 3 jobs the cycle tried (at the first of these cycles: #4 of 4, "
            "#4 of 4 tried)") in "\n".join(render_text(report))


def _two_queues(team_a_priority: int | None = None) -> list[Record]:
    """An 8-GPU node holding team-a's 3-GPU and team-b's 1-GPU build jobs (quota 4 GPUs each);
    two 8-GPU trainings wait in each queue (they never fit, and may evict nobody)."""
    extra = {"priority": team_a_priority} if team_a_priority is not None else {}
    pods = [MakePod("a-run", "team-a").gpu(3).priority_class("build").running_on("n1"),
            MakePod("b-run", "team-b").gpu(1).priority_class("build").running_on("n1")]
    for q in ("a", "b"):
        pods += [MakePod(f"{q}-{i}", f"team-{q}").gpu(8).priority_class("train") for i in (1, 2)]
    text = scenario_text(MakeNode("n1").gpus(8).obj(), queue("team-a", gpu_quota=4, **extra),
                         queue("team-b", gpu_quota=4), *(pod.obj() for pod in pods),
                         settings={"start": "2026-01-01T12:00:00Z", "simulation": {"until": "4s", "cyclePeriod": "1s"}})
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "cluster-order.yaml"), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def _fold(records: list[Record]) -> ClusterState:
    state = ClusterState()
    for record in records:
        apply(state, record)
    return state


def test_the_cluster_order_takes_the_queue_furthest_below_its_share_first() -> None:
    """KAI's allocate picks the queue first by its share (allocated / fair share): team-b (1 of
    4 GPUs) goes before team-a (3 of 4), and a job it fails to place leaves team-b's share as it
    was, so team-b's second job comes next too; each queue lists its own jobs #1 and #2."""
    records = _two_queues()
    state = _fold(records)
    order = [key.split("pg-", 1)[1].rsplit("-", 5)[0] for key in cluster_order(state, records[-1].envelope.logicaltime)]
    assert order == ["b-1", "b-2", "a-1", "a-2"]
    waiting = explain_queue(records, "team-a")["pending"]
    assert [(w["position"], w["of"], w["inCluster"], w["clusterOf"]) for w in waiting] == [(1, 2, 3, 4), (2, 2, 4, 4)]
    assert "#1 of 2 (#3 of 4 in the cluster)" in "\n".join(render_queue_text(explain_queue(records, "team-a")))
    job = waiting[0]["job"]
    report = explain(records, job)
    end = [e for e in report["timeline"] if e["kind"] == "atEnd"]
    assert end and end[0]["place"] == {"inQueue": 1, "of": 2, "inCluster": 3, "clusterOf": 4}
    assert "#1 of 2 in its queue, #3 of 4 in the cluster" in "\n".join(render_text(report))


def test_a_queue_of_higher_priority_goes_first_whatever_its_share() -> None:
    """KAI orders queues by priority before share: team-a at priority 200 (KAI's default is 100)
    goes first though its share is the larger."""
    records = _two_queues(team_a_priority=200)
    state = _fold(records)
    order = [key.split("pg-", 1)[1].rsplit("-", 5)[0] for key in cluster_order(state, records[-1].envelope.logicaltime)]
    assert order == ["a-1", "a-2", "b-1", "b-2"]


@settings(max_examples=20, deadline=None)
@given(small_scenarios())
def test_at_every_cut_the_derived_order_holds_each_waiting_job_once_in_its_queues_order(text: str) -> None:
    """Random small clusters (the simulation property's): at each cycle's cut the order derived
    for logs that record none (`would_try`, as if nothing were placed) lists every job waiting in
    a leaf queue exactly once, jobs pipelined to a node first
    (allocate's order for them), then each queue's jobs in that queue's own order — the cluster
    order interleaves queues, it never reorders one."""
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "random.yaml"), log, load_packer("native")))
    state = ClusterState()
    cuts = 0
    for record in log._records:  # noqa: SLF001 - the test reads the whole log
        apply(state, record)
        if not isinstance(record.envelope.data, p.CycleStarted):
            continue
        cuts += 1
        order = would_try(state, record.envelope.logicaltime)
        assert len(order) == len(set(order))
        by_queue = {q: queue_order(state, q) for q in sorted(state.pending_jobs) if q in state.queues}
        assert sorted(order) == sorted(k for keys in by_queue.values() for k in keys)
        # jobs with a pod pipelined to a node come first, as allocate tries them; the rest
        # keep each queue's own order
        ahead = [job.key for job in nominated_jobs(state) if job.queue in by_queue]
        assert order[:len(ahead)] == ahead
        for q, keys in by_queue.items():
            assert [k for k in order[len(ahead):] if state.jobs[k].queue == q] == [k for k in keys if k not in ahead]
    assert cuts
