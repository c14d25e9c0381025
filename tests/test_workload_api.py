"""The Workload API's gangs (Kubernetes 1.36, scheduling.k8s.io/v1alpha2): a pod naming a
PodGroup in `spec.schedulingGroup` joins one KAI PodGroup per Kubernetes PodGroup, with the
gang's minCount (kai_es/ingest/groupers/workload_api.py). Pure grouping, and the scenario
loader's path for the same objects."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.events import payloads as p
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.ingest.groupers import workload_api as wa
from kai_es.ingest.translate import IngestError
from kai_es.ports import ObjectChange, Relist
from kai_es.oneshot import one_cycle
from kai_es.scenario import ScenarioError, load_scenario
from kai_es.scheduling.packing import load_packer
from tests.builders import MakePod, ScriptedSource


def pod(name: str = "w-0", uid: str = "u0", group: str | None = "train-pg", **labels: str) -> dict[str, Any]:
    make = MakePod(name, queue=None).gpu(1)
    for k, v in labels.items():
        make = make.label(k, v)
    obj = make.obj()
    obj["metadata"].update(uid=uid, namespace="ns")
    if group is not None:
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


def k8s_group(name: str = "train-pg", uid: str = "g1", policy: dict[str, Any] | None = None,
              **spec: Any) -> dict[str, Any]:
    return {"apiVersion": wa.API_VERSION, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "creationTimestamp": "2026-03-01T00:00:00Z"},
            "spec": {"schedulingPolicy": policy if policy is not None else {"gang": {"minCount": 4}}, **spec}}


def related(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(wa.RELATED_KIND, obj["metadata"]["name"]): obj}


def job(name: str = "train", uid: str = "j1", **annotations: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": dict(annotations),
                         "labels": {"kai.scheduler/queue": "team-a"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed"}}


def test_a_gang_podgroup_is_one_kai_group_of_its_min_count() -> None:
    g = pg.group_pod(pod(), [job()], related=related(k8s_group()))
    assert g is not None
    assert g.podgroup["metadata"]["name"] == "pg-train-pg-g1"
    assert g.podgroup["spec"]["minMember"] == 4
    # queue from the Job (the PodGroup sets none); the group is as old as the Kubernetes PodGroup
    assert g.podgroup["spec"]["queue"] == "team-a"
    assert g.podgroup["metadata"]["creationTimestamp"] == "2026-03-01T00:00:00Z"
    assert g.podgroup["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"
    assert g.pod["metadata"]["annotations"]["pod-group-name"] == "pg-train-pg-g1"
    observed = tr.translate(g.podgroup)
    assert isinstance(observed, p.PodGroupObserved) and observed.min_member == 4


def test_every_pod_of_the_podgroup_makes_the_same_group() -> None:
    """Pods of one PodGroup but different owners (a Deployment groups per pod otherwise) give one
    identical group object, so the informer emits it once."""
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "uid": "r1", "namespace": "ns"}}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "uid": "d1", "namespace": "ns"}}
    groups = [pg.group_pod(pod(f"web-1-{i}", f"u{i}"), [rs, dep], related=related(k8s_group())) for i in range(3)]
    assert all(g is not None for g in groups)
    assert len({repr(g.podgroup) for g in groups if g}) == 1


def test_basic_policy_is_a_group_of_minimum_one() -> None:
    g = pg.group_pod(pod(), [job()], related=related(k8s_group(policy={"basic": {}})))
    assert g is not None and g.podgroup["spec"]["minMember"] == 1


def test_the_podgroup_overrides_the_owner_rule_field_by_field() -> None:
    group = k8s_group(priorityClassName="inference")
    group["metadata"]["labels"] = {"kai.scheduler/queue": "team-b", "kai.scheduler/preemptibility": "non-preemptible"}
    group["metadata"]["annotations"] = {"kai.scheduler/staleness-grace-period": "5m"}
    owner = job(**{"kai.scheduler/batch-min-member": "2", "kai.scheduler/preemption-delay": "30s"})
    g = pg.group_pod(pod(), [owner], related=related(group))
    assert g is not None
    spec = g.podgroup["spec"]
    assert (spec["queue"], spec["priorityClassName"], spec["preemptibility"]) == ("team-b", "inference", "non-preemptible")
    assert spec["minMember"] == 4  # the gang's, not the Job's batch-min-member
    assert spec["stalenessGracePeriod"] == "5m" and spec["preemptionDelay"] == "30s"  # the Job's where the group is silent


def test_topology_key_is_a_level_of_the_named_topology() -> None:
    group = k8s_group(schedulingConstraints={"topology": [{"key": "example.com/rack"}]})
    group["metadata"]["annotations"] = {"kai.scheduler/topology": "dc"}
    g = pg.group_pod(pod(), [job()], related=related(group))
    assert g is not None
    assert g.podgroup["spec"]["topologyConstraint"] == {"topology": "dc", "requiredTopologyLevel": "example.com/rack"}


def test_a_topology_key_without_a_topology_is_refused_not_dropped() -> None:
    group = k8s_group(schedulingConstraints={"topology": [{"key": "example.com/rack"}]})
    with pytest.raises(IngestError, match=r"PodGroup ns/train-pg: spec.schedulingConstraints.topology: .*kai.scheduler/topology"):
        pg.group_pod(pod(), [job()], related=related(group))


def test_a_missing_podgroup_is_no_group_of_one() -> None:
    with pytest.raises(IngestError, match=r"spec.schedulingGroup.podGroupName: PodGroup 'train-pg' .*does not exist"):
        pg.group_pod(pod(), [job()], related={})


def test_opt_out_keeps_the_owner_rule() -> None:
    g = pg.group_pod(pod(), [job(**{wa.IGNORE_ANNOTATION: "true"})], related={})
    assert g is not None and g.podgroup["metadata"]["name"] == "pg-train-j1"
    g = pg.group_pod({**pod(), "metadata": {**pod()["metadata"], "annotations": {wa.IGNORE_ANNOTATION: "true"}}},
                     [job()], related={})
    assert g is not None and g.podgroup["metadata"]["name"] == "pg-train-j1"


def test_a_kai_pod_group_name_wins() -> None:
    named = pod()
    named["metadata"]["annotations"] = {"pod-group-name": "mine"}
    assert pg.group_pod(named, [job()], related={}) is None


def test_the_job_controllers_podgroup_does_not_split_a_jobset() -> None:
    """Under WorkloadWithJob the Job controller gives each of a JobSet's Jobs a PodGroup; the
    JobSet's own gang (all its Jobs) is kept."""
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {"name": "js", "uid": "s1", "namespace": "ns"},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 2,
                                       "template": {"spec": {"parallelism": 2, "completions": 2}}}]}}
    child = job("js-w-0", "j2")
    child["metadata"]["labels"] = {"jobset.sigs.k8s.io/replicatedjob-name": "w", "jobset.sigs.k8s.io/job-index": "0"}
    member = pod(**{"jobset.sigs.k8s.io/replicatedjob-name": "w", "jobset.sigs.k8s.io/job-index": "0"})
    group = k8s_group()
    group["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "js-w-0",
                                             "uid": "j2", "controller": True}]
    g = pg.group_pod(member, [child, js], related=related(group))
    assert g is not None and g.podgroup["metadata"]["name"] == "pg-js-s1"
    # the same PodGroup for a Job of its own is the gang
    g = pg.group_pod(pod(), [job()], related=related(group))
    assert g is not None and g.podgroup["metadata"]["name"] == "pg-train-pg-g1"


