"""The binder: performs each decision once, 'already bound' is success, failures back off."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.clock import SimClock
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ports import ActionOutcome
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.services.binder import EVICT_RETRY_DELAYS_NS, MAX_BIND_FAILURES, BinderService
from kai_es.sim.cluster import SimCluster
from kai_es.app.simulation import simulate
from kai_es.state import fold
from tests.builders import MakeNode, MakePod, queue, scenario_text

ROOT = Path(__file__).resolve().parents[1]


async def _records(log: MemoryEventLog) -> list:  # type: ignore[type-arg]
    return [r async for r in log.read()]


def _decision(pod: p.PodObserved, node: str, event_id: str, devices: list[int] | None = None) -> object:
    return make_envelope(p.BindingDecided(namespace=pod.namespace, name=pod.name, uid=pod.uid, node=node,
                                          podgroup=pod.podgroup, queue=pod.queue,
                                          gpu_devices=devices or []),
                         event_id=event_id, source="test", subject=f"pod/default/{pod.name}", logicaltime=1)


def _setup(text: str) -> tuple[SimCluster, SimClock, dict[str, p.PodObserved]]:
    sc = load_scenario_text(text)
    clock = SimClock(sc.start_ns)
    cluster = SimCluster(sc, sc.start_ns)
    pods = {o.payload.name: o.payload for o in sc.objects if isinstance(o.payload, p.PodObserved)}
    return cluster, clock, pods


async def test_a_restarted_binder_performs_nothing_twice() -> None:
    sc = load_scenario(ROOT / "examples" / "quickstart.yaml")
    log = MemoryEventLog()
    result = await simulate(sc, log, load_packer("native"))
    cluster = SimCluster(sc, sc.start_ns)
    fresh = BinderService(log, cluster, SimClock(sc.start_ns))
    assert await fresh.step() == 0
    decided = [r for r in await _records(log) if isinstance(r.envelope.data, p.BindingDecided)]
    assert cluster.binds == 0 and result.binds == len(decided) > 0


async def test_duplicate_decision_ids_bind_once() -> None:
    cluster, clock, pods = _setup(scenario_text(MakeNode("n").obj(), queue("team-a"), MakePod("a").gpu(1).obj()))
    log = MemoryEventLog()
    decision = _decision(pods["a"], "n", "d-1", [0])
    await log.append([decision])  # type: ignore[list-item]
    binder = BinderService(log, cluster, clock)
    assert await binder.step() == 1
    await log.append([decision])  # type: ignore[list-item]  # replayed into the log again
    assert await binder.step() == 0
    assert cluster.binds == 1
    outcomes = [r.envelope.data for r in await _records(log) if isinstance(r.envelope.data, p.PodBound)]
    assert len(outcomes) == 1 and outcomes[0].decision_id == "d-1"


async def test_already_bound_to_that_node_counts_as_success() -> None:
    """The binder bound the pod, then crashed before appending the outcome."""
    cluster, clock, pods = _setup(scenario_text(MakeNode("n").obj(), queue("team-a"), MakePod("a").gpu(1).obj()))
    log = MemoryEventLog()
    await log.append([_decision(pods["a"], "n", "d-1", [0])])  # type: ignore[list-item]
    assert (await cluster.bind("default", "a", pods["a"].uid, "n", [0], [])).ok
    binder = BinderService(log, cluster, clock)
    assert await binder.step() == 1
    [outcome] = [r.envelope for r in await _records(log) if r.envelope.type == "kai.binder.pod.bound"]
    assert outcome.data.node == "n" and outcome.causationid == "d-1"
    assert cluster.binds == 1


async def test_a_refused_bind_is_reported_and_backs_off() -> None:
    cluster, clock, pods = _setup(scenario_text(MakeNode("n").gpus(1).obj(), queue("team-a"),
                                                MakePod("a").gpu(2).obj()))
    log = MemoryEventLog()
    obs = make_envelope(pods["a"], event_id="o", source="t", subject="pod/default/a", logicaltime=5)
    node = make_envelope(p.NodeObserved(name="n", milli_cpu=32000, memory_bytes=2**38, gpus=1),
                         event_id="n", source="t", subject="node/n", logicaltime=5)
    await log.append([node, obs, _decision(pods["a"], "n", "d-1", [0, 1])])  # type: ignore[list-item]
    binder = BinderService(log, cluster, clock)
    assert await binder.step() == 1
    records = await _records(log)
    [failed] = [r.envelope.data for r in records if isinstance(r.envelope.data, p.PodBindFailed)]
    assert "cannot admit" in failed.message and "gpu devices" in failed.message
    state = fold(records)
    pod = state.pods["default/a"]
    assert pod.status == "Pending" and pod.bind_failures == 1 and pod.backoff_until_ns > 5


async def test_eviction_deletes_and_recreates_the_pod() -> None:
    cluster, clock, pods = _setup(scenario_text(MakeNode("n").obj(), queue("team-a"),
                                                MakePod("a").gpu(1).running_on("n", "0").obj()))
    log = MemoryEventLog()
    evict = make_envelope(p.EvictionDecided(namespace="default", name="a", uid=pods["a"].uid, node="n",
                                            podgroup="g", queue="team-a", action="preempt", reason="test"),
                          event_id="e-1", source="t", subject="pod/default/a", logicaltime=1)
    await log.append([evict])
    binder = BinderService(log, cluster, clock)
    assert await binder.step() == 1
    changes = cluster.drain_changes()
    new_uid = changes[-1].obj["metadata"]["uid"]
    # the recreated bare pod gets a PodGroup of its own, as the podgrouper makes one for a new pod
    assert [(c.kind, c.action, c.obj["metadata"]["name"]) for c in changes] == [
        ("Pod", "DELETED", "a"), ("PodGroup", "ADDED", f"pg-a-r1-{new_uid}"), ("Pod", "ADDED", "a-r1")]
    assert changes[-1].obj["metadata"]["annotations"]["pod-group-name"] == f"pg-a-r1-{new_uid}"
    assert cluster.node_use["n"].devices == [0] * 8
    anyio  # noqa: B018 - keep the import used for the async plugin


class _RefusingActuator:
    """A cluster that refuses evictions: permanently, or `retryable` (a PodDisruptionBudget said
    no for now) `refusals` times before it evicts; and refuses every bind."""

    def __init__(self, *, retryable: bool = False, refusals: int = 10**9) -> None:
        self.retryable = retryable
        self.refusals = refusals
        self.evictions: list[tuple[str, str, str]] = []
        self.binds = 0

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpu_devices: object,
                   gpu_groups: object) -> ActionOutcome:
        self.binds += 1
        return ActionOutcome(ok=False, message="admission webhook denied the binding")

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        self.evictions.append((namespace, name, uid))
        if len(self.evictions) > self.refusals:
            return ActionOutcome(ok=True)
        return ActionOutcome(ok=False, retryable=self.retryable, message="refused by a disruption budget")


def _eviction(event_id: str = "e-1") -> Envelope:
    return make_envelope(p.EvictionDecided(namespace="default", name="a", uid="uid-a", node="n",
                                           podgroup="g", queue="team-a", action="preempt", reason="test"),
                         event_id=event_id, source="t", subject="pod/default/a", logicaltime=5)


async def test_a_permanently_refused_eviction_is_a_failure_reported_once_and_not_retried(
        caplog: pytest.LogCaptureFixture) -> None:
    log = MemoryEventLog()
    await log.append([_eviction()])
    actuator = _RefusingActuator()
    binder = BinderService(log, actuator, SimClock(0))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="kai_es.services.binder"):
        assert await binder.step() == 1
    assert actuator.evictions == [("default", "a", "uid-a")]  # permanent: not retried
    assert "evict default/a failed: refused by a disruption budget" in caplog.text
    outcomes = [r.envelope for r in await _records(log)][1:]
    assert len(outcomes) == 1
    out = outcomes[0]
    assert out.type == "kai.binder.pod.evictionfailed"
    assert isinstance(out.data, p.PodEvictionFailed) and out.data.decision_id == "e-1" and out.causationid == "e-1"
    assert out.data.retryable is False and out.data.message == "refused by a disruption budget"
    assert out.logicaltime == 5  # never before the decision it performs
    # the outcome is in the log: neither this binder nor a restarted one performs it again
    assert await binder.step() == 0
    fresh = BinderService(log, actuator, SimClock(0))  # type: ignore[arg-type]
    assert await fresh.step() == 0
    assert len(actuator.evictions) == 1


async def test_a_retryable_refusal_is_retried_with_bounded_backoff_then_reported() -> None:
    log = MemoryEventLog()
    await log.append([_eviction()])
    actuator = _RefusingActuator(retryable=True)
    clock = SimClock(0)
    binder = BinderService(log, actuator, clock, evict_retry_delays_ns=(10, 20, 40))  # type: ignore[arg-type]
    tries_at = []
    for t in range(0, 200):  # a step every ns: the tries come after each delay, no sooner
        clock.advance_to(t)
        if await binder.step():
            tries_at.append(t)
    assert tries_at == [0, 10, 30, 70]  # the first try and one per delay, then it gives up
    assert len(actuator.evictions) == 4
    [out] = [r.envelope.data for r in await _records(log)][1:]
    assert isinstance(out, p.PodEvictionFailed) and out.retryable is True
    assert not binder.pending and binder.next_retry_ns() is None


async def test_a_retryable_refusal_that_passes_on_a_retry_is_an_eviction() -> None:
    log = MemoryEventLog()
    await log.append([_eviction()])
    actuator = _RefusingActuator(retryable=True, refusals=2)
    clock = SimClock(0)
    binder = BinderService(log, actuator, clock, evict_retry_delays_ns=(1, 1, 1))  # type: ignore[arg-type]
    assert await binder.step() == 1 and binder.next_retry_ns() == 1
    assert [r.envelope.data for r in await _records(log)][1:] == []  # no outcome while it waits
    assert await binder.step() == 0  # not yet: its time has not come
    for t in (1, 2):
        clock.advance_to(t)
        assert await binder.step() == 1
    assert len(actuator.evictions) == 3
    [out] = [r.envelope.data for r in await _records(log)][1:]
    assert isinstance(out, p.PodEvicted) and out.decision_id == "e-1"


class _RefusesOneEviction:
    """Binds everything; refuses the eviction of pod `refused` as retryable, every time."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.calls: list[str] = []

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpu_devices: Any = (),
                   gpu_groups: Any = ()) -> ActionOutcome:
        self.calls.append(f"bind {name}")
        return ActionOutcome(ok=True)

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        self.calls.append(f"evict {name}")
        if name == self.refused:
            return ActionOutcome(ok=False, retryable=True, message="Cannot evict pod as it would violate the pod's disruption budget.")
        return ActionOutcome(ok=True)


