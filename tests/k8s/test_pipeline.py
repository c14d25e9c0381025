"""The whole pipe on a real apiserver: the Kubernetes source feeds the informer, the scheduler
runs its cycles over the log, the binder binds through the Kubernetes actuator, and KWOK runs
the pods. The log then replays exactly."""

from __future__ import annotations

import uuid
from pathlib import Path

from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import services_running, create_pod, create_podgroup, get_pod, gpu_pod, queue, raw, running_on, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


async def test_a_gang_is_bound_through_the_api_and_the_log_replays(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    """kai-es runs as the least-privilege identity of deploy/rbac/clusterrole.yaml."""
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"  # the test's own node pool: other tests' nodes and pods stay out
    node = k8s.gpu_node(f"n-{tag}", gpus=8, labels={POOL_LABEL: pool})["metadata"]["name"]
    qname, pg = f"q-{tag}", f"train-{tag}"
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        custom = client.CustomObjectsApi(api)
        status, _ = await raw(await custom.create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(qname), _preload_content=False))
        assert status == 201
        await create_podgroup(api, ns, pg, qname, 2)
        pool_label = {POOL_LABEL: pool}
        for i in range(2):
            await create_pod(api, gpu_pod(f"worker-{i}", ns, gpus=4, queue=qname, labels=pool_label,
                                          annotations={"pod-group-name": pg}))
        await create_pod(api, gpu_pod("too-big", ns, gpus=16, queue=qname, labels=pool_label))

        async def unschedulable_reported() -> bool:
            return any([isinstance(r.envelope.data, p.PodUnschedulable)
                        and r.envelope.data.name == "too-big" and r.envelope.data.namespace == ns
                        async for r in log.read()])

        async def running_logged() -> bool:
            return {r.envelope.data.name async for r in log.read() if isinstance(r.envelope.data, p.PodObserved)
                    and r.envelope.data.namespace == ns and r.envelope.data.phase == "Running"} == {"worker-0", "worker-1"}

        async with services_running(log, kai_api):
            await wait_for(running_on(api, ns, ["worker-0", "worker-1"], node), "the gang Running on the pool's node",
                           timeout_s=30)
            await wait_for(unschedulable_reported, "too-big reported unschedulable", timeout_s=30)
            # the API answers Running before the informer's watch has logged it: wait for the log
            await wait_for(running_logged, "both workers observed Running through the watch", timeout_s=30)

        status, big = await get_pod(api, ns, "too-big")
        assert status == 200 and not big["spec"].get("nodeName")

    records = [r async for r in log.read()]
    bound = sorted((d.name, d.node) for d in (r.envelope.data for r in records)
                   if isinstance(d, p.PodBound) and d.namespace == ns)
    assert bound == [("worker-0", node), ("worker-1", node)]
    observed_running = {d.name for d in (r.envelope.data for r in records)
                        if isinstance(d, p.PodObserved) and d.namespace == ns and d.phase == "Running"}
    assert observed_running == {"worker-0", "worker-1"}  # KWOK's status came back through the watch
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
    assert result.cycles >= 1 and result.decisions >= 3


async def test_configmap_volumes_are_checked_against_what_the_informer_observed(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    """A pod whose ConfigMap exists is bound; one whose ConfigMap does not exist waits with
    ConfigMapNotFound — the informer (as kai-es's least-privilege identity) watches ConfigMaps."""
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    node = k8s.gpu_node(f"n-{tag}", gpus=8, labels={POOL_LABEL: pool})["metadata"]["name"]
    qname = f"q-{tag}"
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        status, _ = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(qname), _preload_content=False))
        assert status == 201
        status, _ = await raw(await client.CoreV1Api(api).create_namespaced_config_map(
            ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}},
            _preload_content=False))
        assert status == 201
        for name, config_map in (("has-config", "settings"), ("lacks-config", "nowhere")):
            pod = gpu_pod(name, ns, gpus=1, queue=qname, labels={POOL_LABEL: pool})
            pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": config_map}}]
            await create_pod(api, pod)

        async def bound() -> bool:
            status, pod = await get_pod(api, ns, "has-config")
            return status == 200 and pod["spec"].get("nodeName") == node

        async def reported() -> bool:
            return any([isinstance(r.envelope.data, p.PodUnschedulable) and r.envelope.data.name == "lacks-config"
                        and r.envelope.data.namespace == ns
                        and r.envelope.data.reasons[0].code == "ConfigMapNotFound"
                        async for r in log.read()])

        async with services_running(log, kai_api):
            await wait_for(bound, "the pod with its ConfigMap bound", timeout_s=30)
            await wait_for(reported, "the pod without its ConfigMap reported", timeout_s=30)
        status, pod = await get_pod(api, ns, "lacks-config")
        assert status == 200 and not pod["spec"].get("nodeName")