@pytest.mark.parametrize(("policy", "field"), [
    ({}, "spec.schedulingPolicy"),
    ({"basic": {}, "gang": {"minCount": 2}}, "spec.schedulingPolicy"),
    ({"gang": {}}, "spec.schedulingPolicy.gang.minCount"),
    ({"gang": {"minCount": 0}}, "spec.schedulingPolicy.gang.minCount"),
    ({"gang": {"minCount": "four"}}, "spec.schedulingPolicy.gang.minCount"),
    ({"gang": {"minCount": 2**31}}, "spec.schedulingPolicy.gang.minCount"),
    ({"gang": {"minCount": True}}, "spec.schedulingPolicy.gang.minCount"),
    ({"gang": [4]}, "spec.schedulingPolicy.gang"),
])
def test_a_malformed_podgroup_is_refused_naming_the_field(policy: dict[str, Any], field: str) -> None:
    with pytest.raises(IngestError) as info:
        pg.group_pod(pod(), [job()], related=related(k8s_group(policy=policy)))
    assert f"PodGroup ns/train-pg: {field}:" in str(info.value)


@pytest.mark.parametrize("value", [None, "", 7, ["x"], {"podGroupName": 3}, {"podGroupName": ""}])
def test_a_malformed_scheduling_group_is_refused(value: Any) -> None:
    obj = pod(group=None)
    obj["spec"]["schedulingGroup"] = value
    if value is None:  # absent: the owner rule alone
        g = pg.group_pod(obj, [job()])
        assert g is not None and g.podgroup["metadata"]["name"] == "pg-train-j1"
        return
    with pytest.raises(IngestError, match=r"spec.schedulingGroup"):
        pg.group_pod(obj, [job()], related={})


