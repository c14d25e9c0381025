"""A bound pod stays bound (kai-es/v13 on, the fold rule `bindings_hold`): an observation of the
pod without a node that reaches the log after the binder's PodBound was read before the binding
(the API server never unsets `spec.nodeName`), so the pod stays Running where it was bound.

Found on the real node (tests/k8s/test_chart_on_node.py): the binder writes a shared-GPU pod's
GPU group on the pod, then POSTs its Binding. The informer reads the patched, still unbound pod
and appends it on its own schedule; when that lands after the binder's PodBound, v12's fold put
the pod back to Pending, freed its GPU share, and the next cycle decided the pod again."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.kubernetes.gpushare import GPU_GROUPS_ANNOTATION
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest import translate as tr
from kai_es.ingest.translate import subject_of
from kai_es.scenario import load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import load_packer
from kai_es.services.scheduler import SchedulerService
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.state.snapshot import restore, snapshot
from tests.builders import MakeNode, MakePod, queue, scenario_text

_seq = iter(range(10**9))


def _env(payload: p.Payload, t: int = 10) -> Envelope:
    return make_envelope(payload, event_id=f"e-{next(_seq)}", source="test",
                         subject=subject_of(payload), logicaltime=t)


def _patched_by_the_binder(obj: dict[str, Any], decided: p.BindingDecided) -> dict[str, Any]:
    """The pod as the API server returns it after the binder's GPU-group merge patch, before its
    Binding (`adapters.kubernetes.gpushare.GpuSharing.prepare`): no nodeName."""
    pod = copy.deepcopy(obj)
    meta = pod["metadata"]
    meta["labels"] = {**meta.get("labels", {}), tr.GPU_GROUP_LABEL: decided.gpu_groups[0]}
    meta["annotations"] = {**meta.get("annotations", {}),
                           GPU_GROUPS_ANNOTATION: ",".join(decided.gpu_groups),
                           tr.GPU_DEVICES_ANNOTATION: ",".join(map(str, decided.gpu_devices))}
    assert not pod["spec"].get("nodeName")
    return pod


async def _cycle(sched: SchedulerService) -> list[Envelope]:
    return [e for e in await sched.run_cycle_once() if isinstance(e.data, (p.BindingDecided, p.PodUnschedulable))]


@pytest.mark.parametrize("version", ["kai-es/v13", "kai-es/v12"])
async def test_a_shared_gpu_pods_unbound_read_after_its_binding_leaves_it_bound(version: str) -> None:
    """A KAI user's half-GPU pod (`gpu-fraction: "0.5"`) on a one-GPU node, then a one-GPU pod.
    The binder patches the half-GPU pod, binds it and reports PodBound; the informer's read of
    the patched pod (no node yet) lands after that. Under v13 the pod stays on its node: the
    next cycle decides nothing for it and the whole-GPU pod finds the GPU taken. v12 (kept for
    its logs) puts it back to Pending and decides it again onto the GPU it already holds."""
    sc = load_scenario_text(scenario_text(
        MakeNode("n1").gpus(1).obj(), queue("team-a"), MakePod("half-gpu").fraction("0.5").obj()))
    [pod_obj] = [o for o in sc.objects if o.kind == "Pod"]
    log = MemoryEventLog()
    await log.append([_env(o.payload) for o in sc.objects])
    clock = SimClock(10)
    sched = SchedulerService(log, SchedulerConfig(policy_version=version), load_packer("native"), clock,
                             SeededIds("t"))
    await sched.start()
    [decision] = [e for e in await _cycle(sched) if isinstance(e.data, p.BindingDecided)]
    decided = decision.data
    assert decided.name == "half-gpu" and decided.node == "n1" and decided.gpu_groups
    stale = tr.translate(_patched_by_the_binder(pod_obj.obj, decided))
    assert isinstance(stale, p.PodObserved) and not stale.node_name and stale.gpu_group == decided.gpu_groups[0]
    clock.advance_to(clock.now_ns() + 1)
    await log.append([_env(p.PodBound(namespace="default", name="half-gpu", uid=decided.uid, node="n1",
                                      decision_id=decision.id, gpu_devices=list(decided.gpu_devices)), 11),
                      _env(stale, 11)])
    whole = load_scenario_text(scenario_text(MakeNode("n1").gpus(1).obj(), queue("team-a"),
                                             MakePod("whole").gpu(1).obj()))
    await log.append([_env(o.payload, 12) for o in whole.objects if o.kind in ("Pod", "PodGroup")])
    clock.advance_to(clock.now_ns() + 1)
    again = await _cycle(sched)
    pod = sched.state.pods["default/half-gpu"]
    if version == "kai-es/v12":
        assert [e.data.name for e in again if isinstance(e.data, p.BindingDecided)] == ["half-gpu"]
        return
    assert (pod.status, pod.node) == ("Running", "n1")
    assert not any(isinstance(e.data, p.BindingDecided) for e in again), again
    assert {e.data.name for e in again if isinstance(e.data, p.PodUnschedulable)} == {"whole"}
    # the informer's read of the bound pod changes nothing, and the state is what a restart restores
    bound = copy.deepcopy(_patched_by_the_binder(pod_obj.obj, decided))
    bound["spec"]["nodeName"], bound["status"] = "n1", {"phase": "Running"}
    await log.append([_env(tr.translate(bound), 13)])
    clock.advance_to(clock.now_ns() + 1)
    assert not any(isinstance(e.data, p.BindingDecided) for e in await _cycle(sched))
    assert (pod.status, pod.node) == ("Running", "n1")


def test_only_v13_on_holds_bindings_and_a_restored_state_holds_them_too() -> None:
    """The flag follows the config in force (v13 and every later version), and a restored
    snapshot derives it again: an unbound read of a pod running on a node leaves it there."""
    versions = list(policy.POLICIES)
    first = versions.index("kai-es/v13")
    assert [policy.POLICIES[v].fold.bindings_hold for v in versions] == [i >= first for i in range(len(versions))]
    sc = load_scenario_text(scenario_text(MakeNode("n1").gpus(1).obj(), queue("team-a"),
                                          MakePod("p").gpu(1).running_on("n1").obj()))
    state = ClusterState()
    apply(state, Record(position=0, envelope=_env(p.ConfigApplied(config={"policyVersion": "kai-es/v13"},
                                                                  config_digest="d"))))
    for i, o in enumerate(sc.objects, 1):
        apply(state, Record(position=i, envelope=_env(o.payload)))
    again = restore(snapshot(state))
    assert state.bindings_hold and again.bindings_hold
    [pod_obj] = [o for o in sc.objects if o.kind == "Pod"]
    unbound = copy.deepcopy(pod_obj.obj)
    del unbound["spec"]["nodeName"]
    unbound["status"] = {"phase": "Pending"}
    apply(again, Record(position=100, envelope=_env(tr.translate(unbound))))
    assert (again.pods["default/p"].status, again.pods["default/p"].node) == ("Running", "n1")
    assert again.pods["default/p"].pending_key is None
