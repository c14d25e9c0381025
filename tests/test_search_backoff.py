"""kai-es/v8: a job whose victim searches keep failing is searched for again after 1 s, then
2 s, 4 s, … up to 60 s (KAI #2301), each wait stated in its reason; once a pod of the job is
placed the count starts again. kai-es/v7 searches every cycle. The fold keeps the count on the
job, in its snapshot and digest, only for decisions made under v8."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scenario import load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.search_backoff import MAX_BACKOFF_NS, NoSearchBackoffV7, backoff_ns
from kai_es.state import ClusterState, invariants
from kai_es.state.incremental_digest import incremental_digest, recomputed_digest
from kai_es.state.reducer import apply
from tests.policy_patch import without

SEC = 10**9
#: serve's 2 core pods may not be taken, so train (minMember 6) never finds room: every reclaim
#: search for it fails (tests/scenarios/v8-semi-preemptible-core-not-reclaimed.yaml)
BASE = (Path(__file__).parent / "scenarios" / "v8-semi-preemptible-core-not-reclaimed.yaml").read_text()


#: a CPU-only pod arriving 2 s in: a cycle between two of train's searches
TICK = """---
apiVersion: v1
kind: Pod
metadata: {name: tick, labels: {kai.scheduler/queue: training}, annotations: {kai-es.io/submit-after: 2s}}
spec: {schedulerName: kai-scheduler, priorityClassName: train, containers: [{name: c, resources: {requests: {cpu: 100m}}}]}
"""


def _text(version: str | None = None, until: str = "70s") -> str:
    settings = "{actions: [allocate, reclaim]" + (f", policyVersion: {version}" if version else "") + "}"
    return BASE.replace("  scheduler: {actions: [allocate, reclaim]}\n",
                        f"  scheduler: {settings}\n  simulation: {{until: {until}, cyclePeriod: 1s}}\n") + TICK


FOLDED: list[ClusterState] = []  # the states `_run` folded, last one last


def _run(text: str) -> list[tuple[int, list[p.Reason]]]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "backoff.yaml"), log, load_packer("native")))
    records = log._records  # noqa: SLF001 - the test reads the whole log
    assert replay(records, load_packer("native")).ok
    state = ClusterState()
    for record in records:  # the fold marks the job whenever its count changes
        apply(state, record)
        if isinstance(record.envelope.data, (p.PodUnschedulable, p.BindingDecided, p.PodPipelined)):
            assert incremental_digest(state) == recomputed_digest(state)
    assert not invariants.check(state)
    FOLDED.append(state)
    envelopes: list[Envelope] = [r.envelope for r in records]
    return [(e.logicaltime, e.data.reasons) for e in envelopes
            if isinstance(e.data, p.PodUnschedulable) and e.data.name == "train-0"]


def _failures(verdicts: list[tuple[int, list[p.Reason]]]) -> list[tuple[int, int, int]]:
    """(time, search_failures, retry_at_ns) of each verdict whose reclaim reason is a failed search."""
    out = []
    for t, reasons in verdicts:
        for r in reasons:
            if r.code == "ReclaimNotPossible" and "requested_milli_gpu" in r.numbers and "retry_at_ns" in r.numbers:
                out.append((t, r.numbers["search_failures"], r.numbers["retry_at_ns"]))
    return out


def test_failed_searches_back_off_doubling_and_say_until_when() -> None:
    verdicts = _run(_text())
    failed = _failures(verdicts)
    start = failed[0][0]
    assert [k for _, k, _ in failed] == [1, 2, 3, 4, 5, 6, 7]  # 70 s: 1+2+4+8+16+32 s of waits
    job = FOLDED[-1].jobs["default/train"]
    assert (job.search_failures, job.search_retry_ns) == failed[-1][1:]
    for t, k, retry in failed:
        assert retry == t + backoff_ns(k)
    assert [t - start for t, _, _ in failed] == [0, 1 * SEC, 3 * SEC, 7 * SEC, 15 * SEC, 31 * SEC, 63 * SEC]
    # the cycle at 2 s (tick's arrival) skips the search and repeats the verdict: nothing new is said
    assert [t - start for t, _ in verdicts] == [t - start for t, _, _ in failed]
    # the words stay the same from one failed search to the next (one Event per verdict)
    words = {r.message for _, reasons in verdicts for r in reasons if "retry_at_ns" in r.numbers
             and "requested_milli_gpu" in r.numbers}
    assert len(words) == 1 and next(iter(words)).endswith("; further searches for it back off"), words


def test_without_the_rule_or_under_v7_every_cycle_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _failures(_run(_text("kai-es/v7"))) == []
    without(monkeypatch, "kai-es/v8", "search_backoff", NoSearchBackoffV7())
    assert _failures(_run(_text())) == []


def test_the_wait_doubles_up_to_a_minute() -> None:
    assert [backoff_ns(k) // SEC for k in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_ns(2**70) == MAX_BACKOFF_NS


def test_the_fold_keeps_the_count_until_a_pod_of_the_job_is_placed() -> None:
    import uuid

    from kai_es.events import Record
    from kai_es.events.factory import make_envelope
    from kai_es.scheduling.config import config_event, parse_config

    state, position = ClusterState(), 0

    def feed(payload: p.Payload | None, version: str | None = None) -> None:
        nonlocal position
        env = (config_event(parse_config({"policyVersion": "kai-es/v8"}), event_id="c", logicaltime=0)
               if payload is None else make_envelope(payload, event_id=str(uuid.uuid4()), source="t", subject="s",
                                                     logicaltime=SEC, policyversion=version))
        apply(state, Record(position, env))
        position += 1
        assert incremental_digest(state) == recomputed_digest(state)
        assert not invariants.check(state)

    feed(None)
    feed(p.QueueObserved(name="q"))
    feed(p.NodeObserved(name="n", gpus=1, milli_cpu=1000, memory_bytes=2**30))
    feed(p.PodObserved(namespace="d", name="x", uid="u", queue="q", podgroup="g"))
    failed = p.Reason(code="ReclaimNotPossible", message="m", numbers={"search_failures": 3, "retry_at_ns": 9 * SEC})
    feed(p.PodUnschedulable(namespace="d", name="x", uid="u", podgroup="g", queue="q", reasons=(failed,)), "kai-es/v7")
    assert state.jobs["d/g"].search_failures == 0  # a v7 decision: no back-off
    feed(p.PodUnschedulable(namespace="d", name="x", uid="u", podgroup="g", queue="q", reasons=(failed,)), "kai-es/v8")
    assert (state.jobs["d/g"].search_failures, state.jobs["d/g"].search_retry_ns) == (3, 9 * SEC)
    for huge in ({"search_failures": 2**70, "retry_at_ns": SEC}, {"search_failures": 4, "retry_at_ns": 2**128},
                 {"search_failures": -1, "retry_at_ns": -5}):  # not what a scheduler writes: ignored
        feed(p.PodUnschedulable(namespace="d", name="x", uid="u", podgroup="g", queue="q",
                                reasons=(p.Reason(code="ReclaimNotPossible", message="m", numbers=huge),)), "kai-es/v8")
        assert (state.jobs["d/g"].search_failures, state.jobs["d/g"].search_retry_ns) == (3, 9 * SEC)
    feed(p.BindingDecided(namespace="d", name="x", uid="u", node="n", podgroup="g", queue="q"), "kai-es/v8")
    assert (state.jobs["d/g"].search_failures, state.jobs["d/g"].search_retry_ns) == (0, 0)
