"""Nothing a cluster can send crashes a cycle: adversarial Kubernetes objects (wrong types,
extreme numbers, negative quantities, loops, unicode, missing fields) go through the informer's
translation, the reducer and a scheduling cycle. Every object is either an observation or an
ObjectRejected event naming the field; no exception escapes; the objects that are valid are
still scheduled."""

from __future__ import annotations

from typing import Any

from hypothesis import given, note
from hypothesis import strategies as st

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ports import ObjectChange
from kai_es.scheduling.config import SchedulerConfig, config_digest
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer
from kai_es.services.informer import InformerService
from kai_es.state import ClusterState
from kai_es.state.invariants import check
from kai_es.state.reducer import apply

WEIRD_SCALARS = st.one_of(
    st.integers(min_value=-(2**128), max_value=2**128), st.sampled_from([2**62, 2**63, 2**64, 2**128, -(2**63) - 1]),
    st.just(-1), st.just(0), st.booleans(), st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e100", "-1", "1e1000000", "0.5", "1Ei", "4Ei", "1e30", "9" * 50, "9999-12-31T23:59:59Z", "100000000", "", "abc", "1.5Gi",
                     "-0", "3m", "1e-9", "\u0661\u0662", "8"]),
    st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
NAMES = st.one_of(st.sampled_from(["n1", "n2", "q", "a", "b", "pg", "p"]), st.text(min_size=0, max_size=12))


def maybe(value: Any) -> Any:
    return st.one_of(st.just(value), WEIRD_SCALARS)


@st.composite
def node(draw: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": draw(st.one_of(st.fixed_dictionaries({"name": NAMES, "labels": st.dictionaries(
                st.sampled_from(["nvidia.com/gpu.memory", "zone", "rack", "kai.scheduler/node-pool", "x"]),
                st.one_of(st.sampled_from(["a", "b"]), WEIRD_SCALARS),
                max_size=3)}), WEIRD_SCALARS)),
            "spec": draw(st.one_of(st.fixed_dictionaries({"unschedulable": maybe(False), "taints": maybe(
                [{"key": "k", "effect": draw(st.sampled_from(["NoSchedule", "Bogus"]))}])}), WEIRD_SCALARS)),
            "status": {"allocatable": draw(st.dictionaries(
                st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "pods", "example.com/rdma"]),
                st.one_of(st.sampled_from(["8", "64", "512Gi", "4"]), WEIRD_SCALARS), max_size=5))}}


@st.composite
def queue(draw: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
            "metadata": {"name": draw(NAMES)},
            "spec": {"parentQueue": draw(st.one_of(NAMES, WEIRD_SCALARS)), "priority": draw(maybe(100)),
                     "resources": draw(st.one_of(WEIRD_SCALARS, st.fixed_dictionaries({
                         "gpu": st.one_of(WEIRD_SCALARS, st.fixed_dictionaries({
                             "quota": maybe(4), "limit": maybe(-1), "overQuotaWeight": maybe(1)}))})))}}


@st.composite
def pod(draw: Any) -> dict[str, Any]:
    requests = draw(st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/rdma"]),
                                    st.one_of(st.sampled_from(["1", "2Gi", "500m"]), WEIRD_SCALARS), max_size=4))
    affinity = draw(st.one_of(WEIRD_SCALARS, st.just({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": draw(st.text(max_size=5)),
                                   "operator": draw(st.sampled_from(["In", "Gt", "Bogus", "Exists"])),
                                   "values": draw(st.one_of(st.lists(WEIRD_SCALARS, max_size=2), WEIRD_SCALARS))}]}]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": draw(st.one_of(WEIRD_SCALARS, st.just({"matchLabels": {"app": "x"}}))),
             "topologyKey": draw(st.one_of(st.just("kubernetes.io/hostname"), WEIRD_SCALARS))}]}})))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": draw(NAMES), "namespace": draw(st.one_of(st.just("default"), WEIRD_SCALARS)),
                         "labels": draw(st.one_of(st.just({"kai.scheduler/queue": "q", "app": "x"}), WEIRD_SCALARS)),
                         "annotations": draw(st.dictionaries(
                             st.sampled_from(["gpu-fraction", "gpu-memory", "gpu-fraction-num-devices", "pod-group-name"]),
                             WEIRD_SCALARS, max_size=2))},
            "spec": {"schedulerName": "kai-scheduler", "nodeName": draw(st.one_of(st.just(""), NAMES)),
                     "priority": draw(maybe(None)), "affinity": affinity,
                     "containers": draw(st.one_of(WEIRD_SCALARS, st.just([
                         {"name": "c", "resources": {"requests": requests},
                          "ports": draw(st.one_of(st.just([]), st.just([{"hostPort": draw(WEIRD_SCALARS)}])))}])))},
            "status": {"phase": draw(st.sampled_from(["Pending", "Running", "Bogus"]))}}