async def test_a_refused_eviction_waiting_for_its_retry_holds_up_no_other_decision() -> None:
    # Reclaim evicts two victims and binds the preemptor elsewhere; a PodDisruptionBudget
    # refuses one victim for now. The other eviction and the bind are performed and their
    # outcomes appended at once; the refused one waits (about 3.5 s by default) alone.
    log = MemoryEventLog()
    def eviction(name: str) -> Envelope:
        return make_envelope(p.EvictionDecided(namespace="default", name=name, uid=f"uid-{name}", node="n",
                                               podgroup="g", queue="team-b", action="reclaim", reason="test"),
                             event_id=f"e-{name}", source="t", subject=f"pod/default/{name}", logicaltime=1)
    bind = make_envelope(p.BindingDecided(namespace="default", name="preemptor", uid="uid-p", node="m",
                                          podgroup="gp", queue="team-a"),
                         event_id="b-1", source="t", subject="pod/default/preemptor", logicaltime=1)
    await log.append([eviction("guarded"), eviction("free"), bind])
    actuator = _RefusesOneEviction("guarded")
    clock = SimClock(1)
    binder = BinderService(log, actuator, clock)  # type: ignore[arg-type]  # the default delays
    assert await binder.step() == 3
    outcomes = [r.envelope.data for r in await _records(log)][3:]
    assert [type(o).__name__ for o in outcomes] == ["PodEvicted", "PodBound"]
    assert clock.now_ns() == 1  # nobody slept
    assert list(binder.pending) == ["e-guarded"] and binder.next_retry_ns() == 1 + EVICT_RETRY_DELAYS_NS[0]
    # a decision that comes while it waits is performed at once too
    await log.append([make_envelope(p.BindingDecided(namespace="default", name="late", uid="uid-l", node="m",
                                                     podgroup="gl", queue="team-a"),
                                    event_id="b-2", source="t", subject="pod/default/late", logicaltime=2)])
    assert await binder.step() == 1
    assert isinstance([r.envelope.data for r in await _records(log)][-1], p.PodBound)
    t = 1
    for delay in EVICT_RETRY_DELAYS_NS:
        t += delay
        clock.advance_to(t)
        assert await binder.step() == 1
    last = [r.envelope.data for r in await _records(log)][-1]
    assert isinstance(last, p.PodEvictionFailed) and last.decision_id == "e-guarded" and last.retryable
    assert actuator.calls.count("evict guarded") == 1 + len(EVICT_RETRY_DELAYS_NS)
    assert not binder.pending


