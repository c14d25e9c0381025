"""The Workload API (KEP-4671) on a real control plane: kube-apiserver and kube-controller-manager
v1.36 with its feature gates on (controlplane.WORKLOAD_API: GenericWorkload, WorkloadWithJob and
scheduling.k8s.io/v1alpha2). The Job controller itself makes the Workload and the PodGroup of an
Indexed Job and sets the pods' `spec.schedulingGroup`; kai-es's informer (as the least-privilege
identity of deploy/rbac) reads the PodGroups and schedules the pods as one gang of the
PodGroup's `minCount`, binding none while only part fits. A pod applied before its PodGroup
waits, rejected with the reason, and is scheduled once the PodGroup exists. Replay is exact.

The module starts its own control plane (the session's keeps the gates off, as clusters do); if
it cannot start, every test here fails."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s, cp_mod, grant_scheduler_roles, k8s_of, started_control_plane
from tests.k8s.helpers import create_queue, raw, services_running, wait_for
from tests.k8s.test_controllers import POOL_LABEL, QUEUE_LABEL, bind_cycles, created, data_in, deployment, running_on, template


pytestmark = pytest.mark.k8s

GROUP, VERSION = "scheduling.k8s.io", "v1alpha2"


@pytest.fixture(scope="module")
def wl() -> Iterator[K8s]:
    with started_control_plane(what="a control plane serving the Workload API", **cp_mod.WORKLOAD_API) as cp:
        yield k8s_of(cp)


@pytest.fixture(scope="module")
def wl_scheduler(wl: K8s) -> Path:
    grant_scheduler_roles(wl.cp)
    return Path(wl.scheduler_kubeconfig)


def indexed_job(name: str, queue: str, pool: str, n: int) -> dict[str, Any]:
    """An Indexed Job as its users write it: completions = parallelism (the Job controller's
    condition for a gang), no kai-es annotation."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"parallelism": n, "completions": n, "completionMode": "Indexed", "backoffLimit": 0,
                     "template": template({QUEUE_LABEL: queue, POOL_LABEL: pool}, restart="Never")}}


async def objects(api: client.ApiClient, ns: str, plural: str) -> list[dict[str, Any]]:
    status, out = await raw(await client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, ns, plural, _preload_content=False))
    assert status == 200, out
    return list(out["items"])


async def test_the_job_controllers_gang_binds_whole_or_not_at_all(wl: K8s, wl_scheduler: Path) -> None:
    """8 GPUs, 6 held by a Deployment: the Indexed Job's 4 pods (a PodGroup of minCount 4 made by
    the Job controller) bind none of the 2 free GPUs; scaled down to 2, the gang binds in one
    cycle. Without the Workload API rule the Job would be a group of minimum 1 (KAI's default
    grouper) and 2 of its pods would bind."""
    tag = uuid.uuid4().hex[:8]
    ns, qname, pool = wl.namespace(), f"q-{tag}", f"pool-{tag}"
    nodes = {wl.gpu_node(f"w-{tag}-{i}", gpus=4, labels={POOL_LABEL: pool})["metadata"]["name"] for i in range(2)}
    log = MemoryEventLog()
    async with wl.client() as api, wl.client(wl_scheduler) as kai_api:
        await create_queue(api, qname)
        apps, batch, core = client.AppsV1Api(api), client.BatchV1Api(api), client.CoreV1Api(api)
        await created(await apps.create_namespaced_deployment(
            ns, deployment("fill", qname, pool, replicas=6), _preload_content=False))

        async def pods(labels: str) -> list[dict[str, Any]]:
            status, out = await raw(await core.list_namespaced_pod(ns, label_selector=labels, _preload_content=False))
            assert status == 200, out
            return list(out["items"])

        async def filled() -> bool:
            got = await pods("app=fill")
            return len(got) == 6 and running_on(got, nodes)

        async def gang_reported() -> list[dict[str, Any]] | None:
            got = await pods("job-name=train")
            names = {pod["metadata"]["name"] for pod in got}
            if len(names) < 4:
                return None
            reported = {d.name for d in data_in([r async for r in log.read()], ns)
                        if isinstance(d, p.PodUnschedulable) and d.name in names}
            return got if reported == names else None

        async with services_running(log, kai_api, grouping=True):
            await wait_for(filled, "the Deployment's 6 pods Running", timeout_s=60)
            job = await created(await batch.create_namespaced_job(ns, indexed_job("train", qname, pool, 4),
                                                                  _preload_content=False))
            waiting = await wait_for(gang_reported, "the Job's 4 pods reported unschedulable", timeout_s=60)
            assert not any(pod["spec"].get("nodeName") for pod in waiting)
            assert not [d for d in data_in([r async for r in log.read()], ns)
                        if isinstance(d, (p.BindingDecided, p.PodPipelined, p.PodBound)) and d.name.startswith("train-")]

            status, out = await raw(await apps.patch_namespaced_deployment_scale(
                "fill", ns, {"spec": {"replicas": 2}}, _preload_content=False))
            assert status == 200, out

            async def gang_running() -> list[dict[str, Any]] | None:
                got = await pods("job-name=train")
                return got if len(got) == 4 and running_on(got, nodes) else None

            gang = await wait_for(gang_running, "the Job's 4 pods Running", timeout_s=60)
        workloads, k8s_groups = await objects(api, ns, "workloads"), await objects(api, ns, "podgroups")

    # the Job controller made them: one Workload of one template, one PodGroup, both the Job's
    assert len(workloads) == 1 and len(k8s_groups) == 1, (workloads, k8s_groups)
    k8s_group = k8s_groups[0]
    assert k8s_group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert any(r["kind"] == "Job" and r["uid"] == job["metadata"]["uid"] and r.get("controller")
               for r in k8s_group["metadata"]["ownerReferences"])
    assert {pod["spec"]["schedulingGroup"]["podGroupName"] for pod in gang} == {k8s_group["metadata"]["name"]}

    records = [r async for r in log.read()]
    data = data_in(records, ns)
    name = f"pg-{k8s_group['metadata']['name']}-{k8s_group['metadata']['uid']}"
    groups = [d for d in data if isinstance(d, p.PodGroupObserved) and d.name == name]
    assert groups and groups[-1].min_member == 4 and groups[-1].queue == qname
    assert {d.podgroup for d in data if isinstance(d, p.PodObserved) and d.name.startswith("train-")} == {name}
    cycles = bind_cycles(records, ns, "train-")
    assert set(cycles) == {pod["metadata"]["name"] for pod in gang} and len(set(cycles.values())) == 1, cycles
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence

    # a simulation of the same Job on a cluster with the gate makes the same gang
    simulated = [o.payload for o in load_scenario_text(yaml.safe_dump_all([
        {"apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario", "metadata": {"name": "same"},
         "spec": {"cluster": {"featureGates": {"WorkloadWithJob": True}}}},
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": qname},
         "spec": {"resources": {"gpu": {"quota": 8, "limit": -1, "overQuotaWeight": 1}}}},
        {**indexed_job("train", qname, pool, 4), "metadata": {**indexed_job("train", qname, pool, 4)["metadata"],
                                                             "namespace": ns}}]), "same.yaml").objects
                 if isinstance(o.payload, p.PodGroupObserved)]

    def shape(g: p.PodGroupObserved) -> tuple[Any, ...]:
        return (g.namespace, g.min_member, g.min_subgroup, g.queue, g.priority_class, g.preemptibility, g.subgroups)

    assert [shape(g) for g in simulated] == [shape(groups[-1])]


