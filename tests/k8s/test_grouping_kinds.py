"""Every owner kind of the podgrouper's table through a real apiserver: the owners and pods the
scenario loader's controllers make of each manifest in tests/workloads.py are created (CRDs
installed for the operators' kinds, uids the apiserver's), and the informer's grouping source,
reading them as kai-es's least-privilege identity (deploy/rbac), makes the PodGroups the loader
made. An owner kind whose CRD is not installed is grouped by its reference, without an error.
No controllers run: owners and pods are created with ownerReferences (the control plane's
kube-controller-manager is stopped for this module — its Deployment, ReplicaSet, StatefulSet and
Job controllers would add pods of their own — and started again after it)."""


from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.adapters.kubernetes.source import KubernetesSource
from kai_es.ingest.groupers import CHAIN_ONLY, TABLE
from kai_es.ingest.translate import GROUPING_ERROR_ANNOTATION, PODGROUP_ANNOTATION, SUBGROUP_LABEL
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, gpu_pod
from tests.test_workloads import as_created, load
from tests.workloads import CASES, NOCODE_RULES, Case

BUILT_IN = {("", "Pod"), ("apps", "Deployment"), ("apps", "ReplicaSet"), ("apps", "StatefulSet"),
            ("batch", "Job"), ("batch", "CronJob")}
PATHS = {"Pod": "/api/v1/namespaces/{ns}/pods", "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
         "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
         "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
         "Job": "/apis/batch/v1/namespaces/{ns}/jobs", "CronJob": "/apis/batch/v1/namespaces/{ns}/cronjobs"}


def crd(group: str, kind: str, plural: str, versions: list[str]) -> dict[str, Any]:
    # (a group under k8s.io is protected: the operator's CRD carries its approval, as here)
    approved = {"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/1111"} \
        if group.endswith((".k8s.io", ".kubernetes.io")) else {}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}", "annotations": approved},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": v, "served": True, "storage": i == 0,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}
                                  for i, v in enumerate(versions)]}}


def operator_crds() -> list[dict[str, Any]]:
    """A CRD per operator kind of the table (and the chain's Knative kinds), at the versions
    the cases use, schema-less."""
    versions: dict[tuple[str, str], set[str]] = {}
    for case in CASES:
        for obj in load(case).owners:
            group, _, version = str(obj["apiVersion"]).rpartition("/")
            versions.setdefault((group, obj["kind"]), set()).add(version)
    out = []
    for (group, kind), vs in sorted(versions.items()):
        if (group, kind) in BUILT_IN:
            continue
        plural = TABLE[(group, kind)].plural if (group, kind) in TABLE else CHAIN_ONLY.get(
            (group, kind), kind.lower() + "s")
        out.append(crd(group, kind, plural, sorted(vs)))
    return out


