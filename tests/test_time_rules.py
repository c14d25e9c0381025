"""The time rules of policy kai-es/v3 (min-guaranteed runtime, preemption delay, stale gangs):
each scenario of tests/scenarios/ that shows a rule is run here again with the rule taken away
(its queue field, annotation or grace period edited out), and the outcome must change — so the
scenario's expectation holds because of the rule, not by accident. Plus: validation of the new
fields, the rules under a v2 config (nothing changes), and stale gang eviction over simulated
time (the grace period measured on the log's clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.ingest import translate as tr
from kai_es.oneshot import initial_state, one_cycle
from kai_es.scenario import ScenarioError, load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.wakeups import due_times_ns
from kai_es.app.simulation import simulate

SCENARIOS = Path(__file__).parent / "scenarios"
ENGINES = ["native", "reference"]


def _cycle(text: str, engine: str) -> dict[str, Any]:
    return one_cycle(load_scenario_text(text, "edited.yaml"), load_packer(engine))  # type: ignore[arg-type]


def _statuses(outcome: dict[str, Any]) -> dict[str, str]:
    return {pod: got["status"] for pod, got in outcome["pods"].items()}


def _text(name: str) -> str:
    return (SCENARIOS / name).read_text()


def _edited(name: str, old: str, new: str) -> str:
    text = _text(name)
    assert old in text, (name, old)
    return text.replace(old, new)


@pytest.mark.parametrize("engine", ENGINES)
def test_preempt_min_runtime_protects_the_newest_victim(engine: str) -> None:
    name = "min-runtime-preempt.yaml"
    assert _statuses(_cycle(_text(name), engine))["default/t-new"] == "Running"
    without = _statuses(_cycle(_edited(name, "spec: {preemptMinRuntime: 10m}", "spec: {}"), engine))
    # without the protection the cheapest victim is the newest job
    assert without["default/t-new"] == "Releasing" and without["default/t-old"] == "Running"
    # a min-runtime the job has outlived protects nothing either
    outlived = _statuses(_cycle(_edited(name, "preemptMinRuntime: 10m", "preemptMinRuntime: 1m"), engine))
    assert outlived["default/t-new"] == "Releasing"
    # the scheduler's default applies to a queue that sets none
    default = _edited(name, "spec: {preemptMinRuntime: 10m}", "spec: {}").replace(
        "policyVersion: kai-es/v3}", "policyVersion: kai-es/v3, minRuntime: {preemptMinRuntime: 10m}}")
    assert _statuses(_cycle(default, engine))["default/t-new"] == "Running"


@pytest.mark.parametrize("engine", ENGINES)
def test_reclaim_min_runtime_is_resolved_below_the_lowest_common_ancestor(engine: str) -> None:
    lca = "reclaim-min-runtime-lca.yaml"
    assert "Releasing" not in _statuses(_cycle(_text(lca), engine)).values()
    # research's 2h is what protects r1 from prod: without it r1's own 0s applies
    unprotected = _statuses(_cycle(_edited(lca, "reclaimMinRuntime: 2h, ", ""), engine))
    assert list(unprotected.values()).count("Releasing") == 1 and unprotected["default/p-1"] == "Pipelined"
    sibling = "reclaim-min-runtime-sibling.yaml"
    assert _statuses(_cycle(_text(sibling), engine))["default/s-1"] == "Pipelined"
    # between siblings r1's own value decides; unset, it inherits research's 2h
    inherited = _statuses(_cycle(_edited(sibling, "reclaimMinRuntime: 0s, ", ""), engine))
    assert "Releasing" not in inherited.values() and inherited["default/s-1"] == "Pending"


@pytest.mark.parametrize("engine", ENGINES)
def test_reclaim_min_runtime_resolved_from_the_victims_queue(engine: str) -> None:
    name = "reclaim-min-runtime-queue.yaml"
    method = "minRuntime: {reclaimResolveMethod: queue}"
    assert "Releasing" not in _statuses(_cycle(_text(name), engine)).values()
    # r1's own 2h protects it under "queue"; under "lca" (stated, or by default) research's 0s
    # applies and prod reclaims one of r1's jobs
    for lca in (_edited(name, method, "minRuntime: {reclaimResolveMethod: lca}"), _edited(name, method, "")):
        got = _statuses(_cycle(lca, engine))
        assert list(got.values()).count("Releasing") == 1 and got["default/p-1"] == "Pipelined"
    # and the other way round: the "lca" scenario's research 2h does not protect r1 under
    # "queue", where r1's own 0s applies
    queue = _edited("reclaim-min-runtime-lca.yaml", "policyVersion: kai-es/v3}",
                    "policyVersion: kai-es/v3, minRuntime: {reclaimResolveMethod: queue}}")
    got = _statuses(_cycle(queue, engine))
    assert list(got.values()).count("Releasing") == 1 and got["default/p-1"] == "Pipelined"
    # r1 without a value of its own inherits research's 0s under "queue" as well
    inherited = _statuses(_cycle(_edited(name, "reclaimMinRuntime: 2h, ", ""), engine))
    assert inherited["default/p-1"] == "Pipelined"


@pytest.mark.parametrize("method", ["queue", "lca"])
def test_the_scheduler_wakes_when_a_resolved_reclaim_min_runtime_ends(method: str) -> None:
    # r1's jobs started at 11:30; the 2h that protects them (r1's under "queue" in the queue
    # scenario, research's under "lca" in the lca one) ends at 13:30: a due time with nothing
    # new logged, whichever method the config names
    texts = [_edited("reclaim-min-runtime-queue.yaml", "reclaimResolveMethod: queue", f"reclaimResolveMethod: {method}"),
             _edited("reclaim-min-runtime-lca.yaml", "policyVersion: kai-es/v3}",
                     f"policyVersion: kai-es/v3, minRuntime: {{reclaimResolveMethod: {method}}}}}")]
    for text in texts:
        scenario = load_scenario_text(text, "edited.yaml")
        assert scenario.config.min_runtime.reclaim_resolve_method == method
        assert scenario.start_ns + 90 * 60 * 10**9 in due_times_ns(initial_state(scenario), scenario.config)


def test_reclaim_resolve_method_is_validated() -> None:
    with pytest.raises(ScenarioError, match=r"reclaimResolveMethod"):
        load_scenario_text(_edited("reclaim-min-runtime-queue.yaml", "reclaimResolveMethod: queue",
                                   "reclaimResolveMethod: tree"), "bad.yaml")


@pytest.mark.parametrize("engine", ENGINES)
def test_protected_elastic_job_loses_only_surplus_pods(engine: str) -> None:
    name = "min-runtime-elastic-surplus.yaml"
    needs_all = _edited(name, 'nvidia.com/gpu: "2"}}}]}\n', 'nvidia.com/gpu: "3"}}}]}\n')
    got = _statuses(_cycle(needs_all, engine))
    assert got["default/urgent"] == "Pending" and "Releasing" not in got.values()  # the gang is kept
    unprotected = _statuses(_cycle(needs_all.replace("spec: {preemptMinRuntime: 10m}", "spec: {}"), engine))
    assert [unprotected[f"default/e-{i}"] for i in range(3)] == ["Releasing"] * 3


@pytest.mark.parametrize("engine", ENGINES)
def test_preemption_delay_holds_back_the_preemptor_until_it_ends(engine: str) -> None:
    name = "preemption-delay.yaml"
    outcome = _cycle(_text(name), engine)
    reasons = [d["data"]["reasons"] for d in outcome["decisions"]
               if d["type"] == "kai.scheduler.pod.unschedulable" and d["subject"] == "pod/default/urgent"][0]
    assert reasons[-1]["code"] == "PreemptionDelay"
    assert reasons[-1]["numbers"]["until_ns"] == reasons[-1]["numbers"]["preemption_delay_ns"] + \
        outcome_time(name) - 60 * 10**9  # created 1m before the cycle
    # without its annotation urgent (priority build) preempts as well
    undelayed = _statuses(_cycle(_edited(name, "annotations: {kai.scheduler/preemption-delay: 5m}, ", ""), engine))
    assert undelayed["default/urgent"] == "Pipelined"
    # the PodGroup's own delay, not yet over, holds urgent-pg back
    longer = _statuses(_cycle(_edited(name, "preemptionDelay: 2m", "preemptionDelay: 20m"), engine))
    assert longer["default/urgent-pg-0"] == "Pending" and longer["default/t-1"] == "Running"


def outcome_time(name: str) -> int:
    return load_scenario_text(_text(name), name).start_ns


@pytest.mark.parametrize("engine", ENGINES)
def test_stale_gang_grace_periods(engine: str) -> None:
    name = "stale-gang-eviction.yaml"
    # without the action nothing is evicted
    off = _statuses(_cycle(_edited(name, "actions: [allocate, stalegangeviction]", "actions: [allocate]"), engine))
    assert "Releasing" not in off.values()
    # done is stale once its succeeded pod is forgotten
    finished = _statuses(_cycle(_edited(name, "status: {phase: Succeeded}", "status: {phase: Pending}"), engine))
    assert finished["default/done-0"] == "Releasing"
    # never's negative grace period is what keeps it
    expired = _edited(name, 'annotations: {kai.scheduler/staleness-grace-period: "-1s"}', "").replace(
        "policyVersion: kai-es/v3}", "policyVersion: kai-es/v3, defaultStalenessGracePeriod: 0s}")
    assert _statuses(_cycle(expired, engine))["default/never-0"] == "Releasing"


def test_a_v2_config_keeps_neither_the_rules_nor_job_times() -> None:
    text = _text("min-runtime-preempt.yaml").replace("kai-es/v3", "kai-es/v2")
    got = _statuses(_cycle(text, "native"))
    assert got["default/t-new"] == "Releasing"  # v2 has no min-runtime
    with pytest.raises(ScenarioError, match="stalegangeviction is not implemented by policy kai-es/v2"):
        load_scenario_text(_text("stale-gang-eviction.yaml").replace("kai-es/v3", "kai-es/v2"), "x.yaml")


STALE_SIM = """
apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: stale-sim}
spec:
  start: "2026-01-01T00:00:00Z"
  scheduler: {actions: [allocate, stalegangeviction], policyVersion: kai-es/v3}
  simulation: {until: 5m, cyclePeriod: 1s}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: q}