@given(st.integers(min_value=-(2**130), max_value=2**130))
def test_min_count_of_any_integer_is_kept_or_refused(n: int) -> None:
    try:
        g = pg.group_pod(pod(), [job()], related=related(k8s_group(policy={"gang": {"minCount": n}})))
    except IngestError as exc:
        assert not 1 <= n <= 2**31 - 1
        assert "minCount" in str(exc)
    else:
        assert g is not None and g.podgroup["spec"]["minMember"] == n and 1 <= n <= 2**31 - 1


def cluster(queue: str) -> str:
    """A 4-GPU node and a queue of quota 8, as scenario documents."""
    return f"""\
apiVersion: v1
kind: Node
metadata: {{name: node-a}}
status: {{allocatable: {{nvidia.com/gpu: "4", cpu: "32", memory: 128Gi}}}}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {{name: {queue}}}
spec: {{resources: {{gpu: {{quota: 8, limit: -1, overQuotaWeight: 1}}}}}}
"""


def indexed_job(template_line: str = "") -> str:
    """An Indexed Job of 5 one-GPU pods in namespace ml (`template_line`: one more field of its
    pod spec)."""
    extra = f"\n      {template_line}" if template_line else ""
    return f"""\
apiVersion: batch/v1
kind: Job
metadata: {{name: train, namespace: ml}}
spec:
  parallelism: 5
  completions: 5
  completionMode: Indexed
  template:
    spec:
      schedulerName: kai-scheduler{extra}
      restartPolicy: Never
      containers:
      - name: main
        image: example.invalid/train:1
        resources: {{limits: {{nvidia.com/gpu: "1"}}}}
"""


SCENARIO = """\
apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: workload-api}
---
""" + cluster("team-a") + """\
---
apiVersion: scheduling.k8s.io/v1alpha2
kind: PodGroup
metadata: {name: trainers, namespace: ml, labels: {kai.scheduler/queue: team-a}}
spec:
  schedulingPolicy: {gang: {minCount: MIN}}
---
""" + indexed_job("schedulingGroup: {podGroupName: trainers}")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_the_scenario_loader_groups_by_the_same_rule(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SCENARIO.replace("MIN", "5")))
    groups = [o.payload for o in scenario.objects if isinstance(o.payload, p.PodGroupObserved)]
    pods = [o.obj for o in scenario.objects if o.kind == "Pod"]
    assert [(g.name, g.min_member, g.queue) for g in groups] == [(groups[0].name, 5, "team-a")]
    assert groups[0].name.startswith("pg-trainers-")
    assert {p_["metadata"]["annotations"]["pod-group-name"] for p_ in pods} == {groups[0].name}
    assert len(pods) == 5


def test_a_scenario_pod_naming_a_missing_podgroup_is_refused(tmp_path: Path) -> None:
    text = SCENARIO.replace("MIN", "5").replace("podGroupName: trainers", "podGroupName: nobody")
    with pytest.raises(ScenarioError, match=r"spec.schedulingGroup.podGroupName: .*'nobody'"):
        load_scenario(write(tmp_path, text))


@pytest.mark.parametrize("packer", ["reference", "native"])
def test_the_gang_waits_whole_in_a_cycle(tmp_path: Path, packer: str) -> None:
    """5 pods of a gang of 5 on 4 GPUs: none is placed; with minCount 4, four are."""
    for minimum, placed in ((5, 0), (4, 4)):
        outcome = one_cycle(load_scenario(write(tmp_path, SCENARIO.replace("MIN", str(minimum)))), load_packer(packer))
        statuses = sorted(v["status"] for v in outcome["pods"].values())
        assert statuses.count("Binding") == placed, (minimum, statuses)
        assert statuses.count("Pending") == 5 - placed, (minimum, statuses)


def test_the_rule_is_not_applied_without_the_field() -> None:
    """Removing the rule's hook would group these pods by the Job (pg-train-j1): the gang's name
    and minimum come only from the PodGroup."""
    g = pg.group_pod(pod(), [job()], related=related(k8s_group()))
    assert g is not None and g.podgroup["metadata"]["name"] != "pg-train-j1"
    assert copy.deepcopy(g.podgroup) == g.podgroup


class Watching(ScriptedSource):
    """An inner source that lists and watches the Workload API's PodGroups too."""

    kinds: tuple[str, ...] = ("PodGroup", "WorkloadPodGroup", "Pod")


