"""Workloads as users write them, on a control plane with a real kube-controller-manager: a
batch Job (a 4-pod gang through `kai.scheduler/batch-min-member`), a Deployment and a
StatefulSet, all for `kai-scheduler` with a `kai.scheduler/queue` label. The controllers make
the pods, kai-es's informer groups them (KAI's podgrouper defaults), the scheduler places them,
the binder binds them onto KWOK GPU nodes, and the run's log replays exactly.

The session's control plane runs the controller-manager (controlplane.CONTROLLERS); if it cannot
start, the session fixture fails every test here."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.events.envelope import Record
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_queue, raw, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"
QUEUE_LABEL = "kai.scheduler/queue"


def template(labels: Mapping[str, str], *, restart: str = "Always") -> dict[str, Any]:
    """A pod template asking kai-scheduler for one GPU."""
    one_gpu = {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}
    return {"metadata": {"labels": dict(labels)},
            "spec": {"schedulerName": "kai-scheduler", "restartPolicy": restart,
                     "containers": [{"name": "main", "image": "example.invalid/train:1",
                                     "resources": {"requests": one_gpu,
                                                   "limits": {"nvidia.com/gpu": "1"}}}]}}


def batch_job(name: str, queue: str, pool: str, *, parallelism: int) -> dict[str, Any]:
    labels = {QUEUE_LABEL: queue, POOL_LABEL: pool}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue},
                         "annotations": {"kai.scheduler/batch-min-member": str(parallelism)}},
            "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                     "template": template(labels, restart="Never")}}


def deployment(name: str, queue: str, pool: str, *, replicas: int) -> dict[str, Any]:
    labels = {"app": name, QUEUE_LABEL: queue, POOL_LABEL: pool}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": template(labels)}}


def stateful_set(name: str, queue: str, pool: str, *, replicas: int) -> dict[str, Any]:
    labels = {"app": name, QUEUE_LABEL: queue, POOL_LABEL: pool}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": template(labels)}}


async def created(resp: Any) -> dict[str, Any]:
    status, out = await raw(resp)
    assert status == 201, out
    assert isinstance(out, dict)
    return out


async def pods_of(api: client.ApiClient, ns: str, owner_kind: str, owner_name: str) -> list[dict[str, Any]]:
    """The namespace's pods whose controller is `owner_kind`/`owner_name`."""
    status, out = await raw(await client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False))
    assert status == 200, out
    return [pod for pod in out["items"]
            if any(r.get("controller") and r["kind"] == owner_kind and r["name"] == owner_name
                   for r in pod["metadata"].get("ownerReferences", []))]


def running_on(pods: Iterable[dict[str, Any]], nodes: set[str]) -> bool:
    return all(pod["status"].get("phase") == "Running" and pod["spec"].get("nodeName") in nodes
               for pod in pods)


def data_in(records: Iterable[Record], ns: str) -> list[Any]:
    return [r.envelope.data for r in records if getattr(r.envelope.data, "namespace", None) == ns]


def bind_cycles(records: Iterable[Record], ns: str, prefix: str) -> dict[str, int]:
    """The cycle whose decisions bound each pod named `prefix…` in `ns`."""
    cycle, out = -1, {}
    for r in records:
        d = r.envelope.data
        if isinstance(d, p.CycleStarted):
            cycle = d.cycle
        elif isinstance(d, p.BindingDecided) and d.namespace == ns and d.name.startswith(prefix):
            out[d.name] = cycle
    return out