@st.composite
def podgroup(draw: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": draw(NAMES), "namespace": "default"},
            "spec": {"minMember": draw(maybe(1)), "queue": draw(st.one_of(NAMES, WEIRD_SCALARS)),
                     "subGroups": draw(st.one_of(WEIRD_SCALARS, st.just([{"name": "a", "minMember": 1, "parent": "a"}]),
                                                 st.just([{"name": "a", "minMember": 1,
                                                           "topologyConstraint": draw(constraint())}]))),
                     "topologyConstraint": draw(constraint())}}


LEVEL_NAMES = st.one_of(st.sampled_from(["zone", "rack", "nvidia.com/gpu.memory", ""]), WEIRD_SCALARS)


@st.composite
def constraint(draw: Any) -> Any:
    """A topologyConstraint: valid, naming unknown topologies or levels, inverted, or junk."""
    return draw(st.one_of(WEIRD_SCALARS, st.fixed_dictionaries({}, optional={
        "topology": st.one_of(st.sampled_from(["t", "missing"]), WEIRD_SCALARS),
        "requiredTopologyLevel": LEVEL_NAMES, "preferredTopologyLevel": LEVEL_NAMES})))


@st.composite
def topology(draw: Any) -> dict[str, Any]:
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
            "metadata": {"name": draw(st.one_of(st.just("t"), NAMES))},
            "spec": {"levels": draw(st.one_of(WEIRD_SCALARS, st.lists(st.one_of(
                st.fixed_dictionaries({"nodeLabel": LEVEL_NAMES}), WEIRD_SCALARS), max_size=3)))}}


@st.composite
def priority_class(draw: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": draw(NAMES)},
            "value": draw(maybe(100))}


VALID = [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "good-node"},
     "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}}},
    {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "good-queue"}},
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "good-pod", "namespace": "good",
                                                     "labels": {"kai.scheduler/queue": "good-queue"}},
     "spec": {"schedulerName": "kai-scheduler",
              "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}},
]


@given(st.lists(st.one_of(node(), queue(), pod(), podgroup(), priority_class(), topology()), max_size=12),
       st.sampled_from(["kai-es/v4", "kai-es/v5"]))
def test_adversarial_objects_never_crash_and_valid_ones_still_schedule(objects: list[dict[str, Any]],
                                                                       policy: str) -> None:
    informer = InformerService(MemoryEventLog(), None, SimClock(1_000), SeededIds("fuzz"))  # type: ignore[arg-type]
    envelopes = []
    for obj in VALID[:2] + objects + VALID[2:]:
        env = informer.translate(ObjectChange(kind=str(obj.get("kind")), action="ADDED", obj=obj))
        if env is None:
            continue
        if isinstance(env.data, p.ObjectRejected):
            note(f"rejected: {env.data.path}: {env.data.reason}")
            assert env.data.reason, "a rejection must say why"
        envelopes.append(env)
    state = ClusterState()
    position = 0
    for env in envelopes:
        apply(state, Record(position, env))
        position += 1
    assert check(state, strict=False) == []
    cfg = SchedulerConfig(policy_version=policy)
    started = make_envelope(p.CycleStarted(cycle=1, config_digest=config_digest(cfg)), event_id="c1",
                            source="fuzz", subject="cycle/1", logicaltime=2_000, policyversion=policy)
    apply(state, Record(position, started))
    decisions = run_cycle(state, Record(position, started), cfg, load_packer("native"), verify=True)
    assert isinstance(decisions[-1].data, p.CycleCompleted)
    good = [d for d in decisions if d.subject == "pod/good/good-pod"]
    assert good, "the valid pod got no decision"
    assert isinstance(good[0].data, (p.BindingDecided, p.PodUnschedulable))