def bare(name: str, uid: str, group: str = "train-pg") -> dict[str, Any]:
    return pod(name, uid, group=group)


def made(changes: Sequence[ObjectChange | Relist]) -> list[tuple[str, str, str, str]]:
    out = []
    for c in changes:
        assert isinstance(c, ObjectChange)
        ann = c.obj["metadata"].get("annotations") or {}  # type: ignore[index]
        out.append((c.kind, c.action, c.obj["metadata"]["name"],  # type: ignore[index]
                    ann.get("pod-group-name") or ann.get(tr.GROUPING_ERROR_ANNOTATION, "")[:40]))
    return out


async def test_the_informer_groups_by_the_watched_podgroups_and_waits_for_a_missing_one() -> None:
    """Listed PodGroups group the listed pods; a pod whose PodGroup comes later is rejected with
    the reason until the PodGroup's ADDED arrives, then passed on grouped; the Workload API's
    objects themselves never reach the log."""
    group, later = k8s_group(), k8s_group("later-pg", "g2", policy={"gang": {"minCount": 2}})
    source = PodGroupingSource(Watching(
        [ObjectChange("WorkloadPodGroup", "ADDED", group), ObjectChange("Pod", "ADDED", bare("a", "ua"))],
        [[ObjectChange("Pod", "ADDED", bare("b", "ub", "later-pg"))],
         [ObjectChange("WorkloadPodGroup", "ADDED", later)],
         [ObjectChange("Pod", "ADDED", bare("c", "uc", "later-pg"))]]), api=None)  # type: ignore[arg-type]
    listed = await source.list_objects()
    assert made(listed) == [("PodGroup", "ADDED", "pg-train-pg-g1", ""), ("Pod", "ADDED", "a", "pg-train-pg-g1")]
    assert listed[0].obj["spec"]["minMember"] == 4  # type: ignore[index]
    batches = [list(b) async for b in source.changes()]
    assert made(batches[0]) == [("Pod", "ADDED", "b", "Pod ns/b: spec.schedulingGroup.podGroupN")]
    assert "does not exist (yet)" in batches[0][0].obj["metadata"]["annotations"][tr.GROUPING_ERROR_ANNOTATION]  # type: ignore[index,union-attr]
    assert made(batches[1]) == [("PodGroup", "ADDED", "pg-later-pg-g2", ""), ("Pod", "MODIFIED", "b", "pg-later-pg-g2")]
    assert made(batches[2]) == [("Pod", "ADDED", "c", "pg-later-pg-g2")]  # the group unchanged: not again


