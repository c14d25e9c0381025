"""Pod grouping in the informer against the real apiserver: pods without a PodGroup get KAI's
podgrouper defaults from their owners (bare pod, batch/v1 Job, Deployment through its
ReplicaSet, a kubeflow.org PyTorchJob whose CRD the test installs), read as kai-es's
least-privilege identity. The Deployment's pod is made by the controller-manager's deployment and
replicaset controllers; the other owners and pods are created by the test with ownerReferences,
and the Job names another controller than the built-in one (`spec.managedBy`), which would
otherwise replace the test's pods with its own."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.clock import SystemClock
from kai_es.adapters.ids import RandomIds
from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.adapters.kubernetes.source import KubernetesSource
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.services.informer import InformerService
from kai_es.state import fold
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, gpu_pod, raw, wait_for

PYTORCHJOB_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"group": "kubeflow.org", "scope": "Namespaced",
             "names": {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob",
                       "listKind": "PyTorchJobList"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}  # fmt: skip

TEMPLATE = {"metadata": {}, "spec": {"restartPolicy": "Never",
                                     "containers": [{"name": "m", "image": "example.invalid/x:1"}]}}


def owned(pod: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["ownerReferences"] = [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": True}]
    return pod


async def created(resp: Any) -> dict[str, Any]:
    status, out = await raw(resp)
    assert status == 201, out
    assert isinstance(out, dict)
    return out


async def test_pods_get_kai_podgrouper_groups_from_their_owners(k8s: K8s, scheduler_kubeconfig: Path) -> None:
    k8s.cp.install_crds([PYTORCHJOB_CRD])
    ns = k8s.namespace()
    q = f"q-{uuid.uuid4().hex[:6]}"
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
        custom = client.CustomObjectsApi(api)
        job = await created(await batch.create_namespaced_job(ns, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "etl", "labels": {"kai.scheduler/queue": q}},
            "spec": {"template": TEMPLATE, "suspend": True, "managedBy": "kai-es.test/nobody"}},
            _preload_content=False))
        job.update(apiVersion="batch/v1", kind="Job")
        serving = gpu_pod("template", ns, queue=q, labels={"app": "serve"})
        await created(await apps.create_namespaced_deployment(ns, {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "serve"}},
                     "template": {"metadata": {"labels": serving["metadata"]["labels"]},
                                  "spec": serving["spec"]}}}, _preload_content=False))
        ptj = await created(await custom.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": TEMPLATE},
                                             "Worker": {"replicas": 3, "template": TEMPLATE}}}},
            _preload_content=False))
        bad = await created(await custom.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "broken"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": "many"}}}}, _preload_content=False))

        bare = await create_pod(api, gpu_pod("bare", ns, queue=q))
        await create_pod(api, owned(gpu_pod("etl-0", ns), job))
        await create_pod(api, owned(gpu_pod("etl-1", ns), job))

        async def replica() -> dict[str, Any] | None:
            status, out = await raw(await client.CoreV1Api(api).list_namespaced_pod(
                ns, label_selector="app=serve", _preload_content=False))
            assert status == 200, out
            return out["items"][0] if out["items"] else None

        serve = await wait_for(replica, "the Deployment's pod, made by its ReplicaSet", timeout_s=30)
        serve_name = serve["metadata"]["name"]
        assert serve["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        for i in range(4):  # labelled as the training operator labels its pods
            role = {"training.kubeflow.org/replica-type": "master" if i == 0 else "worker",
                    "training.kubeflow.org/replica-index": str(max(0, i - 1))}
            await create_pod(api, owned(gpu_pod(f"train-{i}", ns, queue=q, labels=role), ptj))
        await create_pod(api, owned(gpu_pod("broken-0", ns, queue=q), bad))
        await create_pod(api, gpu_pod("named", ns, queue=q, annotations={"pod-group-name": "mine"}))

        log = MemoryEventLog()
        source = PodGroupingSource(KubernetesSource(kai_api, kinds=("PodGroup", "Pod")), kai_api)
        informer = InformerService(log, source, SystemClock(), RandomIds())

        async def in_log() -> list[Any] | None:
            records = [r async for r in log.read()]
            names = {r.envelope.data.name for r in records if isinstance(r.envelope.data, p.PodObserved)
                     and r.envelope.data.namespace == ns}
            return records if {"bare", "etl-0", "etl-1", serve_name, "train-3", "named"} <= names else None

        async with anyio.create_task_group() as tg:
            tg.start_soon(informer.run)
            records = await wait_for(in_log, "the pods observed", timeout_s=30)
            # a pod created after the start is grouped by the watch path too
            await create_pod(api, owned(gpu_pod("etl-2", ns), job))

            async def late() -> bool:
                return any([isinstance(r.envelope.data, p.PodObserved) and r.envelope.data.name == "etl-2"
                            async for r in log.read()])

            await wait_for(late, "etl-2 observed", timeout_s=30)
            records = [r async for r in log.read()]
            tg.cancel_scope.cancel()

    # one read per owner (5), plus at most a refresh or two: cached (other tests' pods are
    # grouped too: their owners count in their namespaces)
    assert source.owner_fetches[ns] <= 7
    data = [r.envelope.data for r in records]
    pods = {d.name: d for d in data if isinstance(d, p.PodObserved) and d.namespace == ns}
    groups = {d.name: d for d in data if isinstance(d, p.PodGroupObserved) and d.namespace == ns}
    job_pg = f"pg-etl-{job['metadata']['uid']}"
    ptj_pg = f"pg-train-{ptj['metadata']['uid']}"
    bare_pg = f"pg-bare-{bare['metadata']['uid']}"
    serve_pg = f"pg-{serve_name}-{serve['metadata']['uid']}"  # a Deployment's pods: one group each
    assert {n: pods[n].podgroup for n in ("bare", "etl-0", "etl-1", "etl-2", serve_name, "train-0", "named")} == {
        "bare": bare_pg, "etl-0": job_pg, "etl-1": job_pg, "etl-2": job_pg, serve_name: serve_pg,
        "train-0": ptj_pg, "named": "mine"}
    assert not any(pods[n].implicit_podgroup for n in ("bare", "etl-0", "train-0"))
    assert set(groups) == {bare_pg, job_pg, ptj_pg, serve_pg}  # "mine" is the user's: not made up
    assert groups[ptj_pg].min_member == 4  # all replicas: Master 1 + Worker 3
    assert [(sg.name, sg.min_member) for sg in groups[ptj_pg].subgroups] == [("master", 1), ("worker", 3)]
    assert [pods[f"train-{i}"].subgroup for i in range(4)] == ["master", "worker", "worker", "worker"]
    assert (groups[job_pg].min_member, groups[job_pg].queue, groups[job_pg].priority_class) == (1, q, "train")
    assert (groups[serve_pg].queue, groups[serve_pg].priority_class) == (q, "inference")
    assert groups[bare_pg].queue == q
    # each group is in the log before its first pod
    first = {}
    for i, d in enumerate(data):
        key = d.name if isinstance(d, p.PodGroupObserved) else getattr(d, "podgroup", None)
        if key is not None and key not in first:
            first[key] = type(d).__name__
    assert all(first[g] == "PodGroupObserved" for g in groups)
    rejected = [d for d in data if isinstance(d, p.ObjectRejected) and d.name == "broken-0"]
    assert rejected and "replicas" in rejected[0].reason, rejected
    state = fold(records)
    assert state.jobs[f"{ns}/{ptj_pg}"].spec is not None
    assert state.jobs[f"{ns}/{ptj_pg}"].spec.min_member == 4
    assert len(state.jobs[f"{ns}/{ptj_pg}"].members) == 4


async def test_last_pod_deleted_deletes_its_made_group_and_reservation_pods_are_not_listed(k8s: K8s) -> None:
    ns = k8s.namespace()
    k8s.cp.create_namespace("kai-resource-reservation")
    async with k8s.client() as api:
        pod = await create_pod(api, gpu_pod("solo", ns))
        held = await create_pod(api, gpu_pod(f"gpu-reservation-{uuid.uuid4().hex[:8]}", "kai-resource-reservation"))
        source = PodGroupingSource(KubernetesSource(api, kinds=("PodGroup", "Pod")), api)
        listed = await source.list_objects()
        names = [(c.kind, c.obj["metadata"]["name"]) for c in listed]  # type: ignore[index]
        pg_name = f"pg-solo-{pod['metadata']['uid']}"
        assert ("PodGroup", pg_name) in names and ("Pod", "solo") in names
        assert ("Pod", held["metadata"]["name"]) not in names  # the apiserver filters them out
        seen: list[Any] = []

        async def consume() -> None:
            async for batch in source.changes():
                seen.extend(batch)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            status, _ = await raw(await client.CoreV1Api(api).delete_namespaced_pod(
                "solo", ns, grace_period_seconds=0, _preload_content=False))
            assert status == 200

            async def group_deleted() -> bool:
                return any(getattr(c, "kind", "") == "PodGroup" and getattr(c, "action", "") == "DELETED"
                           and c.obj["metadata"]["name"] == pg_name for c in seen)

            await wait_for(group_deleted, "the made-up PodGroup deleted with its last pod", timeout_s=30)
            tg.cancel_scope.cancel()