def accepted(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the apiserver's validation takes it: the few fields a controller would set on
    the objects it creates (selectors, restart policies, GPU limits)."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("uid", None)
    obj["metadata"].pop("creationTimestamp", None)
    kind = obj["kind"]
    spec = obj.setdefault("spec", {}) if (api_group(obj), kind) in BUILT_IN else obj.get("spec")
    _gpu_limits(obj)
    if kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        name = obj["metadata"]["name"]
        template = spec.get("template") or {"spec": {"containers": [{"name": "c", "image": "example.invalid/x:1"}]}}
        template = copy.deepcopy(template)
        template.setdefault("metadata", {}).setdefault("labels", {})["kai-es.io/test-owner"] = name
        spec.update(selector={"matchLabels": {"kai-es.io/test-owner": name}}, template=template)
        if kind == "StatefulSet":
            spec.setdefault("serviceName", name)
    if kind == "Job":
        spec.setdefault("template", {}).setdefault("spec", {}).setdefault("restartPolicy", "Never")
        spec["suspend"] = True
    if kind == "CronJob":
        spec["jobTemplate"]["spec"]["template"]["spec"].setdefault("restartPolicy", "OnFailure")
        spec["suspend"] = True
    return obj


def api_group(obj: dict[str, Any]) -> str:
    return str(obj.get("apiVersion", "")).rpartition("/")[0]


def _gpu_limits(node: Any) -> None:
    """Extended resources need limits equal to their requests: set them in every container."""
    if isinstance(node, dict):
        for c in node.get("containers") or [] if isinstance(node.get("containers"), list) else []:
            if isinstance(c, dict):
                requests = (c.get("resources") or {}).get("requests") or {}
                gpus = {k: v for k, v in requests.items() if "/" in k}
                if gpus:
                    c["resources"]["limits"] = {**c["resources"].get("limits", {}), **gpus}
                c.setdefault("image", "example.invalid/x:1")
        for value in node.values():
            _gpu_limits(value)
    elif isinstance(node, list):
        for value in node:
            _gpu_limits(value)


async def create(k8s: K8s, obj: dict[str, Any], ns: str) -> dict[str, Any]:
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    if (group, obj["kind"]) in BUILT_IN:
        path = PATHS[obj["kind"]].format(ns=ns)
    else:
        plural = TABLE[(group, obj["kind"])].plural if (group, obj["kind"]) in TABLE else CHAIN_ONLY.get(
            (group, obj["kind"]), obj["kind"].lower() + "s")
        path = f"/apis/{group}/{version}/namespaces/{ns}/{plural}"
    status, out = k8s.cp.request("POST", path, accepted(obj))
    assert status == 201, (obj["kind"], obj["metadata"]["name"], out.get("message") if isinstance(out, dict) else out)
    assert isinstance(out, dict)
    return out


def rehome(obj: dict[str, Any], ns: str, uids: dict[str, str]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = ns
    for ref in obj["metadata"].get("ownerReferences", []):
        ref["uid"] = uids[ref["uid"]]
    return obj


@pytest.fixture(scope="module")
def installed(k8s: K8s, scheduler_kubeconfig: Any) -> Iterator[K8s]:
    k8s.cp.controller_manager.stop()  # see the module docstring
    try:
        yield _installed(k8s)
    finally:
        k8s.cp.restart_controller_manager()


def _installed(k8s: K8s) -> K8s:
    k8s.cp.install_crds([*operator_crds(), *(crd(r["group"], r["kind"], r["plural"], ["v1"]) for r in NOCODE_RULES)])
    # the chart grants get on the no-code rules' kinds (templates/rbac.yaml): the same here
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "kai-es-test-grouping-rules"},
            "rules": [{"apiGroups": [r["group"]], "resources": [r["plural"]], "verbs": ["get"]} for r in NOCODE_RULES]}
    k8s.cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role, ok=(201, 409))
    k8s.cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kai-es-test-grouping-rules"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": k8s.cp.scheduler.groups[0]}],
    }, ok=(201, 409))
    deadline = time.monotonic() + 15
    while k8s.cp.request("GET", "/apis/example.com/v1/namespaces/default/trainingruns/probe",
                         token=k8s.cp.scheduler_token)[0] != 404:
        assert time.monotonic() < deadline, "the grouping rules' RBAC never took effect"
        time.sleep(0.05)
    return k8s


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.kind)
async def test_a_real_apiservers_owners_are_grouped_as_the_loader_groups_them(installed: K8s, case: Case) -> None:
    k8s = installed
    sc = load(case)
    ns = k8s.namespace("g")
    uids: dict[str, str] = {}
    made_pods: set[str] = set()
    for obj in sc.owners:  # parents first: each reference names a real uid
        out = await create(k8s, rehome(obj, ns, uids), ns)
        uids[obj["metadata"]["uid"]] = out["metadata"]["uid"]
        if obj["kind"] == "Pod":
            made_pods.add(obj["metadata"]["name"])
    pods = [o for o in sc.objects if o.kind == "Pod"]
    for o in pods:
        if o.obj["metadata"]["name"] not in made_pods:
            out = await create(k8s, rehome(as_created(o.obj), ns, uids), ns)
            uids[o.obj["metadata"]["uid"]] = out["metadata"]["uid"]
    try:
        async with k8s.client(k8s.scheduler_kubeconfig) as kai_api:
            source = PodGroupingSource(KubernetesSource(kai_api, kinds=("Pod",)), kai_api, rules=sc.config.grouping)
            listed = [c for c in await source.list_objects() if c.obj["metadata"].get("namespace") == ns]
    finally:  # no pod of this test is left for later tests' informers to group
        k8s.cp.call("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    groups = {c.obj["metadata"]["name"]: c.obj for c in listed if c.kind == "PodGroup"}
    got = {c.obj["metadata"]["name"]: c.obj for c in listed if c.kind == "Pod"}
    assert not [p for p in got.values() if GROUPING_ERROR_ANNOTATION in p["metadata"].get("annotations", {})], got

    def real(name: str) -> str:
        for old, new in uids.items():
            name = name.replace(old, new)
        return name

    want = {real(o.obj["metadata"]["name"]): o.obj for o in sc.objects if o.kind == "PodGroup"}
    assert set(groups) == set(want)
    for name, group in groups.items():
        assert group["spec"] == want[name]["spec"], name
    for o in pods:
        name = o.obj["metadata"]["name"]
        assert got[name]["metadata"]["annotations"][PODGROUP_ANNOTATION] == real(
            o.obj["metadata"]["annotations"][PODGROUP_ANNOTATION]), name
        assert got[name]["metadata"].get("labels", {}).get(SUBGROUP_LABEL) == \
            o.obj["metadata"]["labels"].get(SUBGROUP_LABEL), name


async def test_an_owner_whose_crd_is_not_installed_is_grouped_by_its_reference(installed: K8s) -> None:
    k8s = installed
    ns = k8s.namespace("g")
    ref = {"apiVersion": "grove.io/v1alpha1", "kind": "PodCliqueSet", "name": "pcs", "uid": "0c1e6a6a-0000-4000-8000-000000000001"}
    pod = gpu_pod("pcs-0", ns, queue="team-a")
    pod["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    # a kind of the table at a version the apiserver does not serve (v1beta2 is installed)
    lost = gpu_pod("lost-0", ns, queue="team-a")
    lost["metadata"]["ownerReferences"] = [{"apiVersion": "sparkoperator.k8s.io/v1beta1", "kind": "SparkApplication",
                                            "name": "lost", "uid": "0c1e6a6a-0000-4000-8000-000000000002",
                                            "controller": True}]
    async with k8s.client() as api:
        await create_pod(api, pod)
        await create_pod(api, lost)
    try:
        async with k8s.client(k8s.scheduler_kubeconfig) as kai_api:
            source = PodGroupingSource(KubernetesSource(kai_api, kinds=("Pod",)), kai_api)
            listed = [c for c in await source.list_objects() if c.obj["metadata"].get("namespace") == ns]
    finally:
        k8s.cp.call("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    groups = sorted(c.obj["metadata"]["name"] for c in listed if c.kind == "PodGroup")
    assert groups == [f"pg-lost-{lost['metadata']['ownerReferences'][0]['uid']}", f"pg-pcs-{ref['uid']}"]
    assert not any(GROUPING_ERROR_ANNOTATION in c.obj["metadata"].get("annotations", {}) for c in listed)


async def test_the_informer_process_groups_by_the_rules_of_its_config_file(installed: K8s, tmp_path: Any) -> None:
    """`kai-es informer --scenario FILE` (how the chart runs it, with the scheduler's config
    file): a TrainingRun, a kind only the file's no-code rule knows, is one gang of its
    minAvailable pods."""
    import yaml  # noqa: PLC0415

    from kai_es.adapters.file_log import FileEventLog  # noqa: PLC0415
    from kai_es.events import payloads as p  # noqa: PLC0415
    from tests.k8s.helpers import wait_for  # noqa: PLC0415
    from tests.processes import Proc  # noqa: PLC0415

    k8s = installed
    ns = k8s.namespace("g")
    config = tmp_path / "scheduler.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario",
                                      "metadata": {"name": "cfg"}, "spec": {"scheduler": {"grouping": NOCODE_RULES}}}))
    run = k8s.cp.call("POST", f"/apis/example.com/v1/namespaces/{ns}/trainingruns", {
        "apiVersion": "example.com/v1", "kind": "TrainingRun",
        "metadata": {"name": "run", "labels": {"kai.scheduler/queue": "team-a"}},
        "spec": {"replicas": 4, "minAvailable": 3}})
    log = tmp_path / "events.jsonl"
    informer = Proc("informer", ["informer", "--log", str(log), "--kubeconfig", str(k8s.scheduler_kubeconfig),
                                 "--scenario", str(config)], tmp_path)
    async with k8s.client() as api:
        pod = gpu_pod("run-0", ns)
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "example.com/v1", "kind": "TrainingRun", "name": "run",
                                               "uid": run["metadata"]["uid"], "controller": True}]
        await create_pod(api, pod)
    informer.start()
    try:
        informer.wait_ready("informer")

        async def grouped() -> p.PodGroupObserved | None:
            if not log.exists():
                return None
            for record in FileEventLog(log, readonly=True).scan():
                data = record.envelope.data
                if isinstance(data, p.PodGroupObserved) and data.namespace == ns:
                    return data
            return None

        group = await wait_for(grouped, "the TrainingRun's PodGroup in the log", timeout_s=30)
    finally:
        informer.kill9()
        k8s.cp.call("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    assert (group.name, group.min_member, group.queue) == (f"pg-run-{run['metadata']['uid']}", 3, "team-a")
