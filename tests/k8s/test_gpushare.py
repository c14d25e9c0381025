"""Shared GPUs on the real apiserver: the binder reserves the GPU (a reservation pod in KAI's
namespace), publishes the device id where the pod's runai/shared-gpu-configmap annotation
points, writes the GPU group and devices on the pod before binding, the informer reads them
back, and the reservation pod goes when the last sharing pod leaves. kai-es runs as the
least-privilege identity of deploy/rbac/."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.actuator import KubernetesActuator
from kai_es.adapters.kubernetes.gpushare import RESERVATION_NAMESPACE, GpuSharing
from kai_es.adapters.kubernetes.reservations import ReservationKeeper
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from kai_es.state import fold
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, create_queue, get_pod, gpu_pod, services_running, raw, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


async def reservation_pods(api: client.ApiClient, group: str) -> list[dict[str, Any]]:
    status, out = await raw(await client.CoreV1Api(api).list_namespaced_pod(
        RESERVATION_NAMESPACE, label_selector=f"runai-gpu-group={group}", _preload_content=False))
    assert status == 200, out
    return list(out["items"])


async def test_fractional_pods_share_a_reserved_gpu_whose_id_is_published(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    node = k8s.gpu_node(f"n-{tag}", gpus=4, labels={POOL_LABEL: pool})["metadata"]["name"]
    qname = f"q-{tag}"
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        await create_queue(api, qname)
        for name in ("half-a", "half-b"):
            await create_pod(api, gpu_pod(name, ns, gpus=0, queue=qname, labels={POOL_LABEL: pool}, annotations={
                "gpu-fraction": "0.5", "runai/shared-gpu-configmap": f"{name}-cfg"}))

        sharing = GpuSharing(kai_api)

        async def both_running() -> bool:
            for name in ("half-a", "half-b"):
                status, pod = await get_pod(api, ns, name)
                if status != 200 or pod["status"].get("phase") != "Running":
                    return False
            return True

        async def facts_read_back() -> bool:
            seen = {d.name: d for d in [r.envelope.data async for r in log.read()]
                    if isinstance(d, p.PodObserved) and d.namespace == ns and d.node_name}
            return all(n in seen and seen[n].gpu_group and seen[n].gpu_devices for n in ("half-a", "half-b"))

        async with services_running(log, kai_api, grouping=True, gpu_sharing=sharing,
                                    followers=[ReservationKeeper(sharing)]):
            await wait_for(both_running, "both halves Running", timeout_s=30)
            await wait_for(facts_read_back, "the GPU facts observed back", timeout_s=30)

            records = [r async for r in log.read()]
            decided = {d.name: d for d in (r.envelope.data for r in records)
                       if isinstance(d, p.BindingDecided) and d.namespace == ns}
            assert set(decided) == {"half-a", "half-b"}
            group = decided["half-a"].gpu_groups[0]
            device = decided["half-a"].gpu_devices[0]
            assert decided["half-b"].gpu_groups == (group,) and decided["half-b"].gpu_devices == (device,)
            for name in ("half-a", "half-b"):
                _, pod = await get_pod(api, ns, name)
                assert pod["metadata"]["labels"]["runai-gpu-group"] == group
                assert pod["metadata"]["annotations"]["kai-es.io/gpu-devices"] == str(device)
                status, cm = await raw(await client.CoreV1Api(api).read_namespaced_config_map(
                    f"{name}-cfg-0-evar", ns, _preload_content=False))
                assert status == 200 and cm["data"] == {"NVIDIA_VISIBLE_DEVICES": str(device)}, cm
                assert cm["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
                status, cm = await raw(await client.CoreV1Api(api).read_namespaced_config_map(
                    f"{name}-cfg-0", ns, _preload_content=False))
                assert status == 200 and cm["data"]["GPU_PORTION"] == "0.5", cm
            held = await reservation_pods(api, group)
            assert len(held) == 1  # one reservation for the shared GPU, on the node, a whole GPU
            assert held[0]["spec"]["nodeName"] == node
            assert held[0]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
            # the reservation pod is not in the log: the sharing pods account for that GPU
            assert not any(isinstance(r.envelope.data, p.PodObserved) and r.envelope.data.namespace
                           == RESERVATION_NAMESPACE for r in records)
            state = fold(records)
            used = state.nodes[node].device_used
            assert used[device] == 1000 and sum(used) == 1000, used

            core = client.CoreV1Api(api)
            status, _ = await raw(await core.delete_namespaced_pod("half-a", ns, grace_period_seconds=0,
                                                                   _preload_content=False))
            assert status == 200
            await anyio.sleep(1.0)
            assert len(await reservation_pods(api, group)) == 1  # half-b still shares the GPU
            status, _ = await raw(await core.delete_namespaced_pod("half-b", ns, grace_period_seconds=0,
                                                                   _preload_content=False))
            assert status == 200

            async def released() -> bool:
                return not await reservation_pods(api, group)

            await wait_for(released, "the reservation pod deleted with the last sharing pod", timeout_s=30)

    result = replay([r async for r in log.read()], load_packer("native"))
    assert result.ok, result.divergence


async def test_a_missing_reservation_namespace_fails_the_bind_with_the_reason(k8s: K8s) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=2)["metadata"]["name"]
    async with k8s.client() as api:
        pod = await create_pod(api, gpu_pod("half", ns, gpus=0, annotations={"gpu-fraction": "0.5"}))
        act = KubernetesActuator(api, gpu_sharing=GpuSharing(api, namespace=f"nowhere-{uuid.uuid4().hex[:6]}"))
        out = await act.bind(ns, "half", pod["metadata"]["uid"], node, [0], [str(uuid.uuid4())])
        assert not out.ok and "does namespace" in out.message, out
        status, got = await get_pod(api, ns, "half")
        assert status == 200 and not got["spec"].get("nodeName")  # not bound without its GPU


async def test_a_share_of_two_gpus_holds_both_until_the_pod_goes(k8s: K8s) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=4)["metadata"]["name"]
    g1, g2 = str(uuid.uuid4()), str(uuid.uuid4())
    async with k8s.client() as api:
        pod = await create_pod(api, gpu_pod("wide", ns, gpus=0, annotations={
            "gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}))
        sharing = GpuSharing(api)
        out = await KubernetesActuator(api, gpu_sharing=sharing).bind(
            ns, "wide", pod["metadata"]["uid"], node, [1, 2], [g1, g2])
        assert out.ok, out
        _, got = await get_pod(api, ns, "wide")
        labels = got["metadata"]["labels"]
        assert labels["runai-gpu-group"] == g1 and labels[f"runai-gpu-group/{g1}"] == g1
        assert labels[f"runai-gpu-group/{g2}"] == g2
        assert got["metadata"]["annotations"]["kai-es.io/gpu-devices"] == "1,2"
        assert await sharing.release_unused([g1, g2]) == []  # the pod still shares both
        assert len(await reservation_pods(api, g1)) == 1 and len(await reservation_pods(api, g2)) == 1
        status, _ = await raw(await client.CoreV1Api(api).delete_namespaced_pod(
            "wide", ns, grace_period_seconds=0, _preload_content=False))
        assert status == 200

        async def both_released() -> bool:
            await sharing.release_unused([g1, g2])
            return not await reservation_pods(api, g1) and not await reservation_pods(api, g2)

        await wait_for(both_released, "both reservations released", timeout_s=30)