def _bind_decision(event_id: str) -> Envelope:
    return make_envelope(p.BindingDecided(namespace="default", name="a", uid="uid-a", node="n",
                                          podgroup="g", queue="team-a"),
                         event_id=event_id, source="t", subject="pod/default/a", logicaltime=1)


async def test_a_bind_that_keeps_failing_ends_in_a_final_failure_counted_from_the_log() -> None:
    log = MemoryEventLog()
    actuator = _RefusingActuator()
    for i in range(MAX_BIND_FAILURES - 1):
        await log.append([_bind_decision(f"d-{i}")])
        # a binder restarted before each decision still counts the failures already in the log
        assert await BinderService(log, actuator, SimClock(0)).step() == 1  # type: ignore[arg-type]
    await log.append([_bind_decision("d-last")])
    assert await BinderService(log, actuator, SimClock(0)).step() == 1  # type: ignore[arg-type]
    failed = [r.envelope for r in await _records(log) if isinstance(r.envelope.data, p.PodBindFailed)]
    assert [e.data.final for e in failed] == [False] * (MAX_BIND_FAILURES - 1) + [True]
    assert failed[-1].data.message == "admission webhook denied the binding"


async def test_a_successful_bind_resets_the_count_of_failures() -> None:
    log = MemoryEventLog()
    actuator = _RefusingActuator()
    for i in range(MAX_BIND_FAILURES - 1):
        await log.append([_bind_decision(f"d-{i}")])
    binder = BinderService(log, actuator, SimClock(0))  # type: ignore[arg-type]
    await binder.step()
    bound = make_envelope(p.PodBound(namespace="default", name="a", uid="uid-a", node="n", decision_id="d-0x"),
                          event_id="b", source="t", subject="pod/default/a", logicaltime=2)
    await log.append([bound, _bind_decision("d-next")])
    await binder.step()
    last = [r.envelope.data for r in await _records(log)][-1]
    assert isinstance(last, p.PodBindFailed) and last.decision_id == "d-next" and last.final is False


