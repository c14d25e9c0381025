"""Semi-preemptible jobs on a real apiserver (kai-es/v8): a PodGroup with
`spec.preemptibility: semi-preemptible` (accepted by kai-es's CRD) and pods labelled
`kai.scheduler/preemptibility: semi-preemptible`, created as a KAI user creates them, are read by
the informer as such: in a queue with a quota of 2 GPUs, serve (minMember 2, 4 pods) places its
core within the quota and its extras over it, and batch (minMember 3) waits with
NonPreemptibleOverQuota; the log replays exactly."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, gpu_pod, queue, raw, running_on, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


async def _create(api: client.ApiClient, group: str, version: str, plural: str, body: dict[str, Any],
                  namespace: str | None = None) -> None:
    custom = client.CustomObjectsApi(api)
    if namespace is None:
        resp = await custom.create_cluster_custom_object(group, version, plural, body, _preload_content=False)
    else:
        resp = await custom.create_namespaced_custom_object(group, version, namespace, plural, body,
                                                            _preload_content=False)
    status, out = await raw(resp)
    assert status == 201, (status, out)


def _podgroup(name: str, ns: str, queue_name: str, min_member: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"queue": queue_name, "minMember": min_member, "priorityClassName": "inference", **spec}}


async def test_a_semi_preemptible_core_is_placed_within_quota_and_its_extras_over_it(k8s: K8s) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    node = k8s.gpu_node(f"n-{tag}", gpus=8, labels={POOL_LABEL: pool})["metadata"]["name"]
    qname = f"q-{tag}"
    labels = {POOL_LABEL: pool}
    log = MemoryEventLog()
    async with k8s.client() as api:
        await _create(api, "scheduling.run.ai", "v2", "queues", queue(qname, gpu_quota=2))
        await _create(api, "scheduling.run.ai", "v2alpha2", "podgroups",
                      _podgroup("serve", ns, qname, 2, preemptibility="semi-preemptible"), ns)
        await _create(api, "scheduling.run.ai", "v2alpha2", "podgroups", _podgroup("batch", ns, qname, 3), ns)
        for i in range(4):
            await create_pod(api, gpu_pod(f"serve-{i}", ns, queue=qname, labels=labels,
                                          annotations={"pod-group-name": "serve"}))
        async with services_running(log, api):
            await wait_for(running_on(api, ns, [f"serve-{i}" for i in range(4)], node), "serve Running",
                           timeout_s=30)
            for i in range(3):
                await create_pod(api, gpu_pod(f"batch-{i}", ns, queue=qname, annotations={"pod-group-name": "batch"},
                                              labels={**labels, "kai.scheduler/preemptibility": "semi-preemptible"}))

            async def refused() -> bool:
                async for r in log.read():
                    d = r.envelope.data
                    if isinstance(d, p.PodUnschedulable) and d.name == "batch-0" and d.namespace == ns \
                            and any(x.code == "NonPreemptibleOverQuota" for x in d.reasons):
                        return True
                return False

            await wait_for(refused, "batch told NonPreemptibleOverQuota", timeout_s=30)
            await anyio.sleep(0.5)
        core = client.CoreV1Api(api)
        for i in range(3):
            status, pod = await raw(await core.read_namespaced_pod(f"batch-{i}", ns, _preload_content=False))
            assert status == 200 and not pod["spec"].get("nodeName"), pod["spec"].get("nodeName")
        # the control plane is shared: the next tests' schedulers must not find these pods waiting
        await core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    records = [r async for r in log.read()]
    modes = {d.name: d.preemptibility for d in (r.envelope.data for r in records)
             if isinstance(d, (p.PodGroupObserved, p.PodObserved)) and d.namespace == ns}
    assert modes["serve"] == "semi-preemptible" and modes["batch-0"] == "semi-preemptible", modes
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