---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata: {name: g}
spec: {queue: q, minMember: 3, GRACE}
""" + "".join(f"""---
apiVersion: v1
kind: Pod
metadata: {{name: g-{i}, labels: {{kai.scheduler/queue: q}}, annotations: {{pod-group-name: g{refuse}}}}}
spec: {{schedulerName: kai-scheduler, containers: [{{name: c, resources: {{requests: {{nvidia.com/gpu: "1"}}}}}}]}}
""" for i, refuse in enumerate(["", "", ", kai-es.io/refuse-bind: 'true', kai-es.io/recreate: 'false'"]))


def _simulate(text: str) -> list[Any]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "stale-sim.yaml"), log, load_packer("native")))
    return [r.envelope for r in log._records]  # noqa: SLF001 - the test reads the whole log


@pytest.mark.parametrize("grace_s", [30, 90])
def test_stale_gang_is_evicted_once_its_grace_period_has_passed_on_the_logs_clock(grace_s: int) -> None:
    """A gang of 3 whose third pod the cluster refuses to bind runs with 2: it is stale from the
    binder's final failure on, and is evicted (both running pods, naming the action) in the first cycle at or
    after stale-since + grace — a cycle the scheduler wakes up for with nothing new logged."""
    envelopes = _simulate(STALE_SIM.replace("GRACE", f"stalenessGracePeriod: {grace_s}s"))
    # the binder retries with back-off (the scheduler re-places the pod, the gang is whole
    # again), then gives up: from then on the gang runs short
    refused = [e.logicaltime for e in envelopes if isinstance(e.data, p.PodBindFailed) and e.data.final]
    evictions = [e for e in envelopes if isinstance(e.data, p.EvictionDecided)]
    assert refused and evictions
    first = evictions[0]
    assert first.data.action == "stalegangeviction" and "stale gang" in first.data.reason
    stale_since = first.data.numbers["stale_since_ns"]
    assert stale_since == refused[0]  # stale from the event that left the gang short
    assert first.data.numbers["grace_period_ns"] == grace_s * 10**9
    assert stale_since + grace_s * 10**9 <= first.logicaltime <= stale_since + (grace_s + 1) * 10**9
    same_cycle = [e for e in evictions if e.basedon == first.basedon]
    assert sorted(e.data.name for e in same_cycle) == ["g-0", "g-1"]


def test_a_negative_grace_period_never_evicts_in_simulated_time() -> None:
    envelopes = _simulate(STALE_SIM.replace("GRACE", "stalenessGracePeriod: -1s"))
    assert not [e for e in envelopes if isinstance(e.data, p.EvictionDecided)]


@pytest.mark.parametrize("obj, field", [
    ({"kind": "Queue", "metadata": {"name": "q"}, "spec": {"preemptMinRuntime": "ten minutes"}},
     "spec.preemptMinRuntime"),
    ({"kind": "Queue", "metadata": {"name": "q"}, "spec": {"reclaimMinRuntime": "-5m"}}, "spec.reclaimMinRuntime"),
    ({"kind": "Queue", "metadata": {"name": "q"}, "spec": {"reclaimMinRuntime": "900000000h"}},
     "spec.reclaimMinRuntime"),
    ({"kind": "PodGroup", "metadata": {"name": "g"}, "spec": {"preemptionDelay": "-1m"}}, "spec.preemptionDelay"),
    ({"kind": "PodGroup", "metadata": {"name": "g"}, "spec": {"stalenessGracePeriod": "soon"}},
     "spec.stalenessGracePeriod"),
    ({"kind": "PodGroup", "metadata": {"name": "g", "annotations": {"kai.scheduler/preemption-delay": "300"}}},
     "metadata.annotations[kai.scheduler/preemption-delay]"),
    ({"kind": "Pod", "metadata": {"name": "x", "annotations": {"kai.scheduler/staleness-grace-period": "1 min"}},
      "spec": {"containers": []}}, "metadata.annotations[kai.scheduler/staleness-grace-period]"),
    ({"kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": []}, "status": {"startTime": "yesterday"}},
     "status.startTime"),
])
def test_bad_time_fields_are_rejected_naming_the_field(obj: dict[str, Any], field: str) -> None:
    translator = {"Queue": tr.queue, "PodGroup": tr.podgroup, "Pod": tr.pod}[obj["kind"]]
    with pytest.raises(tr.IngestError) as err:
        translator(obj)
    assert err.value.path == field, err.value


def test_time_fields_are_translated() -> None:
    q = tr.queue({"kind": "Queue", "metadata": {"name": "q"}, "spec": {"preemptMinRuntime": "20s"}})
    assert (q.preempt_min_runtime_ns, q.reclaim_min_runtime_ns) == (20 * 10**9, None)  # unset: inherited
    g = tr.podgroup({"kind": "PodGroup", "metadata": {"name": "g", "annotations": {
        "kai.scheduler/preemption-delay": "5m", "kai.scheduler/staleness-grace-period": "-1s"}}})
    assert (g.preemption_delay_ns, g.staleness_grace_ns) == (300 * 10**9, -10**9)
    spec = tr.podgroup({"kind": "PodGroup", "metadata": {"name": "g", "annotations": {
        "kai.scheduler/preemption-delay": "5m"}}, "spec": {"preemptionDelay": "1m"}})
    assert spec.preemption_delay_ns == 60 * 10**9  # the spec field wins over the annotation


def test_scenario_loading_names_the_bad_field() -> None:
    text = _text("min-runtime-preempt.yaml").replace("preemptMinRuntime: 10m", "preemptMinRuntime: 10 minutes")
    with pytest.raises(ScenarioError, match=r"spec\.preemptMinRuntime"):
        load_scenario_text(text, "bad.yaml")


def test_out_of_bounds_time_fields_in_the_log_are_rejected_by_the_fold() -> None:
    """A crafted record the ingest bounds would have refused is counted and never applied."""
    from kai_es.events import Record
    from kai_es.events.factory import make_envelope
    from kai_es.state import fold

    crafted = [p.QueueObserved(name="q", preempt_min_runtime_ns=2**62),
               p.PodGroupObserved(namespace="d", name="g", preemption_delay_ns=-1),
               p.PodGroupObserved(namespace="d", name="h", staleness_grace_ns=-(2**62)),
               p.PodObserved(namespace="d", name="x", uid="x", podgroup="g", preemption_delay_ns=2**62)]
    records = [Record(position=i, envelope=make_envelope(data, event_id=f"e{i}", source="t", subject="s",
                                                         logicaltime=1))
               for i, data in enumerate(crafted)]
    state = fold(records)
    assert state.rejected_objects == 4 and not state.queues and not state.jobs and not state.pods


def test_job_times_survive_a_snapshot() -> None:
    from kai_es.oneshot import initial_state
    from kai_es.state.incremental_digest import incremental_digest, snapshot_digest
    from kai_es.state.snapshot import load_snapshot, restore, snapshot_bytes

    state = initial_state(load_scenario_text(_text("stale-gang-eviction.yaml"), "s.yaml"))
    assert state.jobs["default/g"].stale_since_ns and state.jobs["default/done"].succeeded == 1
    snap = load_snapshot(snapshot_bytes(state))
    again = restore(snap)
    assert (again.jobs["default/g"].stale_since_ns, again.jobs["default/done"].succeeded) == \
        (state.jobs["default/g"].stale_since_ns, 1)
    assert snapshot_bytes(again) == snapshot_bytes(state)
    assert snapshot_digest(snap) == incremental_digest(state) == incremental_digest(again)