async def test_controllers_make_the_pods_and_kai_es_groups_schedules_and_binds_them(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns, qname, pool = k8s.namespace(), f"q-{tag}", f"pool-{tag}"
    nodes = {k8s.gpu_node(f"c-{tag}-{i}", gpus=4, labels={POOL_LABEL: pool})["metadata"]["name"]
             for i in range(3)}  # 12 GPUs for 4 + 3 + 2 one-GPU pods
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        await create_queue(api, qname)
        apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
        job = await created(await batch.create_namespaced_job(
            ns, batch_job("train", qname, pool, parallelism=4), _preload_content=False))
        await created(await apps.create_namespaced_deployment(
            ns, deployment("serve", qname, pool, replicas=3), _preload_content=False))
        sts = await created(await apps.create_namespaced_stateful_set(
            ns, stateful_set("db", qname, pool, replicas=2), _preload_content=False))

        async def all_running() -> dict[str, list[dict[str, Any]]] | None:
            rs = [r["metadata"]["name"] for r in (await raw(await apps.list_namespaced_replica_set(
                ns, _preload_content=False)))[1]["items"]]
            got = {"job": await pods_of(api, ns, "Job", "train"),
                   "deployment": [pod for name in rs for pod in await pods_of(api, ns, "ReplicaSet", name)],
                   "statefulset": await pods_of(api, ns, "StatefulSet", "db")}
            sizes = {k: len(v) for k, v in got.items()} == {"job": 4, "deployment": 3, "statefulset": 2}
            return got if sizes and all(running_on(v, nodes) for v in got.values()) else None

        async with services_running(log, kai_api, grouping=True):
            # the StatefulSet makes db-1 only once db-0 is Running and Ready (OrderedReady)
            pods = await wait_for(all_running, "every controller-made pod Running on the pool", timeout_s=90)

    records = [r async for r in log.read()]
    data = data_in(records, ns)
    groups = {d.name: d for d in data if isinstance(d, p.PodGroupObserved)}
    observed = {d.name: d for d in data if isinstance(d, p.PodObserved)}
    job_pg = f"pg-train-{job['metadata']['uid']}"
    sts_pg = f"pg-db-{sts['metadata']['uid']}"
    assert groups[job_pg].min_member == 4 and groups[job_pg].queue == qname
    assert groups[sts_pg].queue == qname
    for pod in pods["job"]:
        assert observed[pod["metadata"]["name"]].podgroup == job_pg
    for pod in pods["statefulset"]:
        assert observed[pod["metadata"]["name"]].podgroup == sts_pg
    assert sorted(pod["metadata"]["name"] for pod in pods["statefulset"]) == ["db-0", "db-1"]
    serve_groups = {observed[pod["metadata"]["name"]].podgroup for pod in pods["deployment"]}
    assert len(serve_groups) == 3  # a Deployment's pods are a group each (KAI: inference replicas)
    for g in serve_groups:
        assert groups[g].queue == qname and groups[g].priority_class == "inference"
    bound = {(d.name, d.node) for d in data if isinstance(d, p.PodBound)}
    assert {name for name, _ in bound} == {pod["metadata"]["name"] for v in pods.values() for pod in v}
    assert {node for _, node in bound} <= nodes
    assert len(set(bind_cycles(records, ns, "train-").values())) == 1  # the gang in one cycle
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
    assert result.decisions >= 9


async def test_a_job_gang_binds_no_pod_while_only_part_fits_and_all_once_room_frees(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    """8 GPUs in the pool, a 6-replica Deployment on 6 of them; the Job's 4 pods (min member 4)
    are reported unschedulable and none is bound. Scaling the Deployment to 2 frees 4 GPUs (the
    replicaset-controller deletes 4 pods, KWOK finishes them): the 4 bind in one cycle."""
    tag = uuid.uuid4().hex[:8]
    ns, qname, pool = k8s.namespace(), f"q-{tag}", f"pool-{tag}"
    nodes = {k8s.gpu_node(f"g-{tag}-{i}", gpus=4, labels={POOL_LABEL: pool})["metadata"]["name"]
             for i in range(2)}
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        await create_queue(api, qname)
        apps, batch, core = client.AppsV1Api(api), client.BatchV1Api(api), client.CoreV1Api(api)
        await created(await apps.create_namespaced_deployment(
            ns, deployment("fill", qname, pool, replicas=6), _preload_content=False))

        async def pods(labels: str) -> list[dict[str, Any]]:
            status, out = await raw(await core.list_namespaced_pod(ns, label_selector=labels,
                                                                   _preload_content=False))
            assert status == 200, out
            return list(out["items"])

        async def filled() -> bool:
            got = await pods("app=fill")
            return len(got) == 6 and running_on(got, nodes)

        async def job_pods_reported() -> list[dict[str, Any]] | None:
            """The Job's 4 pods, once each was reported unschedulable as a gang that does not fit
            whole, after all 4 were observed."""
            got = await pods("job-name=train")
            if len(got) < 4:
                return None
            names = {pod["metadata"]["name"] for pod in got}
            seen: set[str] = set()
            seen_all, reported = False, set()
            async for r in log.read():
                d = r.envelope.data
                if isinstance(d, p.PodObserved) and d.namespace == ns and d.name in names:
                    seen.add(d.name)
                    seen_all = seen == names
                elif seen_all and isinstance(d, p.PodUnschedulable) and d.namespace == ns and d.name in names \
                        and "GangUnsatisfied" in {reason.code for reason in d.reasons}:  # "only 2 fit"
                    reported.add(d.name)
            return got if reported == names else None

        async with services_running(log, kai_api, grouping=True):
            await wait_for(filled, "the Deployment's 6 pods Running", timeout_s=60)
            job = await created(await batch.create_namespaced_job(
                ns, batch_job("train", qname, pool, parallelism=4), _preload_content=False))
            waiting = await wait_for(job_pods_reported, "the Job's 4 pods reported unschedulable", timeout_s=60)
            # two GPUs are free, and not one of the gang's pods took one
            assert not any(pod["spec"].get("nodeName") for pod in waiting)
            assert not [d for d in data_in([r async for r in log.read()], ns)
                        if isinstance(d, (p.BindingDecided, p.PodPipelined, p.PodBound))
                        and d.name.startswith("train-")]

            status, out = await raw(await apps.patch_namespaced_deployment_scale(
                "fill", ns, {"spec": {"replicas": 2}}, _preload_content=False))
            assert status == 200, out

            async def gang_running() -> list[dict[str, Any]] | None:
                got = await pods("job-name=train")
                return got if len(got) == 4 and running_on(got, nodes) else None

            gang = await wait_for(gang_running, "the Job's 4 pods Running", timeout_s=60)

    records = [r async for r in log.read()]
    data = data_in(records, ns)
    job_pg = f"pg-train-{job['metadata']['uid']}"
    groups = [d for d in data if isinstance(d, p.PodGroupObserved) and d.name == job_pg]
    assert groups and groups[-1].min_member == 4
    gang_names = {pod["metadata"]["name"] for pod in gang}
    cycles = bind_cycles(records, ns, "train-")
    assert set(cycles) == gang_names and len(set(cycles.values())) == 1, cycles
    assert {d.name for d in data if isinstance(d, p.PodBound) and d.name.startswith("train-")} == gang_names
    # only the replicaset-controller removed the filler's pods: kai-es evicted nothing
    assert not [d for d in data if isinstance(d, (p.EvictionDecided, p.PodEvicted))]
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
