"""kai-es/v13: each cycle records the order its allocate tried the waiting jobs in (CycleCompleted
`tried_order`, an edit of the last cycle's; nothing when unchanged), and the positions users read
— `kai-es explain`, `serve`, the PodGroup's condition — are that order, where v12 derived the
order a cycle would try if none of the jobs were placed. KAI's allocate takes the queue furthest
below its fair share first and re-orders after every placement, so a job placed ahead moves its
queue back: the order the cycle used is not the as-if order once something is placed."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.codec import DecodeError, decode, encode
from kai_es.explain import explain, render_text
from kai_es.scenario import load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.actions.allocate import Allocator
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.tried_order import NotRecordedV12
from kai_es.state import ClusterState
from kai_es.state.handlers.tried_order import applied, edit, keep
from kai_es.state.reducer import apply
from kai_es.state.snapshot import restore, snapshot
from kai_es.visibility.positions import cluster_order, tried_ranks, would_try
from tests.builders import MakeNode, MakePod, queue, scenario_text
from tests.policy_patch import without
from tests.test_simulation import small_scenarios


def test_v13_changes_what_a_cycle_records_and_honours_queue_depth() -> None:
    """(The queue depth: tests/test_queue_depth.py.)"""
    v12, v13 = policy.POLICIES["kai-es/v12"], policy.POLICIES["kai-es/v13"]
    assert dataclasses.replace(v13.rules, tried_order=v12.rules.tried_order, stuck_record=v12.rules.stuck_record,
                               queue_depth=v12.rules.queue_depth) == v12.rules
    assert dataclasses.replace(v13.fold, keeps_tried_order=False, bindings_hold=False) == v12.fold
    assert v13.fold.keeps_tried_order and v13.fold.bindings_hold  # (bindings: tests/test_bindings_hold.py)


def _teams(version: str | None = None) -> list[Record]:
    """A 4-GPU node running team-b's 1-GPU pod; team-a and team-b have a 2-GPU quota each. Waiting,
    oldest first: a-1 (2 GPUs), b-1 (1 GPU), a-2 (1 GPU)."""
    pods = [MakePod("b-run", "team-b").gpu(1).running_on("n1"), MakePod("a-1", "team-a").gpu(2),
            MakePod("b-1", "team-b").gpu(1), MakePod("a-2", "team-a").gpu(1)]
    spec: dict[str, Any] = {"start": "2026-01-01T12:00:00Z", "simulation": {"until": "4s", "cyclePeriod": "1s"}}
    if version is not None:
        spec["scheduler"] = {"policyVersion": version}
    text = scenario_text(MakeNode("n1").gpus(4).obj(), queue("team-a", gpu_quota=2), queue("team-b", gpu_quota=2),
                         *(pod.obj() for pod in pods), settings=spec)
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "tried-order.yaml"), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def _short(key: str) -> str:
    return key.split("pg-", 1)[1].rsplit("-", 5)[0]


def _first_cut(records: list[Record]) -> tuple[ClusterState, Record]:
    state = ClusterState()
    for record in records:
        apply(state, record)
        if isinstance(record.envelope.data, p.CycleStarted):
            return state, record
    raise AssertionError("no cycle")


def test_a_queue_that_placed_a_job_goes_back_behind_the_queue_below_its_share() -> None:
    """KAI's allocate at the first cycle: team-a (0 of 2 GPUs) before team-b (1 of 2); a-1 takes 2
    GPUs, team-a is at its fair share, so team-b (half of it) goes next: b-1 is placed; a-2 is
    tried last and finds no room. The cycle used a-1, b-1, a-2 — a-2 is #3 of 3 — where the order
    as if nothing were placed keeps team-a first: a-1, a-2, b-1."""
    records = _teams()
    state, cut = _first_cut(records)
    assert [_short(k) for k in would_try(state, cut.envelope.logicaltime)] == ["a-1", "a-2", "b-1"]
    completed = [r.envelope.data for r in records if isinstance(r.envelope.data, p.CycleCompleted)]
    first = completed[0].tried_order
    assert first is not None and (first.since_cycle, first.keep_head, first.keep_tail) == (0, 0, 0)
    assert [_short(k) for k in first.jobs] == ["a-1", "b-1", "a-2"]
    # the next cycles try a-2 alone: one edit (the head and the middle dropped), then nothing
    assert completed[1].tried_order is not None and completed[1].tried_order.keep_tail == 1
    assert completed[1].tried_order.jobs == () and all(c.tried_order is None for c in completed[2:])
    report = explain(records, "default/a-2")
    waits = [e for e in report["timeline"] if e["kind"] == "wait"]
    assert waits[0]["positionAtFirst"] == {"inQueue": 2, "of": 2, "inCluster": 3, "clusterOf": 3}
    assert waits[-1]["positionAtLast"] == {"inQueue": 1, "of": 1, "inCluster": 1, "clusterOf": 1}
    text = "\n".join(render_text(report))
    assert "#1 of 1 waiting in its queue, #1 of 1 jobs the cycle tried (at the first of these cycles: " \
           "#2 of 2, #3 of 3 tried)" in text
    end = [e for e in report["timeline"] if e["kind"] == "atEnd"]
    assert end[0]["place"] == {"inQueue": 1, "of": 1, "inCluster": 1, "clusterOf": 1}


def test_v12_logs_record_no_order_and_keep_their_derived_positions() -> None:
    records = _teams("kai-es/v12")
    assert all(r.envelope.data.tried_order is None for r in records if isinstance(r.envelope.data, p.CycleCompleted))
    state, cut = _first_cut(records)
    assert cluster_order(state, cut.envelope.logicaltime) == would_try(state, cut.envelope.logicaltime)
    waits = [e for e in explain(records, "default/a-2")["timeline"] if e["kind"] == "wait"]
    assert waits[0]["positionAtFirst"] == {"inQueue": 2, "of": 2}


def test_without_the_rule_no_order_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    without(monkeypatch, "kai-es/v13", "tried_order", NotRecordedV12())
    records = _teams()
    assert all(r.envelope.data.tried_order is None for r in records if isinstance(r.envelope.data, p.CycleCompleted))


def _observed_tries(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each allocate run's tried jobs, each at its first try, seen from outside the rule."""
    runs: list[list[str]] = []
    real_run, real_try = Allocator.run, Allocator._try  # noqa: SLF001

    def run(self: Allocator) -> Any:
        runs.append([])
        return real_run(self)

    def try_(self: Allocator, leaf: Any, job: Any, *rest: Any) -> bool:
        problem = self.session.gang[job.key].problem
        not_ready = problem is not None and problem.code == "NotReady"  # in no job order (v14 on)
        if job.key not in runs[-1] and not not_ready:
            runs[-1].append(job.key)
        return real_try(self, leaf, job, *rest)

    monkeypatch.setattr(Allocator, "run", run)
    monkeypatch.setattr(Allocator, "_try", try_)
    return runs