async def test_evicting_a_pod_that_is_already_gone_changes_nothing() -> None:
    cluster, clock, pods = _setup(scenario_text(MakeNode("n").obj(), queue("team-a"),
                                                MakePod("a").gpu(1).running_on("n", "0").obj()))
    log = MemoryEventLog()
    evict = make_envelope(p.EvictionDecided(namespace="default", name="a", uid="another-uid", node="n",
                                            podgroup="g", queue="team-a", action="preempt", reason="test"),
                          event_id="e-2", source="t", subject="pod/default/a", logicaltime=1)
    await log.append([evict])
    binder = BinderService(log, cluster, clock)
    assert await binder.step() == 1
    assert cluster.drain_changes() == [] and cluster.evictions == 0
    assert cluster.node_use["n"].devices[0] != 0  # the running pod keeps its GPU


class _MemoryBlobs:
    """A BlobStore in memory (the file and Kafka ones are tested with their logs)."""

    def __init__(self, blob: bytes | None = None) -> None:
        self.blob = blob
        self.saves = 0

    async def save_blob(self, blob: bytes) -> None:
        self.blob = blob
        self.saves += 1

    async def load_blob(self) -> bytes | None:
        return self.blob

    async def close(self) -> None:
        return None


class _CountingLog(MemoryEventLog):
    """Counts the records read, to show where a restarted binder starts."""

    def __init__(self) -> None:
        super().__init__()
        self.records_read = 0

    async def read(self, from_position: int = 0, *, follow: bool = False):  # type: ignore[no-untyped-def,override]
        async for record in super().read(from_position, follow=follow):
            self.records_read += 1
            yield record