LOOPING_QUEUES: list[dict[str, Any]] = [{'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': 'n1'}, 'status': {'allocatable': {'cpu': '64', 'memory': '512Gi', 'nvidia.com/gpu': '8'}}}, {'apiVersion': 'scheduling.run.ai/v2', 'kind': 'Queue', 'metadata': {'name': 'a'}, 'spec': {'parentQueue': 'b'}}, {'apiVersion': 'scheduling.run.ai/v2', 'kind': 'Queue', 'metadata': {'name': 'b'}, 'spec': {'parentQueue': 'a'}}, {'apiVersion': 'scheduling.run.ai/v2', 'kind': 'Queue', 'metadata': {'name': 'under-a'}, 'spec': {'parentQueue': 'a'}}, {'apiVersion': 'scheduling.run.ai/v2', 'kind': 'Queue', 'metadata': {'name': 'me'}, 'spec': {'parentQueue': 'me'}}, {'apiVersion': 'scheduling.run.ai/v2', 'kind': 'Queue', 'metadata': {'name': 'q'}}, {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'in-loop', 'labels': {'kai.scheduler/queue': 'b'}}, 'spec': {'schedulerName': 'kai-scheduler', 'containers': [{'name': 'c', 'resources': {'requests': {'nvidia.com/gpu': '1'}}}]}}, {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'in-self-loop', 'labels': {'kai.scheduler/queue': 'me'}}, 'spec': {'schedulerName': 'kai-scheduler', 'containers': [{'name': 'c', 'resources': {'requests': {'nvidia.com/gpu': '1'}}}]}}, {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'below-loop', 'labels': {'kai.scheduler/queue': 'under-a'}}, 'spec': {'schedulerName': 'kai-scheduler', 'containers': [{'name': 'c', 'resources': {'requests': {'nvidia.com/gpu': '1'}}}]}}, {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'fine', 'labels': {'kai.scheduler/queue': 'q'}}, 'spec': {'schedulerName': 'kai-scheduler', 'containers': [{'name': 'c', 'resources': {'requests': {'nvidia.com/gpu': '1'}}}]}}]


def _cycle_of(objects: list[dict[str, Any]]) -> list[Any]:
    informer = InformerService(MemoryEventLog(), None, SimClock(1_000), SeededIds("loop"))  # type: ignore[arg-type]
    state = ClusterState()
    position = 0
    for obj in objects:
        env = informer.translate(ObjectChange(kind=str(obj["kind"]), action="ADDED", obj=obj))
        assert env is not None
        apply(state, Record(position, env))
        position += 1
    cfg = SchedulerConfig()
    started = make_envelope(p.CycleStarted(cycle=1, config_digest=config_digest(cfg)), event_id="c1",
                            source="t", subject="cycle/1", logicaltime=2_000)
    apply(state, Record(position, started))
    return run_cycle(state, Record(position, started), cfg, load_packer("native"), verify=True)


def test_a_queue_loop_holds_only_the_jobs_in_it_with_the_chain_as_reason() -> None:
    """Queues a -> b -> a, under-a -> a, me -> me: their pods wait with QueueLoop naming the
    chain; the pod of the healthy queue is bound."""
    decisions = _cycle_of(LOOPING_QUEUES)
    by_pod = {d.subject: d.data for d in decisions if d.subject.startswith("pod/")}
    assert isinstance(by_pod["pod/default/fine"], p.BindingDecided)
    for name, chain in (("in-loop", "b -> a -> b"), ("in-self-loop", "me -> me"), ("below-loop", "under-a -> a -> b -> a")):
        data = by_pod[f"pod/default/{name}"]
        assert isinstance(data, p.PodUnschedulable), name
        assert [r.code for r in data.reasons] == ["QueueLoop"], name
        assert chain in data.reasons[0].message, (name, data.reasons[0].message)


def test_crafted_observations_outside_the_bounds_are_counted_not_applied() -> None:
    """A CRC-valid log record can carry any integer: the fold refuses absurd quantities instead
    of allocating per-device lists of that length or handing the packer what it cannot hold."""
    state = ClusterState()
    crafted = [p.NodeObserved(name="huge", milli_cpu=8000, memory_bytes=2**30, gpus=10**8),
               p.NodeObserved(name="negative", milli_cpu=-1, memory_bytes=2**30),
               p.PodObserved(namespace="d", name="greedy", uid="u", podgroup="pg",
                             requests=p.PodResources(milli_cpu=2**70)),
               p.PodObserved(namespace="d", name="fractional", uid="u2", podgroup="pg",
                             gpu=p.GpuRequest(fraction_milli=5000))]
    for i, payload in enumerate(crafted):
        apply(state, Record(i, make_envelope(payload, event_id=f"e{i}", source="t", subject="s", logicaltime=i)))
    assert state.rejected_objects == 4
    assert not state.nodes and not state.pods