async def test_a_pod_applied_before_its_podgroup_waits_for_it(wl: K8s, wl_scheduler: Path) -> None:
    """Two pods naming PodGroup `pair` (minCount 2) are created before it: each is rejected with
    the reason, none is bound; once the PodGroup is created both bind, in one cycle."""
    tag = uuid.uuid4().hex[:8]
    ns, qname, pool = wl.namespace(), f"q-{tag}", f"pool-{tag}"
    nodes = {wl.gpu_node(f"p-{tag}", gpus=4, labels={POOL_LABEL: pool})["metadata"]["name"]}
    log = MemoryEventLog()
    async with wl.client() as api, wl.client(wl_scheduler) as kai_api:
        await create_queue(api, qname)
        core = client.CoreV1Api(api)
        async with services_running(log, kai_api, grouping=True):
            for i in range(2):
                spec = template({QUEUE_LABEL: qname, POOL_LABEL: pool}, restart="Never")
                spec["spec"]["schedulingGroup"] = {"podGroupName": "pair"}
                await created(await core.create_namespaced_pod(
                    ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"m-{i}", **spec["metadata"]},
                         "spec": spec["spec"]}, _preload_content=False))

            async def rejected() -> set[str] | None:
                names = {d.name for d in data_in([r async for r in log.read()], ns)
                         if isinstance(d, p.ObjectRejected) and "does not exist (yet)" in d.reason}
                return names if names == {"m-0", "m-1"} else None

            await wait_for(rejected, "both pods rejected, waiting for their PodGroup", timeout_s=30)
            assert not [d for d in data_in([r async for r in log.read()], ns) if isinstance(d, p.BindingDecided)]
            group = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "pair"},
                     "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}
            status, out = await raw(await client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, VERSION, ns, "podgroups", group, _preload_content=False))
            assert status == 201, out

            async def both_running() -> bool:
                status, out = await raw(await core.list_namespaced_pod(ns, _preload_content=False))
                return status == 200 and len(out["items"]) == 2 and running_on(out["items"], nodes)

            await wait_for(both_running, "both pods Running", timeout_s=60)
    records = [r async for r in log.read()]
    cycles = bind_cycles(records, ns, "m-")
    assert set(cycles) == {"m-0", "m-1"} and len(set(cycles.values())) == 1, cycles
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence

