"""Binder failures end to end (issue 8): a failed eviction is not an eviction, and a bind that
keeps failing ends in a final failure the scheduler respects.

- Reducer: PodEvictionFailed puts the victim back from Releasing to Running (its capacity no longer
  counts as freeing); a final PodBindFailed leaves the pod Pending with no back-off, marked so
  the scheduler does not pick it, until the pod is observed changed or recreated.
- Simulation: a reclaim victim that refuses eviction is never recorded as evicted and the
  preemptor is never bound; a pod whose bind always fails does not starve the others and, after
  the final failure, is never picked again. Both logs replay exactly (`kai-es replay` too).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import msgspec

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.codec import decode, encode
from kai_es.events.factory import make_envelope
from kai_es.replay import replay
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.services.binder import MAX_BIND_FAILURES
from kai_es.app.simulation import simulate
from kai_es.state import digest, fold, restore, snapshot
from kai_es.state.invariants import check
from tests.builders import MakeNode, MakePod, queue, scenario_text

ROOT = Path(__file__).resolve().parents[1]

NODE = p.NodeObserved(name="n", milli_cpu=16000, memory_bytes=2**36, gpus=2, max_pods=8, gpu_memory_mib=40960)
POD = p.PodObserved(namespace="default", name="a", uid="ua", queue="q", podgroup="g",
                    requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30),
                    gpu=p.GpuRequest(whole=1), created_ns=1)


def _records(events: list[tuple[str, p.Payload]]) -> list[Record]:
    out = []
    for i, (event_id, payload) in enumerate(events):
        env = make_envelope(payload, event_id=event_id, source="t", subject="s", logicaltime=10 * (i + 1))
        out.append(Record(i, decode(encode(env))))
    return out


def _running() -> list[tuple[str, p.Payload]]:
    return [("node", NODE), ("queue", p.QueueObserved(name="q")), ("pod", POD),
            ("bind", p.BindingDecided(namespace="default", name="a", uid="ua", node="n", podgroup="g",
                                      queue="q", gpu_devices=(1,))),
            ("bound", p.PodBound(namespace="default", name="a", uid="ua", node="n", decision_id="bind",
                                 gpu_devices=(1,))),
            ("evict", p.EvictionDecided(namespace="default", name="a", uid="ua", node="n", podgroup="g",
                                        queue="q", action="reclaim", reason="r"))]


def _evict_failed(decision_id: str = "evict", uid: str = "ua") -> p.PodEvictionFailed:
    return p.PodEvictionFailed(namespace="default", name="a", uid=uid, node="n", decision_id=decision_id,
                               message="refused", retryable=True)


# --- reducer ----------------------------------------------------------------------------------


def test_a_failed_eviction_puts_the_victim_back_to_running() -> None:
    releasing = fold(_records(_running()))
    node = releasing.nodes["n"]
    assert releasing.pods["default/a"].status == "Releasing"
    assert (node.releasing_pods, node.device_releasing) == (1, [0, 1000])
    state = fold(_records([*_running(), ("failed", _evict_failed())]))
    node = state.nodes["n"]
    assert state.pods["default/a"].status == "Running"
    assert (node.releasing_pods, node.releasing_milli_cpu, node.device_releasing) == (0, 0, [0, 0])
    assert node.device_used == [0, 1000] and state.queues["q"].allocated_milli_gpu == 1000
    assert check(state) == [] and state.ignored_events == 0
    assert digest(restore(snapshot(state))) == digest(state)


def test_an_eviction_failure_for_another_decision_or_pod_changes_nothing() -> None:
    for stale in (_evict_failed(decision_id="older"), _evict_failed(uid="other")):
        state = fold(_records([*_running(), ("failed", stale)]))
        assert state.pods["default/a"].status == "Releasing" and state.ignored_events == 1
    # a pod terminating of its own accord keeps releasing its capacity
    terminating = msgspec_replace(POD, terminating=True, node_name="n", gpu_devices=(1,))
    state = fold(_records([*_running(), ("obs", terminating), ("failed", _evict_failed())]))
    assert state.pods["default/a"].status == "Releasing" and state.ignored_events == 1


def msgspec_replace(pod: p.PodObserved, **changes: object) -> p.PodObserved:
    return msgspec.structs.replace(pod, **changes)


def _failed_binds(final_at: int) -> list[tuple[str, p.Payload]]:
    events: list[tuple[str, p.Payload]] = [("node", NODE), ("queue", p.QueueObserved(name="q")), ("pod", POD)]
    for i in range(final_at):
        events.append((f"bind{i}", p.BindingDecided(namespace="default", name="a", uid="ua", node="n",
                                                    podgroup="g", queue="q", gpu_devices=(0,))))
        events.append((f"failed{i}", p.PodBindFailed(namespace="default", name="a", uid="ua", node="n",
                                                     decision_id=f"bind{i}", message=f"denied {i}",
                                                     final=i == final_at - 1)))
    return events


def test_a_final_bind_failure_marks_the_pod_until_it_changes() -> None:
    state = fold(_records(_failed_binds(3)))
    pod = state.pods["default/a"]
    assert pod.status == "Pending" and pod.pending_key is not None  # still a pending pod...
    assert pod.bind_final_message == "denied 2" and pod.backoff_until_ns == 0  # ...that is not picked
    assert check(state) == []
    assert restore(snapshot(state)).pods["default/a"].bind_final_message == "denied 2"
    same = fold(_records([*_failed_binds(3), ("same", POD)]))
    assert same.pods["default/a"].bind_final_message == "denied 2"
    changed = fold(_records([*_failed_binds(3), ("changed", msgspec_replace(POD, labels={"fixed": "yes"}))]))
    assert changed.pods["default/a"].bind_final_message == "" and changed.pods["default/a"].bind_failures == 0
    recreated = fold(_records([*_failed_binds(3), ("gone", p.PodRemoved(namespace="default", name="a", uid="ua")),
                               ("new", msgspec_replace(POD, uid="ub"))]))
    assert recreated.pods["default/a"].bind_final_message == ""


def test_a_failed_bind_before_the_final_one_backs_off() -> None:
    events = _failed_binds(2)[:-1]  # the second failure, but not final
    events.append(("failed1", p.PodBindFailed(namespace="default", name="a", uid="ua", node="n",
                                              decision_id="bind1", message="denied 1")))
    pod = fold(_records(events)).pods["default/a"]
    assert pod.bind_final_message == "" and pod.backoff_until_ns > 0


# --- simulation -------------------------------------------------------------------------------


def _simulate(text: str) -> list[Record]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "t.yaml"), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def _refusing_victims_text(refusal: str) -> str:
    settings = {"scheduler": {"actions": ["allocate", "reclaim", "preempt"]},
                "simulation": {"until": "30s", "cyclePeriod": "1s"}}
    docs = [MakeNode("n").gpus(2).obj(), queue("q0", gpu_quota=0), queue("q1", gpu_quota=2)]
    for i in range(2):
        docs.append(MakePod(f"hog{i}", queue="q0").gpu(1).priority_class("train")
                    .annotate("kai-es.io/refuse-eviction", refusal).obj())
    docs.append(MakePod("want", queue="q1").gpu(1).priority_class("train")
                .annotate("kai-es.io/submit-after", "5s").obj())
    return scenario_text(*docs, settings=settings)


def test_a_reclaim_victim_that_refuses_eviction_is_not_evicted_and_nothing_binds_onto_it() -> None:
    for refusal in ("true", "retryable"):
        records = _simulate(_refusing_victims_text(refusal))
        envs = [r.envelope for r in records]
        decided = [e for e in envs if isinstance(e.data, p.EvictionDecided)]
        failed = [e for e in envs if isinstance(e.data, p.PodEvictionFailed)]
        assert decided and {e.data.action for e in decided} == {"reclaim"}
        assert [e.data.decision_id for e in failed] == [e.id for e in decided]  # every one refused
        assert {e.data.retryable for e in failed} == {refusal == "retryable"}
        assert not any(isinstance(e.data, p.PodEvicted) for e in envs)
        assert not any(isinstance(e.data, (p.BindingDecided, p.PodBound)) and e.data.name == "want" for e in envs)
        # after each refusal the victim runs again and no capacity of the node counts as freeing
        state = fold([])
        for record in records:
            fold([record], state)
            if isinstance(record.envelope.data, p.PodEvictionFailed):
                assert state.pods[f"default/{record.envelope.data.name}"].status == "Running"
                assert state.nodes["n"].releasing_pods == 0 and state.nodes["n"].device_releasing == [0, 0]
                assert check(state) == []
        assert state.pods["default/want"].status == "Pending"
        assert replay(records, load_packer("native")).ok


def _stuck_bind_text() -> str:
    docs = [MakeNode("n").gpus(4).obj(), queue("team-a"),
            MakePod("stuck").gpu(1).annotate("kai-es.io/refuse-bind", "true").obj()]
    for i in range(3):  # arriving before, during and after the stuck pod's retries
        docs.append(MakePod(f"ok{i}").gpu(1).annotate("kai-es.io/submit-after", f"{10 * i + 1}s").obj())
    return scenario_text(*docs, settings={"simulation": {"until": "10m", "cyclePeriod": "1s"}})


def test_a_pod_whose_bind_always_fails_gets_a_final_failure_and_does_not_starve_the_others() -> None:
    records = _simulate(_stuck_bind_text())
    envs = [r.envelope for r in records]
    failed = [e for e in envs if isinstance(e.data, p.PodBindFailed)]
    assert [e.data.final for e in failed] == [False] * (MAX_BIND_FAILURES - 1) + [True]
    assert all(e.data.name == "stuck" for e in failed)
    final_at = envs.index(failed[-1])
    later = envs[final_at + 1:]
    assert not any(isinstance(e.data, p.BindingDecided) and e.data.name == "stuck" for e in later)
    [verdict] = [e.data for e in later if isinstance(e.data, p.PodUnschedulable) and e.data.name == "stuck"]
    assert [r.code for r in verdict.reasons] == ["BindFailedPermanently"]
    assert "refuses every bind" in verdict.reasons[0].message
    assert {e.data.name for e in envs if isinstance(e.data, p.PodBound)} == {"ok0", "ok1", "ok2"}
    state = fold(records)
    assert state.pods["default/stuck"].status == "Pending" and check(state) == []
    assert replay(records, load_packer("native")).ok


def test_kai_es_replay_of_a_log_with_binder_failures_is_exact(tmp_path: Path) -> None:
    docs = [MakeNode("n").gpus(2).label("pool", "n").obj(), MakeNode("m").gpus(1).label("pool", "m").obj(),
            queue("q0", gpu_quota=0), queue("q1", gpu_quota=2)]
    for i in range(2):
        docs.append(MakePod(f"hog{i}", queue="q0").gpu(1).priority_class("train").node_selector(pool="n")
                    .annotate("kai-es.io/refuse-eviction", "true").obj())
    docs += [MakePod("want", queue="q1").gpu(1).priority_class("train").node_selector(pool="n")
             .annotate("kai-es.io/submit-after", "3s").obj(),
             MakePod("stuck", queue="q1").gpu(1).node_selector(pool="m").annotate("kai-es.io/refuse-bind", "true")
             .annotate("kai-es.io/submit-after", "2s").obj()]
    settings = {"scheduler": {"actions": ["allocate", "reclaim", "preempt"]},
                "simulation": {"until": "1m", "cyclePeriod": "1s"}}
    scenario = tmp_path / "refusals.yaml"
    scenario.write_text(scenario_text(*docs, settings=settings))
    log = tmp_path / "refusals.events.jsonl"
    run = [sys.executable, "-m", "kai_es"]
    sim = subprocess.run([*run, "simulate", str(scenario), "--log", str(log), "--report", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True)
    assert sim.returncode == 0, sim.stderr
    text = log.read_text()
    assert "kai.binder.pod.evictionfailed" in text and '"final":true' in text
    out = subprocess.run([*run, "replay", str(log), "-j", "1"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
