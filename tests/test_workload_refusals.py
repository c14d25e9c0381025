"""Malformed owners, as the apiserver may return them (missing replicas, wrong types, huge or
negative counts): the podgrouper raises an IngestError naming the field, never anything else; the
informer rejects the pod with that message, the scenario loader names the document and the field.
And the rules that depend on more than the manifest: external PodGroups, an MPIJob's launcher, a
LeaderWorkerSet's LeaderReady, kinds the apiserver does not serve, owners it forbids."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import yaml

from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.ingest import podgrouper as pg
from kai_es.ingest.translate import GROUPING_ERROR_ANNOTATION, PODGROUP_ANNOTATION, IngestError
from kai_es.ports import ObjectChange
from kai_es.scenario import ScenarioError, load_scenario_text
from kai_es.scheduling.config import ConfigError, parse_config
from tests.test_workloads import Scripted, as_created, load
from tests.workloads import CASES, HEADER, NOCODE_RULES, Case

BY_KIND = {c.kind: c for c in CASES}
HUGE = 2**128


def owners_of(case: str, pod: str) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """A pod of a case (as created) and its owner chain, as the loader made them."""
    sc = load(BY_KIND[case])
    [obj] = [o for o in sc.objects if o.kind == "Pod" and o.obj["metadata"]["name"] == pod]
    return as_created(obj.obj), copy.deepcopy(obj.owners)


def setter(*path: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(obj: dict[str, Any]) -> None:
        cur: Any = obj
        for part in path[:-1]:
            cur = cur[part]
        if value is KeyError:
            del cur[path[-1]]
        else:
            cur[path[-1]] = value
    return apply


# (case, pod, which owner (index in the chain, -1: the top), change, the field named)
MALFORMED = [
    ("Job", "hpo-0", -1, setter("metadata", "annotations", "kai.scheduler/batch-min-member", value="all"),
     "metadata.annotations[kai.scheduler/batch-min-member]"),
    ("Job", "hpo-0", -1, setter("metadata", "annotations", "kai.scheduler/batch-min-member", value=str(HUGE)),
     "metadata.annotations[kai.scheduler/batch-min-member]"),
    ("Job", "hpo-0", -1, setter("metadata", "annotations", "kai.scheduler/batch-min-member", value="-1"),
     "metadata.annotations[kai.scheduler/batch-min-member]"),
    ("Job", "hpo-0", -1, setter("metadata", "annotations", "kai.scheduler/preemption-delay", value="soon"),
     "metadata.annotations[kai.scheduler/preemption-delay]"),
    ("StatefulSet", "shards-0", -1, setter("metadata", "annotations", "kai.scheduler/batch-min-member", value="1.5"),
     "metadata.annotations[kai.scheduler/batch-min-member]"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "pytorchReplicaSpecs", "Worker", "replicas", value="many"),
     "spec.pytorchReplicaSpecs.Worker.replicas"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "pytorchReplicaSpecs", "Worker", "replicas", value=KeyError),
     "spec.pytorchReplicaSpecs.Worker.replicas"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "pytorchReplicaSpecs", "Worker", "replicas", value=HUGE),
     "spec.pytorchReplicaSpecs.Worker.replicas"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "pytorchReplicaSpecs", "Worker", "replicas", value=-3),
     "spec.pytorchReplicaSpecs.Worker.replicas"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "pytorchReplicaSpecs", "Master", "replicas", value=True),
     "spec.pytorchReplicaSpecs.Master.replicas"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "pytorchReplicaSpecs", value=[1, 2]),
     "spec.pytorchReplicaSpecs"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "elasticPolicy", value={"minReplicas": 1.5}),
     "spec.elasticPolicy.minReplicas"),
    ("PyTorchJob", "mnist-worker-0", -1, setter("spec", "runPolicy", value={"schedulingPolicy": {"minAvailable": HUGE}}),
     "spec.runPolicy.schedulingPolicy.minAvailable"),
    ("PyTorchJob (elastic, segments)", "tp4-worker-0", None,
     setter("metadata", "annotations", "kai.scheduler/segment-size", value="0"),
     "metadata.annotations[kai.scheduler/segment-size]"),
    ("PyTorchJob (elastic, segments)", "tp4-worker-0", None,
     setter("metadata", "labels", "training.kubeflow.org/replica-index", value="-1"),
     "metadata.labels[training.kubeflow.org/replica-index]"),
    ("JobSet", "sim-workers-0-0", None, setter("metadata", "labels", "jobset.sigs.k8s.io/job-index", value=KeyError),
     "metadata.labels[jobset.sigs.k8s.io/job-index]"),
    ("LeaderWorkerSet", "vllm-0-1", None,
     setter("metadata", "labels", "leaderworkerset.sigs.k8s.io/group-index", value="first"),
     "metadata.labels[leaderworkerset.sigs.k8s.io/group-index]"),
    ("TFJob", "dist-mnist-worker-0", -1, setter("spec", "tfReplicaSpecs", "PS", "replicas", value=0),
     "spec.tfReplicaSpecs.PS.replicas"),
    ("MPIJob", "pi-worker-0", -1, setter("spec", "mpiReplicaSpecs", "Launcher", value=KeyError),
     "spec.mpiReplicaSpecs.Launcher"),
    ("XGBoostJob", "iris-worker-0", -1, setter("spec", "xgbReplicaSpecs", "Master", value=KeyError),
     "spec.xgbReplicaSpecs.Master"),
    ("JobSet", "sim-workers-0-0", -1, setter("spec", "replicatedJobs", 1, "replicas", value=-1),
     "spec.replicatedJobs[1].replicas"),
    ("JobSet", "sim-workers-0-0", -1, setter("spec", "replicatedJobs", 1, "replicas", value=HUGE),
     "spec.replicatedJobs[1].replicas"),
    ("JobSet", "sim-workers-0-0", -1, setter("spec", "replicatedJobs", 0, "template", "spec", "parallelism",
                                             value="two"),
     "spec.replicatedJobs[0].template.spec.parallelism"),
    ("JobSet", "sim-workers-0-0", -1, setter("spec", "replicatedJobs", value={"name": "x"}), "spec.replicatedJobs"),
    ("JobSet", "sim-workers-0-0", -1, setter("metadata", "annotations", value={"kai.scheduler/batch-min-member": "0"}),
     "metadata.annotations[kai.scheduler/batch-min-member]"),
    ("LeaderWorkerSet", "vllm-0-1", -1, setter("spec", "leaderWorkerTemplate", "size", value=KeyError),
     "spec.leaderWorkerTemplate.size"),
    ("LeaderWorkerSet", "vllm-0-1", -1, setter("spec", "leaderWorkerTemplate", "size", value=HUGE),
     "spec.leaderWorkerTemplate.size"),
    ("LeaderWorkerSet", "vllm-0-1", -1, setter("spec", "startupPolicy", value="Eventually"), "spec.startupPolicy"),
    ("LeaderWorkerSet", "vllm-0-1", -1, setter("spec", "leaderWorkerTemplate", "subGroupPolicy",
                                               value={"subGroupSize": 1}),
     "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize"),
    ("RayCluster", "raycluster-kuberay-head", -1, setter("spec", "workerGroupSpecs", 0, "minReplicas", value=9),
     "spec.workerGroupSpecs[0].minReplicas"),
    ("RayCluster", "raycluster-kuberay-head", -1, setter("spec", "workerGroupSpecs", 0, "numOfHosts", value=HUGE),
     "spec.workerGroupSpecs[0].numOfHosts"),
    ("RayCluster", "raycluster-kuberay-head", -1, setter("spec", "workerGroupSpecs", value="many"),
     "spec.workerGroupSpecs"),
    ("RayJob", "rayjob-sample-raycluster-head", -1, setter("status", "rayClusterName", value=7),
     "status.rayClusterName"),
    ("TrainingRun (no-code rule)", "run-0", -1, setter("spec", "minAvailable", value="most"), "spec.minAvailable"),
    ("TrainingRun (no-code rule)", "run-0", -1, setter("spec", "minAvailable", value=-2), "spec.minAvailable"),
]


def _rules(case: str) -> dict[tuple[str, str], pg.GroupingRule]:
    return pg.rules_by_kind(load(BY_KIND[case]).config.grouping)


@pytest.mark.parametrize(("case", "pod", "which", "change", "field"), MALFORMED,
                         ids=[f"{m[0]}:{m[4]}" for m in MALFORMED])
async def test_a_malformed_owner_is_an_ingest_error_naming_the_field(case: str, pod: str, which: int | None,
                                                                    change: Callable[[dict[str, Any]], None],
                                                                    field: str) -> None:
    obj, owners = owners_of(case, pod)
    chain = list(owners)
    target = obj if which is None else chain[which]
    change(target)
    sc = load(BY_KIND[case])
    related = {(o["kind"], o["metadata"]["name"]): o for o in sc.owners}
    with pytest.raises(IngestError) as err:
        pg.group_pod(obj, chain, related=related, rules=_rules(case))
    assert err.value.path == field, err.value
    assert f"{target['kind']} " in str(err.value)  # the object is named too

    # the informer: the pod is rejected with that message
    stored = {(o["kind"], o["metadata"]["name"]): o for o in [*chain, *sc.owners[len(chain):]]}
    stored |= {(o["kind"], o["metadata"]["name"]): o for o in chain}

    async def reader(api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        found = stored.get((kind, name))
        return (200, copy.deepcopy(found)) if found is not None else (404, {"details": {"name": name}})

    source = PodGroupingSource(Scripted([ObjectChange("Pod", "ADDED", obj)]), None, reader=reader,
                               rules=sc.config.grouping)
    [listed] = await source.list_objects()
    assert field in listed.obj["metadata"]["annotations"][GROUPING_ERROR_ANNOTATION]  # type: ignore[index]


@pytest.mark.parametrize(("case", "edit", "field"), [
    ("Job", lambda d: d["metadata"]["annotations"].update({"kai.scheduler/batch-min-member": str(HUGE)}),
     "metadata.annotations[kai.scheduler/batch-min-member]"),
    ("PyTorchJob", lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=HUGE),
     "spec.pytorchReplicaSpecs.Worker.replicas"),
    ("PyTorchJob", lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="three"),
     "spec.pytorchReplicaSpecs.Worker.replicas"),
    ("JobSet", lambda d: d["spec"]["replicatedJobs"][1].update(replicas=-1), "spec.replicatedJobs[1].replicas"),
    ("LeaderWorkerSet", lambda d: d["spec"]["leaderWorkerTemplate"].update(size=0), "spec.leaderWorkerTemplate.size"),
    ("RayCluster", lambda d: d["spec"]["workerGroupSpecs"][0].update(replicas=[3]),
     "spec.workerGroupSpecs[0].replicas"),
    ("SparkApplication", lambda d: d["spec"]["executor"].update(instances=HUGE), "spec.executor.instances"),
    ("SparkApplication", lambda d: d["spec"]["driver"].update(memory="lots"), "spec.driver.memory"),
    ("Service (Knative)", lambda d: d["spec"].update(template=[]), "spec.template"),
    ("TrainJob", lambda d: d["spec"]["runtimeRef"].update(name="missing"), "spec.runtimeRef"),
])
def test_the_loader_names_the_document_and_field(case: str, edit: Callable[[dict[str, Any]], None],
                                                 field: str) -> None:
    docs = list(yaml.safe_load_all(BY_KIND[case].manifest))
    edit(docs[-1])
    text = HEADER + yaml.safe_dump_all(docs, sort_keys=False)
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text, "w.yaml")
    message = str(err.value)
    assert f"(({docs[-1]['kind']}" not in message
    assert f"{docs[-1]['kind']} " in message and f"at {field}" in message, message


# -- what the manifest alone does not say ----------------------------------------------------------

def test_skip_podgrouper_and_external_podgroups_are_left_alone() -> None:
    obj, owners = owners_of("Job", "hpo-0")
    skipped = [copy.deepcopy(owners[0])]
    skipped[0]["metadata"]["annotations"]["kai.scheduler/skip-podgrouper"] = "true"
    assert pg.group_pod(obj, skipped) is None
    joined = copy.deepcopy(obj)
    joined["metadata"]["annotations"][PODGROUP_ANNOTATION] = "made-by-the-user"
    assert pg.group_pod(joined, owners) is None
    text = BY_KIND["Job"].text().replace("  template:\n    spec:", "  template:\n    metadata:\n"
                                         "      annotations: {pod-group-name: mine}\n    spec:") + """---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata: {name: mine}
