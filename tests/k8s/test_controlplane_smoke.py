"""The test control plane itself: KWOK GPU nodes, KAI's CRDs, binding through pods/binding,
RBAC for a least-privilege scheduler identity (deploy/rbac/clusterrole.yaml), and the
controller-manager's controllers."""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from tests.k8s.conftest import K8s, cp_mod
from tests.k8s.helpers import binding, create_pod, get_pod, gpu_pod, queue, raw, wait_pod_phase


async def test_kwok_gpu_nodes_queue_and_bind_to_running(k8s: K8s) -> None:
    ns = k8s.namespace()
    n1 = k8s.gpu_node(gpus=8)
    n2 = k8s.gpu_node(gpus=4, gpu_product="NVIDIA-H100-80GB-HBM3")
    for node, gpus in ((n1, "8"), (n2, "4")):
        assert node["status"]["capacity"]["nvidia.com/gpu"] == gpus
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == gpus
        assert node["metadata"]["labels"]["nvidia.com/gpu.memory"] == "81920"
    assert n2["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"

    async with k8s.client() as api:
        custom = client.CustomObjectsApi(api)
        qname = f"q-{ns}"
        status, q = await raw(await custom.create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(qname, gpu_quota=4),
            _preload_content=False))
        assert status == 201, q
        assert q["spec"]["resources"]["gpu"]["quota"] == 4

        pod = await create_pod(api, gpu_pod("train-0", ns, gpus=2, queue=qname))
        assert pod["spec"]["schedulerName"] == "kai-scheduler"
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")

        core = client.CoreV1Api(api)
        node = n1["metadata"]["name"]
        status, out = await raw(await core.create_namespaced_pod_binding(
            "train-0", ns, binding("train-0", ns, pod["metadata"]["uid"], node),
            _preload_content=False))
        assert status == 201, out
        running = await wait_pod_phase(api, ns, "train-0", "Running")
        assert running["spec"]["nodeName"] == node

        # Binding again conflicts: the pod already has a node.
        status, out = await raw(await core.create_namespaced_pod_binding(
            "train-0", ns, binding("train-0", ns, pod["metadata"]["uid"], n2["metadata"]["name"]),
            _preload_content=False))
        assert status == 409, out


async def test_least_privilege_scheduler_can_bind_but_not_delete(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=8)["metadata"]["name"]
    async with k8s.client() as admin, k8s.client(scheduler_kubeconfig) as sched:
        pod = await create_pod(admin, gpu_pod("p", ns, gpus=1))
        other = await create_pod(admin, gpu_pod("other", ns, gpus=1))
        core = client.CoreV1Api(sched)

        status, out = await raw(await core.create_namespaced_pod_binding(
            "p", ns, binding("p", ns, pod["metadata"]["uid"], node), _preload_content=False))
        assert status == 201, out
        await wait_pod_phase(admin, ns, "p", "Running")

        denied: list[tuple[str, Any]] = [
            ("delete pod", core.delete_namespaced_pod("other", ns, _preload_content=False)),
            ("create pod", core.create_namespaced_pod(ns, gpu_pod("new", ns), _preload_content=False)),
            # pods are patched (a shared-GPU pod's GPU facts) but never deleted outside the
            # reservation namespace, and ConfigMaps are written, never deleted
            ("delete configmap", core.delete_namespaced_config_map("kube-root-ca.crt", ns, _preload_content=False)),
            ("create pod in another namespace than the reservations'", core.create_namespaced_pod(
                "default", gpu_pod("new", "default"), _preload_content=False)),
            ("list secrets", core.list_namespaced_secret(ns, _preload_content=False)),
        ]  # fmt: skip
        for what, call in denied:
            status, out = await raw(await call)
            assert status == 403, (what, status, out)
        # the pod the scheduler could not delete is still there, unbound
        status, still = await get_pod(admin, ns, "other")
        assert status == 200 and still["metadata"]["uid"] == other["metadata"]["uid"]
        assert not still["spec"].get("nodeName")


def test_install_crds_reads_a_crd_whose_conditions_are_null(k8s: K8s) -> None:
    """The apiserver's reply to a CRD's create (and a GET right after it) carries
    `"conditions": null` until the apiextensions controllers name and establish it; KAI's CRDs
    crashed install_crds on it (`.get("conditions", [])` is None when the key holds null)."""
    name = f"w{uuid.uuid4().hex[:8]}"
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"{name}s.kai-es.test"},
           "spec": {"group": "kai-es.test", "scope": "Namespaced",
                    "names": {"kind": name.capitalize(), "plural": f"{name}s"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object"}}}]}}
    reply = k8s.cp.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, ok=(201,))
    assert reply["status"]["conditions"] is None  # what the old code iterated
    assert cp_mod.conditions(reply) == {}
    k8s.cp.install_crds([crd])  # waits it out: Established, then servable
    got = k8s.cp.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}s.kai-es.test")
    assert cp_mod.conditions(got)["Established"] == "True"


def test_controller_manager_runs_its_controllers_and_survives_restarts(k8s: K8s) -> None:
    """The session's controller-manager: the serviceaccount controllers make a namespace's
    default ServiceAccount and sign a token Secret the apiserver accepts; a Deployment gets its
    ReplicaSet and pod; the garbage collector deletes them with the Deployment; after a crash of
    the controller-manager and one of the apiserver it carries on."""
    cp = k8s.cp
    ns = k8s.namespace()

    def wait(what: str, fn: Any) -> Any:
        # each step its own 2 minutes: on a loaded CI machine the garbage collector took over 30 s
        # to act after the apiserver's restart (its watches come back with backoff)
        deadline = time.monotonic() + 120
        while not (got := fn()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)
        return got

    wait("the default ServiceAccount", lambda: cp.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200)
    cp.call("POST", f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "legacy", "annotations": {"kubernetes.io/service-account.name": "default"}}}, ok=(201,))
    secret = wait("the token in the Secret", lambda: (s := cp.call("GET", f"/api/v1/namespaces/{ns}/secrets/legacy"))
                  .get("data", {}).get("token") and s)
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert base64.b64decode(secret["data"]["ca.crt"]) == cp.ca_cert.read_bytes()
    # signed with the key the apiserver verifies: authenticated (403, not 401) as the account
    status, out = cp.request("GET", f"/api/v1/namespaces/{ns}/pods", token=token)
    assert status == 403 and f"system:serviceaccount:{ns}:default" in json.dumps(out), (status, out)

    def deployment_runs(name: str) -> list[Any]:
        cp.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"schedulerName": "nobody-schedules-this",
                                           "containers": [{"name": "m", "image": "example.invalid/x:1"}]}}}},
            ok=(201,))
        return list(wait(f"{name}'s pod", lambda: cp.call(
            "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app={name}")["items"]))

    (pod,) = deployment_runs("before")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    took = cp.restart_controller_manager()
    assert took < 30
    cp.restart_apiserver()
    deployment_runs("after")
    # the garbage collector: the Deployment's ReplicaSet and pod go with it
    cp.call("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/before",
            {"propagationPolicy": "Background"})
    wait("the ReplicaSet and pod collected", lambda: not cp.call(
        "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app=before")["items"] and not cp.call(
        "GET", f"/apis/apps/v1/namespaces/{ns}/replicasets?labelSelector=app=before")["items"])
    # no controller taints KWOK's nodes (no node-lifecycle controller runs: controlplane.CONTROLLERS)
    assert not [n["metadata"]["name"] for n in cp.call("GET", "/api/v1/nodes")["items"] if n["spec"].get("taints")]