@settings(max_examples=25, deadline=None)
@given(small_scenarios())
def test_after_every_cycle_the_folded_order_is_the_order_allocate_tried(text: str) -> None:
    """Random small clusters: after each CycleCompleted is folded, `state.tried_order` is exactly
    the jobs that cycle's allocate tried, in the order it first tried them (seen by wrapping the
    allocator, not through the rule), and an unchanged order is recorded as nothing."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        runs = _observed_tries(monkeypatch)
        log = MemoryEventLog()
        anyio.run(lambda: simulate(load_scenario_text(text, "random.yaml"), log, load_packer("native")))
    state = ClusterState()
    cycles = 0
    for record in log._records:  # noqa: SLF001 - the test reads the whole log
        before = list(state.tried_order)
        apply(state, record)
        data = record.envelope.data
        if isinstance(data, p.CycleCompleted):
            assert state.tried_order == runs[cycles]
            assert state.tried_order_cycle == data.cycle
            assert (data.tried_order is None) == (before == runs[cycles])
            cycles += 1
    assert cycles and cycles == len(runs) and state.ignored_events == 0


keys = st.lists(st.sampled_from([f"default/j{i}" for i in range(12)]), unique=True, max_size=12)


@given(keys, keys, st.integers(0, 2**128))
def test_an_edit_turns_the_old_order_into_the_new(old: list[str], new: list[str], since: int) -> None:
    change = edit(old, new, since)
    if old == new:
        assert change is None
        return
    assert change is not None and change.since_cycle == since
    assert applied(old, change) == new
    assert len(change.jobs) <= len(new)  # what both keep is not written again


def _fold_completed(state: ClusterState, cycle: int, order: p.TriedOrder | None, version: str = "kai-es/v13") -> None:
    from kai_es.events.factory import make_envelope

    env = make_envelope(p.CycleCompleted(cycle=cycle, decisions=1, tried_order=order), event_id=f"c{cycle}",
                        source="test", subject=f"cycle/{cycle}", logicaltime=cycle, causationid="x",
                        correlationid="x", basedon=state.position + 1, policyversion=version)
    apply(state, Record(position=state.position + 1, envelope=env))


big = st.integers(-(2**128), 2**128)


@given(since=big, head=big, tail=big, jobs=st.lists(st.text(max_size=8), max_size=6))
@example(since=1, head=2, tail=2, jobs=[])  # head and tail past the order's end
@example(since=1, head=0, tail=0, jobs=["default/a", "default/a"])  # a job twice
@example(since=7, head=0, tail=0, jobs=[])  # another cycle's base
def test_an_edit_that_does_not_fit_is_counted_and_leaves_no_order(since: int, head: int, tail: int,
                                                                   jobs: list[str]) -> None:
    """Whatever a CycleCompleted's edit holds, the fold does not raise: an edit that fits the
    order held applies; one that does not is counted in `ignored_events` and leaves no order; the
    next cycle, diffing against no order, records its own in full and the fold takes it."""
    state = ClusterState()
    _fold_completed(state, 1, p.TriedOrder(since_cycle=0, keep_head=0, keep_tail=0, jobs=("default/a", "default/b")))
    assert state.tried_order == ["default/a", "default/b"] and state.tried_order_cycle == 1
    order = p.TriedOrder(since_cycle=since, keep_head=head, keep_tail=tail, jobs=tuple(jobs))
    fits = since == 1 and 0 <= head and 0 <= tail and head + tail <= 2
    expected = ["default/a", "default/b"][:head] + jobs + ["default/a", "default/b"][2 - tail:] if fits else None
    if expected is not None and len(set(expected)) != len(expected):
        expected = None
    _fold_completed(state, 2, order)
    if expected is None:
        assert (state.tried_order, state.tried_order_cycle, state.ignored_events) == ([], 0, 1)
        recovery = edit(state.tried_order, ["default/c"], state.tried_order_cycle)
        assert recovery is not None
        _fold_completed(state, 3, recovery)
        assert (state.tried_order, state.tried_order_cycle) == (["default/c"], 3)
    else:
        assert (state.tried_order, state.tried_order_cycle, state.ignored_events) == (expected, 2, 0)


def test_a_cycle_of_an_older_version_leaves_no_order() -> None:
    state = ClusterState()
    _fold_completed(state, 1, p.TriedOrder(since_cycle=0, keep_head=0, keep_tail=0, jobs=("default/a",)))
    assert tried_ranks(state) == {"default/a": 0}
    _fold_completed(state, 2, None, version="kai-es/v12")
    assert (state.tried_order, state.tried_order_cycle, tried_ranks(state)) == ([], 0, None)
    keep(state, 3, p.TriedOrder(since_cycle=0, keep_head=0, keep_tail=0, jobs=("default/a",)), keeps=False)
    assert state.tried_order_cycle == 0  # an order under a version that keeps none is not kept


def test_the_order_is_in_the_snapshot_and_the_digest() -> None:
    state = ClusterState()
    _fold_completed(state, 1, p.TriedOrder(since_cycle=0, keep_head=0, keep_tail=0, jobs=("default/a", "default/b")))
    digest = policy.state_digest("kai-es/v13", state)
    back = restore(snapshot(state))
    assert (back.tried_order, back.tried_order_cycle) == (state.tried_order, 1)
    assert policy.state_digest("kai-es/v13", back) == digest
    other = restore(snapshot(state))
    other.tried_order = ["default/b", "default/a"]
    assert policy.state_digest("kai-es/v13", other) != digest


@pytest.mark.parametrize("bad", [
    {"since_cycle": "1", "keep_head": 0, "keep_tail": 0},
    {"since_cycle": 1, "keep_head": 0.5, "keep_tail": 0},
    {"since_cycle": 1, "keep_head": 0, "keep_tail": 0, "jobs": [1]},
    {"since_cycle": 1, "keep_head": 0, "keep_tail": 0, "extra": True},
    {"keep_head": 0, "keep_tail": 0},
])
def test_a_tried_order_of_the_wrong_shape_is_a_decode_error_naming_it(bad: dict[str, Any]) -> None:
    from kai_es.events.factory import make_envelope

    env = make_envelope(p.CycleCompleted(cycle=1, decisions=1), event_id="c", source="test", subject="cycle/1",
                        logicaltime=1, causationid="x", correlationid="x", basedon=0, policyversion="kai-es/v13")
    raw = msgspec.json.decode(encode(env))
    raw["data"]["tried_order"] = bad
    raw["schemaversion"] = 3
    with pytest.raises(DecodeError, match="tried_order"):  # a clear error naming the field
        decode(msgspec.json.encode(raw))


def test_the_podgroup_condition_gives_the_place_the_cycle_used() -> None:
    """The binder's condition, once the cycle's CycleCompleted is folded (what flush does before
    sending): a-2 is first in its queue now (a-1 ran), and was tried third of three."""
    from kai_es.adapters.kubernetes.status import StatusWriter

    records = _teams()
    end = next(i for i, r in enumerate(records) if isinstance(r.envelope.data, p.CycleCompleted))
    writer = StatusWriter(object(), scheduled_events=False)  # type: ignore[arg-type]  # never sends
    for record in records[:end + 1]:
        writer.observe(record)
    writer._position_writes()  # noqa: SLF001 - what flush does before sending
    messages = {key[2]: w.body["status"]["schedulingConditions"][0]["message"]
                for key, w in writer._pending.items() if key[0] == "podgroup"}  # noqa: SLF001
    a2 = next(m for g, m in messages.items() if _short(f"default/{g}") == "a-2")
    assert a2.startswith("#1 of 1 in queue team-a, #3 of 3 in the cluster: "), a2


def test_a_cycle_with_no_order_is_written_as_before() -> None:
    """Schema version 3 of cycle.completed only adds `tried_order`: a cycle without one keeps the
    bytes older versions wrote (version 2 with pods stuck releasing, else version 1)."""
    from kai_es.events.registry import written_version

    order = p.TriedOrder(since_cycle=0, keep_head=0, keep_tail=0, jobs=("default/a",))
    assert written_version(p.CycleCompleted(cycle=1, decisions=1)) == 1
    assert written_version(p.CycleCompleted(cycle=1, decisions=1, stuck_releasing=("d/p",))) == 2
    assert written_version(p.CycleCompleted(cycle=1, decisions=1, tried_order=order)) == 3
    assert written_version(p.CycleCompleted(cycle=1, decisions=1, stuck_releasing=("d/p",), tried_order=order)) == 3


@settings(max_examples=80)
@given(st.lists(st.text(min_size=1, max_size=400), unique=True, max_size=40), st.integers(1, 20_000),
       st.integers(0, 2**20))
def test_a_records_head_is_the_longest_that_fits_its_byte_budget(names: list[str], copies: int, budget: int) -> None:
    """However many keys and whatever their characters (escapes included), `keys_head` is a head
    of the keys whose JSON takes at most the budget, and the next key would not have fitted."""
    from kai_es.events.record_size import keys_head

    keys = [f"{name}/{i}" for i in range(copies // max(1, len(names)) + 1) for name in names]
    head = keys_head(keys, budget)
    assert keys[:len(head)] == head
    size = sum(len(msgspec.json.encode(k)) + 1 for k in head)
    assert size <= budget
    if len(head) < len(keys):
        assert size + len(msgspec.json.encode(keys[len(head)])) + 1 > budget


def test_a_backlog_and_an_outage_keep_the_cycle_completed_under_kafkas_record_limit() -> None:
    """20,000 waiting jobs and 20,000 pods stuck releasing (a node outage), all with 300-character
    names: the CycleCompleted stays under 1 MB encoded (Kafka's default max.message.bytes);
    v12's rules would write every stuck pod, and an order that long, in one record."""
    from kai_es.events.factory import make_envelope
    from kai_es.scheduling.rules.stuck_record import EveryStuckPodV12, StuckHead
    from kai_es.scheduling.rules.tried_order import Recorded

    class _Session:
        state = ClusterState()
        tried = {f"team-{i % 50}/{'j' * 280}-{i:06d}": None for i in range(20_000)}

    stuck = sorted(f"ns-{i % 50}/{'p' * 280}-{i:06d}" for i in range(20_000))
    order = Recorded().record(_Session())  # type: ignore[arg-type]
    assert order is not None and 1_000 < len(order.jobs) < 20_000

    def size(stuck_releasing: list[str], tried_order: p.TriedOrder | None) -> int:
        return len(encode(make_envelope(
            p.CycleCompleted(cycle=1, decisions=1, stuck_releasing=stuck_releasing, tried_order=tried_order),
            event_id="c", source="test", subject="cycle/1", logicaltime=1, causationid="x", correlationid="x",
            basedon=0, policyversion="kai-es/v13")))

    recorded = StuckHead().record(stuck)
    assert recorded == stuck[:len(recorded)] and 500 < len(recorded) < 20_000
    assert size(recorded, order) < 1_000_000
    assert size(EveryStuckPodV12().record(stuck), None) > 1_000_000