spec: {minMember: 3, queue: team-a}
"""
    sc = load_scenario_text(text, "w.yaml")
    groups = [o.obj["metadata"]["name"] for o in sc.objects if o.kind == "PodGroup"]
    assert groups == ["mine"]  # the user's, and no made one


def test_an_mpijob_waiting_for_its_workers_leaves_the_launcher_out_until_it_exists() -> None:
    worker, owners = owners_of("MPIJob (WaitForWorkersReady)", "late-worker-0")
    launcher, launcher_owners = owners_of("MPIJob (WaitForWorkersReady)", "late-launcher-0")
    alone = pg.group_pod(worker, owners)
    assert alone is not None and alone.podgroup["spec"]["minMember"] == 2

    class Index:
        def has_pod(self, namespace: str, labels: dict[str, str]) -> bool:
            return all(launcher["metadata"]["labels"].get(k) == v for k, v in labels.items())

    with_launcher = pg.group_pod(worker, owners, pods=Index())
    assert with_launcher is not None and with_launcher.podgroup["spec"]["minMember"] == 3
    itself = pg.group_pod(launcher, launcher_owners)
    assert itself is not None and itself.podgroup["spec"]["minMember"] == 3


def test_a_leader_ready_leader_alone_needs_only_itself() -> None:
    leader, owners = owners_of("LeaderWorkerSet", "vllm-0")
    top = copy.deepcopy(owners[-1])
    top["spec"]["startupPolicy"] = "LeaderReady"
    chain = (*owners[:-1], top)
    pending = pg.group_pod(leader, chain)
    assert pending is not None and pending.podgroup["spec"]["minMember"] == 1
    bound = copy.deepcopy(leader)
    bound["spec"]["nodeName"] = "n1"
    running = pg.group_pod(bound, chain)
    assert running is not None and running.podgroup["spec"]["minMember"] == 4


def test_a_kind_at_a_version_kai_does_not_register_gets_the_default_grouper() -> None:
    obj, owners = owners_of("Notebook", "my-notebook-0")
    v1 = copy.deepcopy(owners[-1])
    v1["apiVersion"] = "kubeflow.org/v1"  # KAI's table has Notebook v1beta1 only
    grouping = pg.group_pod(obj, (owners[0], v1))
    assert grouping is not None and grouping.podgroup["spec"]["priorityClassName"] == "train"


async def test_an_unserved_kind_ends_the_chain_and_a_forbidden_one_stops_below_it() -> None:
    obj, owners = owners_of("Job", "hpo-0")
    calls: list[str] = []

    async def unserved(api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        calls.append(kind)
        return 404, {"kind": "Status", "message": "the server could not find the requested resource"}

    source = PodGroupingSource(Scripted([ObjectChange("Pod", "ADDED", obj)] * 2), None, reader=unserved)
    listed = await source.list_objects()
    groups = [c.obj for c in listed if c.kind == "PodGroup"]
    assert groups and groups[0]["spec"]["minMember"] == 1  # type: ignore[index]  # by the bare reference
    assert GROUPING_ERROR_ANNOTATION not in listed[-1].obj["metadata"]["annotations"]  # type: ignore[index]
    assert calls == ["Job"]  # said once: the kind is not asked for again

    async def forbidden(api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        return 403, {"kind": "Status", "message": "forbidden"}

    source = PodGroupingSource(Scripted([ObjectChange("Pod", "ADDED", obj)]), None, reader=forbidden)
    listed = await source.list_objects()
    made = [c.obj for c in listed if c.kind == "PodGroup"]
    assert made[0]["metadata"]["name"] == f"pg-hpo-0-{obj['metadata']['uid']}"  # type: ignore[index]  # the pod's own

    async def gone(api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        return 404, {"kind": "Status", "reason": "NotFound", "details": {"name": name, "kind": "jobs"}}

    source = PodGroupingSource(Scripted([ObjectChange("Pod", "ADDED", obj)]), None, reader=gone, retry_delay_s=0)
    [rejected] = await source.list_objects()
    assert "cannot read Job" in rejected.obj["metadata"]["annotations"][GROUPING_ERROR_ANNOTATION]  # type: ignore[index]


@pytest.mark.parametrize(("rule", "message"), [
    ({"group": "kubeflow.org", "kind": "PyTorchJob", "plural": "pytorchjobs"}, "has a built-in grouping rule"),
    ({"group": "example.com", "kind": "X"}, "plural"),
    ({"group": "example.com", "kind": "X", "plural": "xs", "replicasPath": "spec..replicas"}, "not a field path"),
    ({"group": "example.com", "kind": "X", "plural": "xs", "replicasPath": "spec.a",
      "components": [{"name": "c", "podSelector": {"r": "c"}, "replicasPath": "spec.c"}]}, "components exclude"),
    ({"group": "example.com", "kind": "X", "plural": "xs", "components": [{"name": "c", "replicasPath": "spec.c"}]},
     "podSelector"),
])
def test_a_malformed_grouping_rule_is_a_config_error(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config({"grouping": [rule]})


def test_grouping_rules_are_config_keys_that_leave_old_configs_alone() -> None:
    from kai_es.scheduling.config import SchedulerConfig, config_digest, config_to_dict  # noqa: PLC0415

    assert "grouping" not in config_to_dict(SchedulerConfig())  # an old config's digest is unchanged
    cfg = parse_config({"grouping": NOCODE_RULES})
    assert config_to_dict(cfg)["grouping"] == msgspec.to_builtins(cfg.grouping)
    assert config_digest(cfg) != config_digest(SchedulerConfig())
    assert parse_config(config_to_dict(cfg)) == cfg


def test_every_case_is_a_kind_of_the_table_or_a_rule() -> None:
    assert all(isinstance(c, Case) for c in CASES)


# -- never a crash ------------------------------------------------------------------------------

from hypothesis import given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kai_es.ingest import translate as tr  # noqa: E402

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**128), max_value=2**128),
                    st.floats(allow_nan=True), st.text(max_size=8), st.sampled_from(["3", "-1", str(2**128), "x"]),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_SAMPLES = [(c.kind, *owners_of(c.kind, next(iter(c.groups[0].pods))), _rules(c.kind)) for c in CASES]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@given(sample=st.sampled_from(_SAMPLES), data=st.data(), value=_VALUES)
def test_any_field_of_any_owner_set_to_anything_is_grouped_or_refused_never_a_crash(
        sample: tuple[str, dict[str, Any], tuple[dict[str, Any], ...], Any], data: st.DataObject, value: Any) -> None:
    kind, pod, owners, rules = sample
    pod, chain = copy.deepcopy(pod), [copy.deepcopy(o) for o in owners]
    target = data.draw(st.sampled_from([pod, *chain]))
    paths = [p for p in _paths(target) if p[0] in ("spec", "metadata", "status")]
    path = data.draw(st.sampled_from(paths))
    note(f"{kind}: {target.get('kind')} {path} = {value!r}")
    cur: Any = target
    for part in path[:-1]:
        cur = cur[part]
    cur[path[-1]] = value
    try:
        grouping = pg.group_pod(pod, chain, rules=rules)
    except IngestError:
        return
    if grouping is not None:
        tr.translate(grouping.podgroup)  # what the podgrouper makes, the translation always reads
        try:
            tr.translate(grouping.pod)
        except IngestError:
            pass  # (a pod made malformed here is refused, as any malformed pod)