async def test_the_informer_reads_a_podgroup_it_does_not_watch() -> None:
    reads: list[tuple[str, str, str, str]] = []

    async def reader(api_version: str, kind: str, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        reads.append((api_version, kind, ns, name))
        if name == "train-pg":
            return 200, k8s_group()
        return 404, {"message": "not found", "details": {"name": name}}

    inner = Watching([ObjectChange("Pod", "ADDED", bare("a", "ua")), ObjectChange("Pod", "ADDED", bare("b", "ub", "nobody"))], [])
    inner.kinds = ("PodGroup", "Pod")  # no watch of the Workload API: each PodGroup is read
    source = PodGroupingSource(inner, api=None, reader=reader)
    listed = await source.list_objects()
    assert made(listed)[:2] == [("PodGroup", "ADDED", "pg-train-pg-g1", ""), ("Pod", "ADDED", "a", "pg-train-pg-g1")]
    assert made(listed)[2][:3] == ("Pod", "ADDED", "b") and "does not exist" in listed[2].obj["metadata"]["annotations"][tr.GROUPING_ERROR_ANNOTATION]  # type: ignore[index]
    assert reads == [(wa.API_VERSION, "PodGroup", "ns", "train-pg"), (wa.API_VERSION, "PodGroup", "ns", "nobody")]


GATED = """\
apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: workload-with-job}
spec:
  cluster: {featureGates: GATES}
---
""" + cluster("default-queue") + """\
---
""" + indexed_job()


@pytest.mark.parametrize(("gates", "placed", "min_member"), [
    ("{WorkloadWithJob: true}", 0, 5),  # the Job controller's PodGroup: a gang of 5 on 4 GPUs
    ("{GenericWorkload: true, WorkloadWithJob: true}", 0, 5),
    ("{}", 4, 1),  # KAI's default grouper: a Job is a group of minimum 1
    ("{WorkloadWithJob: false}", 4, 1),
])
def test_the_job_controller_emulates_workload_with_job(tmp_path: Path, gates: str, placed: int, min_member: int) -> None:
    scenario = load_scenario(write(tmp_path, GATED.replace("GATES", gates)))
    groups = [o.payload for o in scenario.objects if isinstance(o.payload, p.PodGroupObserved)]
    assert [g.min_member for g in groups] == [min_member]
    outcome = one_cycle(scenario, load_packer("native"))
    assert sorted(v["status"] for v in outcome["pods"].values()).count("Binding") == placed


@pytest.mark.parametrize(("gates", "field"), [
    ("{WorkloadWithJobs: true}", "spec.cluster.featureGates.WorkloadWithJobs"),
    ("{WorkloadWithJob: yes-please}", "spec.cluster.featureGates.WorkloadWithJob"),
    ("{WorkloadWithJob: true, GenericWorkload: false}", "spec.cluster.featureGates.WorkloadWithJob"),
    ("[WorkloadWithJob]", "spec.cluster.featureGates"),
])
def test_bad_feature_gates_are_refused_naming_the_field(tmp_path: Path, gates: str, field: str) -> None:
    with pytest.raises(ScenarioError, match=f"at {field}:"):
        load_scenario(write(tmp_path, GATED.replace("GATES", gates)))


def test_with_the_gate_a_jobset_keeps_its_own_gang(tmp_path: Path) -> None:
    """The Job controller gives each of a JobSet's Indexed Jobs a PodGroup; the JobSet's group
    (one gang over both Jobs, sub-groups per replicated job) is what kai-es schedules, as without
    the gate."""
    jobset = """\
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js, namespace: ml}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 2
        completions: 2
        completionMode: Indexed
        template:
          spec:
            schedulerName: kai-scheduler
            restartPolicy: Never
            containers:
            - name: main
              image: example.invalid/train:1
              resources: {limits: {nvidia.com/gpu: "1"}}
"""
    base = GATED[:GATED.index("---\napiVersion: batch/v1")]
    with_gate = load_scenario(write(tmp_path, base.replace("GATES", "{WorkloadWithJob: true}") + jobset))
    without = load_scenario(write(tmp_path, base.replace("GATES", "{}") + jobset))

    def groups(s: Any) -> list[tuple[str, int | None, int | None]]:
        return [(o.payload.name, o.payload.min_member, o.payload.min_subgroup)
                for o in s.objects if isinstance(o.payload, p.PodGroupObserved)]

    assert groups(with_gate) == groups(without) and len(groups(with_gate)) == 1
    pods = [o.obj for o in with_gate.objects if o.kind == "Pod"]
    assert len(pods) == 4 and all("schedulingGroup" in pod["spec"] for pod in pods)  # the gate did act


_json = st.recursive(st.none() | st.booleans() | st.integers(min_value=-(2**128), max_value=2**128)
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
_fields = st.sampled_from(["schedulingPolicy", "priorityClassName", "schedulingConstraints", "podGroupTemplateRef"])


@given(spec=st.dictionaries(_fields, _json, max_size=4) | st.builds(
           lambda n, extra: {"schedulingPolicy": {"gang": {"minCount": n}}, **extra},
           st.integers(min_value=-(2**128), max_value=2**128), st.dictionaries(_fields, _json, max_size=2)),
       labels=st.dictionaries(st.sampled_from(["kai.scheduler/queue", "priorityClassName", "kai.scheduler/preemptibility",
                                               "x"]), st.text(max_size=8), max_size=3),
       group=_json | st.just({"podGroupName": "train-pg"}))
def test_any_podgroup_or_scheduling_group_is_grouped_or_refused_with_a_reason(
        spec: dict[str, Any], labels: dict[str, str], group: Any) -> None:
    """Whatever a PodGroup's spec or a pod's schedulingGroup holds (wrong types, integers up to
    2^128, nesting), the grouping either groups the pod or raises IngestError naming a field;
    nothing else escapes."""
    obj = k8s_group()
    obj["spec"] = spec
    obj["metadata"]["labels"] = labels
    member = pod()
    if group is not None:
        member["spec"]["schedulingGroup"] = group
    try:
        g = pg.group_pod(member, [job()], related=related(obj))
    except IngestError as exc:
        assert "spec." in str(exc) or "metadata." in str(exc), exc
    else:
        assert g is not None
        try:  # what the informer passes on: translated, or rejected alone with a reason
            tr.translate(g.podgroup)
        except IngestError as exc:
            assert "spec." in str(exc) or "metadata." in str(exc), exc
