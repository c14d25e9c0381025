"""kai-es/v14: KAI's scheduling readiness. A pod with scheduling gates (`spec.schedulingGates`)
waits for them to be removed — never placed, not in its queue's demand (KAI's Gated status) —
and a job is scheduled only when each of its pod sets has enough alive pods that are not gated
(KAI's `FilterUnready` / `IsReadyForScheduling`: alive is pending, gated, allocated, binding,
running — not releasing), else it is told `NotReady` with KAI's numbers. v13 bound gated pods
(the API server refuses a gated pod's Binding) and counted pods being released as members.

Cases are written as a KAI user writes them: Pods with `schedulingGates`, PodGroups with
`minMember` and `subGroups`, a member deleted while the replacement waits."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.codec import decode, encode
from kai_es.events.registry import written_version
from kai_es.explain import explain, render_text
from kai_es.ingest import translate as tr
from kai_es.oneshot import _initial_envelopes, fairshare_report
from kai_es.scenario import Scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.scheduling_readiness import MinimumDecidesV13
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.state.snapshot import restore, snapshot
from kai_es.events.factory import make_envelope
from kai_es.ingest.translate import subject_of
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text
from tests.policy_patch import without

GATE = "example.com/quota-check"


def gated(pod: MakePod, *gates: str) -> dict[str, Any]:
    obj = pod.obj()
    obj["spec"]["schedulingGates"] = [{"name": g} for g in (gates or (GATE,))]
    return obj


def _scenario(*docs: dict[str, Any], version: str) -> Scenario:
    return load_scenario_text(scenario_text(*docs, settings={"start": "2026-01-01T12:00:00Z",
                                                             "scheduler": {"policyVersion": version}}))


def _cycle(sc: Scenario, engine: str = "native") -> tuple[ClusterState, list[Envelope]]:
    envs = _initial_envelopes(sc)
    state = ClusterState()
    for i, env in enumerate(envs):
        apply(state, Record(i, env))
    started = make_envelope(p.CycleStarted(cycle=1, config_digest=envs[0].data.config_digest),
                            event_id="cycle-1", source="kai-es/scheduler", subject="cycle/1",
                            logicaltime=sc.start_ns, policyversion=sc.config.policy_version)
    record = Record(len(envs), started)
    apply(state, record)
    return state, run_cycle(state, record, sc.config, load_packer(engine))  # type: ignore[arg-type]


def _bound(decisions: list[Envelope]) -> list[str]:
    return sorted(e.data.name for e in decisions if isinstance(e.data, p.BindingDecided))


def _told(decisions: list[Envelope]) -> dict[str, list[p.Reason]]:
    return {e.data.name: list(e.data.reasons) for e in decisions if isinstance(e.data, p.PodUnschedulable)}


def test_v14_changes_only_readiness() -> None:
    v13, v14 = policy.POLICIES["kai-es/v13"], policy.POLICIES["kai-es/v14"]
    assert dataclasses.replace(v14.rules, scheduling_readiness=v13.rules.scheduling_readiness) == v13.rules
    assert dataclasses.replace(v14.fold, honours_gates=False) == v13.fold and v14.fold.honours_gates
    released = list(policy.POLICIES)  # (in release order)
    since = released.index("kai-es/v14")
    assert all(isinstance(policy.POLICIES[v].rules.scheduling_readiness, MinimumDecidesV13) == (i < since)
               for i, v in enumerate(released))


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_gated_pod_waits_for_its_gates_and_is_no_demand(engine: str) -> None:
    """An idle 8-GPU node; team-a's pod asks for 2 GPUs and carries a scheduling gate (as Kueue's
    admission gate does). v14 decides nothing for it, and team-a's demand does not count it; v13
    bound it."""
    docs = (MakeNode("n1").gpus(8).obj(), queue("team-a", gpu_quota=4), gated(MakePod("held").gpu(2)),
            MakePod("free").gpu(1).obj())
    state, decisions = _cycle(_scenario(*docs, version="kai-es/v14"), engine)
    assert _bound(decisions) == ["free"] and "held" not in _told(decisions)
    assert state.pods["default/held"].pending_key is None and state.pods["default/held"].status == "Pending"
    request = fairshare_report(_scenario(*docs, version="kai-es/v14"))["queues"]["team-a"]["resources"]["gpu"]
    assert request["request"] == 1000, request
    _, old = _cycle(_scenario(*docs, version="kai-es/v13"), engine)
    assert _bound(old) == ["free", "held"]
    assert fairshare_report(_scenario(*docs, version="kai-es/v13"))["queues"]["team-a"]["resources"]["gpu"][
        "request"] == 3000


def test_removing_the_gate_makes_the_pod_pending_and_it_is_placed() -> None:
    """Gates can only be removed; the next observation without them puts the pod in the pending
    pods, and a cycle binds it."""
    sc = _scenario(MakeNode("n1").gpus(8).obj(), queue("team-a"), gated(MakePod("held").gpu(2), GATE, "b/c"),
                   version="kai-es/v14")
    state, decisions = _cycle(sc)
    assert not _bound(decisions)
    [pod_obj] = [o.obj for o in sc.objects if o.kind == "Pod"]
    ungated = copy.deepcopy(pod_obj)
    ungated["spec"]["schedulingGates"] = [{"name": "b/c"}]
    apply(state, Record(state.position + 1, _env(tr.translate(ungated), sc.start_ns + 1)))
    assert state.pods["default/held"].pending_key is None  # one gate left
    del ungated["spec"]["schedulingGates"]
    apply(state, Record(state.position + 1, _env(tr.translate(ungated), sc.start_ns + 2)))
    assert state.pods["default/held"].pending_key is not None
    started = _env(p.CycleStarted(cycle=2, config_digest=state.config_digest), sc.start_ns + 3,
                   version="kai-es/v14")
    apply(state, Record(state.position + 1, started))
    assert _bound(run_cycle(state, Record(state.position, started), sc.config, load_packer("native"))) == ["held"]


def _env(payload: p.Payload, t: int, version: str | None = None) -> Envelope:
    return make_envelope(payload, event_id=f"e-{t}-{type(payload).__name__}", source="test",
                         subject=subject_of(payload), logicaltime=t, policyversion=version)


def test_a_gang_with_a_gated_member_is_not_ready_and_says_so_as_kai_does() -> None:
    """PodGroup `train` (minMember 2), two pods, one gated. KAI's NotReady: waiting for 2 pods,
    2 exist, 1 gated. v13 placed both (the gated one's Binding then fails on the cluster)."""
    docs = (MakeNode("n1").gpus(8).obj(), queue("team-a"), podgroup("train", 2),
            MakePod("w0").group("train").gpu(1).obj(), gated(MakePod("w1").group("train").gpu(1)))
    _, decisions = _cycle(_scenario(*docs, version="kai-es/v14"))
    told = _told(decisions)
    assert not _bound(decisions) and list(told) == ["w0"]
    [reason] = told["w0"]
    assert reason.code == "NotReady" and reason.numbers == {"min_member": 2, "existing": 2, "gated": 1}
    assert "waiting for 2 pods, 2 exist, 1 gated" in reason.message
    _, old = _cycle(_scenario(*docs, version="kai-es/v13"))
    assert _bound(old) == ["w0", "w1"]


def test_a_member_being_released_does_not_count_until_its_replacement_exists() -> None:
    """PodGroup `train` (minMember 3): w0 runs, w1 is being deleted (Running, deletionTimestamp),
    w2 waits. KAI counts w0 and w2 alive: 2 of 3, not ready — w2 is not placed around the leaving
    member. v13 counted w1 and placed w2. Once w1's replacement w3 exists, the gang is ready."""
    leaving = MakePod("w1").group("train").gpu(1).running_on("n1").terminating().obj()
    docs = [MakeNode("n1").gpus(8).obj(), queue("team-a"), podgroup("train", 3),
            MakePod("w0").group("train").gpu(1).running_on("n1").obj(), leaving,
            MakePod("w2").group("train").gpu(1).obj()]
    _, decisions = _cycle(_scenario(*docs, version="kai-es/v14"))
    assert not _bound(decisions)
    assert _told(decisions)["w2"][0].numbers == {"min_member": 3, "existing": 2, "gated": 0}
    _, old = _cycle(_scenario(*docs, version="kai-es/v13"))
    assert _bound(old) == ["w2"]
    _, ready = _cycle(_scenario(*docs, MakePod("w3").group("train").gpu(1).obj(), version="kai-es/v14"))
    assert _bound(ready) == ["w2", "w3"]


def test_sub_groups_are_ready_each_by_its_own_pods() -> None:
    """A PodGroup with sub-groups `leader` (minMember 1) and `workers` (minMember 2): the leader
    and one worker wait, the other worker is gated. The job is not ready and the reason names the
    sub-group short; with the gate gone it is placed whole."""
    group = podgroup("lws", 3, subGroups=[{"name": "leader", "minMember": 1}, {"name": "workers", "minMember": 2}])
    leader = MakePod("lead").group("lws").label("kai.scheduler/subgroup-name", "leader").gpu(1)
    w0 = MakePod("w0").group("lws").label("kai.scheduler/subgroup-name", "workers").gpu(1)
    w1 = MakePod("w1").group("lws").label("kai.scheduler/subgroup-name", "workers").gpu(1)
    base = (MakeNode("n1").gpus(8).obj(), queue("team-a"), group, leader.obj(), w0.obj())
    _, decisions = _cycle(_scenario(*base, gated(w1), version="kai-es/v14"))
    assert not _bound(decisions)
    reasons = {r.code: r for rs in _told(decisions).values() for r in rs}
    assert reasons["NotReady"].numbers == {"min_member": 2, "existing": 2, "gated": 1}
    assert "of sub-group workers" in reasons["NotReady"].message
    _, placed = _cycle(_scenario(*base, w1.obj(), version="kai-es/v14"))
    assert _bound(placed) == ["lead", "w0", "w1"]


def test_the_gang_minimum_alone_decides_without_the_readiness_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The readiness rule is what holds these jobs: with v13's in v14's place, the gang whose
    member is leaving is placed again."""
    without(monkeypatch, "kai-es/v14", "scheduling_readiness", MinimumDecidesV13())
    docs = [MakeNode("n1").gpus(8).obj(), queue("team-a"), podgroup("train", 3),
            MakePod("w0").group("train").gpu(1).running_on("n1").obj(),
            MakePod("w1").group("train").gpu(1).running_on("n1").terminating().obj(),
            MakePod("w2").group("train").gpu(1).obj()]
    _, decisions = _cycle(_scenario(*docs, version="kai-es/v14"))
    assert _bound(decisions) == ["w2"]


def test_gates_follow_the_config_in_force_and_survive_a_restart() -> None:
    """A config of v13 puts the gated pod back in the pending pods, v14 takes it out again; a
    restored snapshot keeps the gates and digests as the state."""
    sc = _scenario(MakeNode("n1").gpus(8).obj(), queue("team-a"), gated(MakePod("held").gpu(1)), version="kai-es/v14")
    state, _ = _cycle(sc)
    pod = state.pods["default/held"]
    assert pod.pending_key is None and pod.spec.scheduling_gates == (GATE,)
    for version, pending in (("kai-es/v13", True), ("kai-es/v14", False)):
        apply(state, Record(state.position + 1, _env(p.ConfigApplied(
            config={"policyVersion": version}, config_digest=version), state.position + 10)))
        assert (pod.pending_key is not None) is pending, version
        assert bool(state.pending_jobs.get("team-a")) is pending
    again = restore(snapshot(state))
    assert again.pods["default/held"].spec.scheduling_gates == (GATE,) and again.honours_gates
    v14 = policy.POLICIES["kai-es/v14"]
    assert v14.state_digest(again) == v14.state_digest(state)


def test_a_pod_observed_with_gates_is_schema_v5_and_without_them_what_older_versions_wrote() -> None:
    with_gates = tr.translate(gated(MakePod("a").gpu(1), "x/y", "z"))
    assert isinstance(with_gates, p.PodObserved) and with_gates.scheduling_gates == ("x/y", "z")
    assert written_version(with_gates) == 5
    plain = tr.translate(MakePod("a").gpu(1).obj())
    assert written_version(plain) == 3 and b"scheduling_gates" not in encode(_env(plain, 1))
    assert written_version(tr.translate(MakePod("a").gpu(1).terminating().obj())) == 4
    assert decode(encode(_env(with_gates, 1))).data == with_gates


_JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**128, max_value=2**128) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(gates=_JSON | st.lists(st.fixed_dictionaries({"name": _JSON}), max_size=4))
def test_any_scheduling_gates_are_read_or_refused_naming_the_field(gates: Any) -> None:
    obj = MakePod("p").gpu(1).obj()
    obj["spec"]["schedulingGates"] = gates
    try:
        pod = tr.translate(obj)
    except tr.IngestError as exc:
        assert exc.path.startswith("spec.schedulingGates"), exc
        return
    assert isinstance(pod, p.PodObserved)
    assert all(isinstance(g, str) and g for g in pod.scheduling_gates)
    assert pod.scheduling_gates == (tuple(g["name"] for g in gates) if isinstance(gates, list) else ())


def test_explain_says_a_pod_waits_for_its_gates() -> None:
    sc = _scenario(MakeNode("n1").gpus(8).obj(), queue("team-a"), gated(MakePod("held").gpu(1)), version="kai-es/v14")
    envs = _initial_envelopes(sc)
    state, decisions = _cycle(sc)
    started = make_envelope(p.CycleStarted(cycle=1, config_digest=envs[0].data.config_digest),
                            event_id="cycle-1", source="kai-es/scheduler", subject="cycle/1",
                            logicaltime=sc.start_ns, policyversion=sc.config.policy_version)
    records = [Record(i, e) for i, e in enumerate([*envs, started, *decisions])]
    text = "\n".join(render_text(explain(records, "default/held")))
    assert f"gated: waiting for its scheduling gates to be removed ({GATE})" in text, text


@pytest.mark.parametrize(("pods", "min_member", "ready"), [
    # KAI's own cases (podgroup_info TestPodGroupInfo_IsReadyForScheduling, podset TestIsReadyForScheduling)
    (["pending"], 1, True),
    (["gated"], 1, False),
    (["pending"], 2, False),
    (["pending", "pending", "gated"], 2, True),
    (["pending", "pending", "gated"], 3, False),
    (["pending", "gated"], 2, False),
    # KAI's alive statuses: running counts, a pod being released does not
    (["running", "pending"], 2, True),
    (["releasing", "pending"], 2, False),
])
def test_kais_readiness_cases(pods: list[str], min_member: int, ready: bool) -> None:
    """A PodGroup of `min_member` whose members are in the given states (a KAI user's pods: gated
    by `schedulingGates`, running on the node, or running and being deleted): the gang is placed
    only when it is ready; a gated member is never placed."""
    docs: list[dict[str, Any]] = [MakeNode("n1").gpus(8).obj(), queue("team-a"), podgroup("g", min_member)]
    for i, kind in enumerate(pods):
        pod = MakePod(f"p{i}").group("g").gpu(1)
        if kind in ("running", "releasing"):
            pod.running_on("n1")
        if kind == "releasing":
            pod.terminating()
        docs.append(gated(pod) if kind == "gated" else pod.obj())
    _, decisions = _cycle(_scenario(*docs, version="kai-es/v14"))
    waiting = sorted(f"p{i}" for i, kind in enumerate(pods) if kind == "pending")
    if ready:
        assert _bound(decisions) == waiting
    else:
        assert not _bound(decisions)
        assert {r.code for rs in _told(decisions).values() for r in rs} == ({"NotReady"} if waiting else set())


def test_a_job_not_ready_is_not_in_the_tried_order_and_takes_no_place_in_a_queues_depth() -> None:
    """KAI filters jobs not ready for scheduling out of every action's job order before it fills
    a queue's heap (`queueDepthPerAction`) and before `/get-job-order` lists it. Queue team-a: an
    older gang of two with one pod gated, then a newer 1-GPU job; allocate's depth is 1. The
    gang is told NotReady, takes no place: the newer job is placed, and the cycle's tried order
    names it alone."""
    docs = (MakeNode("n1").gpus(8).obj(), queue("team-a"), podgroup("gang", 2),
            MakePod("g0").group("gang").gpu(1).obj(), gated(MakePod("g1").group("gang").gpu(1)),
            MakePod("later").gpu(1).obj())
    sc = load_scenario_text(scenario_text(*docs, settings={
        "start": "2026-01-01T12:00:00Z",
        "scheduler": {"policyVersion": "kai-es/v14", "queueDepthPerAction": {"allocate": 1}}}))
    state, decisions = _cycle(sc)
    assert _bound(decisions) == ["later"]
    assert [r.code for r in _told(decisions)["g0"]] == ["NotReady"]
    [completed] = [e.data for e in decisions if isinstance(e.data, p.CycleCompleted)]
    assert completed.tried_order is not None
    assert [k.rsplit("/", 1)[1].split("-")[1] for k in completed.tried_order.jobs] == ["later"], completed.tried_order


def test_a_job_not_ready_takes_no_place_in_preempts_depth() -> None:
    """Preempt's `queueDepthPerAction` of 1: an older gang of `build` priority with one pod gated
    (not ready) and a newer `build` pod that needs the GPU a `train` pod holds. The gang takes no
    place, so the newer pod is preempt's one and the `train` pod is evicted for it."""
    docs = (MakeNode("n1").gpus(1).obj(), queue("team-a"), podgroup("gang", 2, priorityClassName="build"),
            MakePod("low").gpu(1).running_on("n1").obj(),
            MakePod("g0").group("gang").gpu(1).priority_class("build").obj(),
            gated(MakePod("g1").group("gang").gpu(1).priority_class("build")),
            MakePod("urgent").gpu(1).priority_class("build").obj())
    sc = load_scenario_text(scenario_text(*docs, settings={
        "start": "2026-01-01T12:00:00Z",
        "scheduler": {"policyVersion": "kai-es/v14", "queueDepthPerAction": {"preempt": 1}}}))
    _, decisions = _cycle(sc)
    evicted = [(e.data.name, e.data.preemptor) for e in decisions if isinstance(e.data, p.EvictionDecided)]
    assert evicted == [("low", "default/urgent")], evicted
