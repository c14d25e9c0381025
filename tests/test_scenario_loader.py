"""Scenario files: expansion of owners, defaults, and errors that name file, document and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_es.events import payloads as p
from kai_es.scenario import ScenarioError, load_scenario, load_scenario_text
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

ROOT = Path(__file__).resolve().parents[1]


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "bad.yaml")
    return str(info.value)


def test_examples_load() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        sc = load_scenario(path)
        assert sc.objects, path


def test_unknown_kind_names_file_document_and_field() -> None:
    msg = _error(scenario_text(queue("team-a"), {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}))
    assert msg.startswith("bad.yaml: document 2 (Service s) at kind: unsupported object v1/Service")


def test_bad_quantity() -> None:
    msg = _error(scenario_text(queue("team-a"), MakePod("a").req(cpu="lots").obj()))
    assert "document 2 (Pod default/a) at spec.containers[0].resources.requests.cpu" in msg
    assert "not a quantity" in msg


def test_pod_naming_a_missing_queue() -> None:
    msg = _error(scenario_text(queue("team-a"), MakePod("a", queue="nope").obj()))
    assert "document 2 (Pod default/a) at metadata.labels[kai.scheduler/queue]" in msg
    assert "queue 'nope' is not defined" in msg


def test_negative_quota() -> None:
    msg = _error(scenario_text(queue("team-a", gpu_quota=-5)))
    assert "document 1 (Queue team-a) at spec.resources.gpu.quota" in msg
    assert "-1 (unlimited) or >= 0" in msg


def test_pod_without_queue_and_jobs_in_parent_queues() -> None:
    assert "has no queue" in _error(scenario_text(queue("team-a"), MakePod("a", queue=None).obj()))
    msg = _error(scenario_text(queue("root"), queue("team-a", parent="root"), MakePod("a", queue="root").obj()))
    assert "is a parent queue" in msg


def test_gpu_fraction_out_of_range() -> None:
    msg = _error(scenario_text(queue("team-a"), MakePod("a").fraction("1.5").obj()))
    assert "metadata.annotations[gpu-fraction]" in msg and "between 0 and 1" in msg


def test_invalid_yaml_and_bad_scenario_settings() -> None:
    assert "not valid YAML" in _error("a: [b\n")
    msg = _error(scenario_text(queue("team-a"), settings={"scheduler": {"placementStrategy": {"gpu": "best"}}}))
    assert "spec.scheduler" in msg and "placementStrategy.gpu" in msg
    assert "unknown field" in _error(scenario_text(settings={"simulaton": {}}))


def test_missing_file() -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario("/nonexistent/x.yaml")


def test_fraction_is_exact_milli_and_memory_is_mib() -> None:
    sc = load_scenario_text(scenario_text(queue("team-a"), MakePod("a").fraction("0.25").obj(),
                                          MakePod("b").gpu_memory(20480).obj()))
    pods = {o.payload.name: o.payload for o in sc.objects if isinstance(o.payload, p.PodObserved)}
    assert pods["a"].gpu == p.GpuRequest(fraction_milli=250, fraction_devices=1)
    assert pods["b"].gpu == p.GpuRequest(gpu_memory_mib=20480, fraction_devices=1)
    assert pods["a"].requests == p.PodResources(milli_cpu=1000, memory_bytes=2**30)


def test_queue_units_follow_kai() -> None:
    sc = load_scenario_text(scenario_text(queue("team-a", gpu_quota="0.5", cpu={"quota": 4000},
                                                memory={"quota": 1024})))
    q = sc.objects[0].payload
    assert isinstance(q, p.QueueObserved)
    assert q.gpu.quota == 500
    assert q.priority == 100


def test_job_expands_to_pods_and_a_podgroup() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train", "labels": {"kai.scheduler/queue": "team-a"},
                        "annotations": {"kai.scheduler/batch-min-member": "2", "kai-es.io/run-for": "1h"}},
           "spec": {"parallelism": 3, "template": {"spec": {"schedulerName": "kai-scheduler", "containers": [
               {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}}
    sc = load_scenario_text(scenario_text(queue("team-a"), job))
    groups = [o.payload for o in sc.objects if isinstance(o.payload, p.PodGroupObserved)]
    pods = [o for o in sc.objects if isinstance(o.payload, p.PodObserved)]
    assert len(groups) == 1 and groups[0].min_member == 2 and groups[0].queue == "team-a"
    assert groups[0].priority_class == "train"
    assert [o.payload.name for o in pods] == ["train-0", "train-1", "train-2"]
    assert all(o.payload.podgroup == groups[0].name and not o.payload.implicit_podgroup for o in pods)
    assert all(o.payload.owner is not None and o.payload.owner.kind == "Job" for o in pods)
    assert all(o.run_for_ns == 3_600_000_000_000 for o in pods)


def test_pytorchjob_is_one_gang_master_first() -> None:
    tmpl = {"spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "pt", "labels": {"kai.scheduler/queue": "team-a"}},
           "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": tmpl},
                                            "Master": {"replicas": 1, "template": tmpl}}}}
    sc = load_scenario_text(scenario_text(queue("team-a"), job))
    names = [o.payload.name for o in sc.objects if isinstance(o.payload, p.PodObserved)]
    assert names == ["pt-master-0", "pt-worker-0", "pt-worker-1"]
    [group] = [o.payload for o in sc.objects if isinstance(o.payload, p.PodGroupObserved)]
    assert group.min_member == 3


def test_deployment_pods_get_a_group_each_with_inference_priority() -> None:
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "svc", "labels": {"kai.scheduler/queue": "team-a"}},
           "spec": {"replicas": 2, "template": {"spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}}}}
    sc = load_scenario_text(scenario_text(queue("team-a"), dep))
    groups = [o.payload for o in sc.objects if isinstance(o.payload, p.PodGroupObserved)]
    assert len(groups) == 2 and all(g.priority_class == "inference" and g.min_member == 1 for g in groups)


def test_document_order_is_creation_order_and_loading_is_deterministic() -> None:
    text = scenario_text(queue("team-a"), MakePod("b").obj(), MakePod("a").obj())
    one = load_scenario_text(text)
    two = load_scenario_text(text)
    pods = [o.payload for o in one.objects if isinstance(o.payload, p.PodObserved)]
    assert pods[0].created_ns < pods[1].created_ns
    assert [o.payload for o in one.objects] == [o.payload for o in two.objects]


def test_running_pod_on_unknown_node_is_an_error() -> None:
    msg = _error(scenario_text(queue("team-a"), MakePod("a").running_on("ghost").obj()))
    assert "spec.nodeName" in msg and "ghost" in msg


def test_explicit_podgroup_must_exist_and_be_valid() -> None:
    assert "PodGroup 'pg' is not defined" in _error(scenario_text(queue("team-a"), MakePod("a").group("pg").obj()))
    assert "spec.minMember" in _error(scenario_text(queue("team-a"), podgroup("pg", -1)))
    assert "spec.queue" in _error(scenario_text(queue("team-a"), podgroup("pg", 1, "ghost")))


def test_node_translation() -> None:
    sc = load_scenario_text(scenario_text(MakeNode("n").gpus(4).gpu_memory(40960).taint("dedicated").obj()))
    node = sc.objects[0].payload
    assert isinstance(node, p.NodeObserved)
    assert (node.gpus, node.gpu_memory_mib, node.milli_cpu, node.memory_bytes) == (4, 40960, 32000, 256 * 2**30)
    assert node.taints == (p.Taint(key="dedicated", effect="NoSchedule"),)


def test_a_queue_loop_is_rejected_naming_the_chain() -> None:
    msg = _error(scenario_text(queue("a", parent="b"), queue("b", parent="a"), queue("q")))
    assert "document 1 (Queue a) at spec.parentQueue: the parent chain never reaches a root queue: a -> b -> a" in msg
    assert "(Queue me) at spec.parentQueue" in _error(scenario_text(queue("me", parent="me")))


@pytest.mark.parametrize(("doc", "where", "what"), [
    (MakeNode("n").gpus(100_000_000).obj(), "status.allocatable[nvidia.com/gpu]", "above the largest accepted (4096)"),
    (MakeNode("n").gpu_memory(2**41).obj(), "metadata.labels[nvidia.com/gpu.memory]", "above the largest accepted"),
    (MakePod("a").req(cpu=str(2**62)).obj(), "spec.containers[0].resources.requests.cpu", "above the largest accepted"),
    (MakePod("a").req(cpu="-1").obj(), "spec.containers[0].resources.requests.cpu", "must not be negative"),
    (MakePod("a").gpu(-1).obj(), "spec.containers[0].resources.requests[nvidia.com/gpu]", "must not be negative"),
    (MakePod("a").annotate("gpu-fraction", "0.5").annotate("gpu-fraction-num-devices", "100000000").obj(),
     "metadata.annotations[gpu-fraction-num-devices]", "above the largest accepted"),
    ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "labels": {"kai.scheduler/queue": "team-a"}},
      "spec": {"parallelism": 100_000_000, "template": {"spec": {"containers": []}}}},
     "spec.parallelism", "more than a scenario may expand one owner into"),
])
def test_absurd_quantities_are_rejected_naming_the_field(doc: dict, where: str, what: str) -> None:  # type: ignore[type-arg]
    msg = _error(scenario_text(queue("team-a"), doc))
    assert f"at {where}" in msg and what in msg, msg


@pytest.mark.parametrize(("spec", "where", "what"), [
    ({"minMember": 2, "minSubGroup": 1, "subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "minMember": 1}]},
     "spec.minSubGroup", "minMember and minSubGroup are mutually exclusive"),
    ({"minSubGroup": 3, "subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "minMember": 1}]},
     "spec.minSubGroup", "minSubGroup (3) exceeds the number of direct child sub-groups (2)"),
    ({"subGroups": [{"name": "a", "minMember": 1, "minSubGroup": 1}]},
     "spec.subGroups[0].minSubGroup", "mutually exclusive"),
    ({"subGroups": [{"name": "a", "minSubGroup": 1}]},
     "spec.subGroups[0].minSubGroup", "minSubGroup cannot be set on a leaf"),
    ({"subGroups": [{"name": "a"}]}, "spec.subGroups[0].minMember", "minMember is required"),
    ({"subGroups": [{"name": "p", "minMember": 1}, {"name": "c", "parent": "p", "minMember": 1}]},
     "spec.subGroups[0].minMember", "use minSubGroup instead of minMember"),
    ({"subGroups": [{"name": "p", "minSubGroup": 2}, {"name": "c", "parent": "p", "minMember": 1}]},
     "spec.subGroups[0].minSubGroup", "exceeds its number of direct child sub-groups (1)"),
])
def test_podgroup_validation_is_kais(spec: dict, where: str, what: str) -> None:  # type: ignore[type-arg]
    group = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": {"name": "pg"},
             "spec": {"queue": "team-a", **spec}}
    msg = _error(scenario_text(queue("team-a"), group))
    assert f"(PodGroup default/pg) at {where}" in msg and what in msg, msg