async def test_a_restarted_binder_resumes_from_its_saved_progress_not_from_zero() -> None:
    log = _CountingLog()
    noise = [make_envelope(p.ResyncStarted(kind="Pod"), event_id=f"n-{i}", source="t", subject="resync/pod",
                           logicaltime=1) for i in range(200)]
    await log.append(noise)  # type: ignore[arg-type]
    actuator, store = _RefusingActuator(), _MemoryBlobs()
    for i in range(2):
        await log.append([_bind_decision(f"d-{i}")])
    first = BinderService(log, actuator, SimClock(0), progress=store)  # type: ignore[arg-type]
    assert await first.step() == 2 and store.saves == 1
    await log.append([_bind_decision("d-2")])
    log.records_read = 0
    second = BinderService(log, actuator, SimClock(0), progress=store)  # type: ignore[arg-type]
    await second.restore()
    # past the noise and the decisions; the first binder saved before reading its own outcomes back
    assert second.resumed_from == 202
    assert await second.step() == 1
    assert log.records_read == 3  # those two outcomes and the new decision, not 205 records
    await second.poll()
    failed = [r.envelope.data for r in await _records(log) if isinstance(r.envelope.data, p.PodBindFailed)]
    assert [f.decision_id for f in failed] == ["d-0", "d-1", "d-2"] and second.bind_failures == {"uid-a": 3}


async def test_progress_counts_failures_once_when_resuming_before_a_pending_decision() -> None:
    """A saved progress whose resume point is before a decision still in flight re-reads the
    outcomes after it without counting their failures twice."""
    log = MemoryEventLog()
    actuator, store = _RefusingActuator(), _MemoryBlobs()
    await log.append([_bind_decision("d-0")])
    binder = BinderService(log, actuator, SimClock(0), progress=store)  # type: ignore[arg-type]
    await binder.step()
    await log.append([_bind_decision("d-1")])
    await binder.poll()
    await binder.save_progress()  # d-1 is read but not performed: the resume point is d-1
    restarted = BinderService(log, actuator, SimClock(0), progress=store)  # type: ignore[arg-type]
    await restarted.restore()
    assert restarted.resumed_from == 2 and restarted.bind_failures == {"uid-a": 1}
    assert await restarted.step() == 1
    await restarted.poll()
    assert restarted.bind_failures == {"uid-a": 2}


async def test_a_saved_progress_that_does_not_fit_the_log_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    for blob, why in ((b'{"format":1,"position":99,"resumefrom":90,"bindfailures":{}}', "does not fit"),
                      (b"not json", "unreadable")):
        log = MemoryEventLog()
        await log.append([_bind_decision("d-0")])
        binder = BinderService(log, _RefusingActuator(), SimClock(0), progress=_MemoryBlobs(blob))  # type: ignore[arg-type]
        with caplog.at_level(logging.WARNING, logger="kai_es.services.binder"):
            await binder.restore()
        assert binder.resumed_from is None and why in caplog.text
        assert await binder.step() == 1  # read from 0: the decision is performed


async def test_the_binder_remembers_a_bounded_window_of_done_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    import kai_es.services.binder as binder_module

    monkeypatch.setattr(binder_module, "DONE_WINDOW", 3)
    log = MemoryEventLog()
    for i in range(10):
        await log.append([_bind_decision(f"d-{i}")])
    binder = BinderService(log, _RefusingActuator(), SimClock(0))  # type: ignore[arg-type]
    assert await binder.step() == 10
    await binder.poll()  # reads its own outcomes back
    assert list(binder.done) == ["d-7", "d-8", "d-9"] and not binder.pending
