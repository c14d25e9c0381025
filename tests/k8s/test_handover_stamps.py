"""The times KAI keeps on a PodGroup, round trip through a real apiserver (policy kai-es/v7):
the status writer writes `kai.scheduler/stale-podgroup-timestamp` while a gang is stale, the
informer reads it back without moving the gang's clock, a bind writes
`kai.scheduler/last-start-timestamp` and clears the stale time once the gang is whole; and a
gang that arrives carrying KAI's stale time is stale since then. kai-es runs as the
least-privilege identity of deploy/rbac/clusterrole.yaml (which must allow the PodGroup patch)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.status import StatusWriter
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.events.timefmt import parse_rfc3339, rfc3339
from kai_es.replay import replay
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, create_queue, gpu_pod, raw, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


def _seconds(ns: int) -> str:
    return rfc3339(ns - ns % 1_000_000_000)


STALE = "kai.scheduler/stale-podgroup-timestamp"
STARTED = "kai.scheduler/last-start-timestamp"


async def annotations(api: client.ApiClient, ns: str, name: str) -> dict[str, str]:
    status, pg = await raw(await client.CustomObjectsApi(api).get_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", ns, "podgroups", name, _preload_content=False))
    assert status == 200, pg
    return dict(pg["metadata"].get("annotations") or {})


async def create_podgroup(api: client.ApiClient, ns: str, name: str, queue: str, min_member: int,
                          annotations: dict[str, str] | None = None) -> None:
    body = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": {"queue": queue, "minMember": min_member}}
    status, out = await raw(await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", ns, "podgroups", body, _preload_content=False))
    assert status == 201, out


def running_pod(name: str, ns: str, queue: str, group: str, node: str, pool: str) -> dict[str, Any]:
    """A pod another scheduler bound before kai-es took over (nodeName set at creation)."""
    pod = gpu_pod(name, ns, queue=queue, labels={POOL_LABEL: pool}, annotations={"pod-group-name": group})
    pod["spec"]["nodeName"] = node
    return pod


async def test_stale_time_is_written_read_back_unchanged_and_cleared(k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    node = k8s.gpu_node(f"n-{tag}", gpus=8, labels={POOL_LABEL: pool})["metadata"]["name"]
    qname, gang, handed = f"q-{tag}", f"gang-{tag}", f"handed-{tag}"
    kai_stale = "2026-01-01T00:00:00Z"  # what KAI wrote on a gang it found stale
    log = MemoryEventLog()
    config = SchedulerConfig(default_staleness_grace_period="-1s")  # stale gangs are never evicted here
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        await create_queue(api, qname)
        await create_podgroup(api, ns, gang, qname, 3)
        await create_podgroup(api, ns, handed, qname, 2, {STALE: kai_stale})
        for i in range(2):
            await create_pod(api, running_pod(f"{gang}-{i}", ns, qname, gang, node, pool))
        await create_pod(api, running_pod(f"{handed}-0", ns, qname, handed, node, pool))
        writer = StatusWriter(kai_api, queue_interval_s=0.2)
        async with services_running(log, kai_api, config, followers=[writer]):
            async def stale_written() -> bool:
                return STALE in await annotations(api, ns, gang)

            await wait_for(stale_written, "the stale time on the gang's PodGroup", timeout_s=30)
            written = (await annotations(api, ns, gang))[STALE]

            async def echoed() -> bool:
                return any([isinstance(r.envelope.data, p.PodGroupObserved) and r.envelope.data.name == gang
                            and r.envelope.data.stale_timestamp_ns is not None async for r in log.read()])

            await wait_for(echoed, "the informer reading the written time back", timeout_s=30)
            # the gang whole: kai-es binds its third pod, writes the start and clears the stale time
            await create_pod(api, gpu_pod(f"{gang}-2", ns, queue=qname, labels={POOL_LABEL: pool},
                                          annotations={"pod-group-name": gang}))

            async def whole() -> bool:
                found = await annotations(api, ns, gang)
                return STARTED in found and STALE not in found

            await wait_for(whole, "the gang's start written and its stale time removed", timeout_s=30)
            assert (await annotations(api, ns, handed)).get(STALE) == kai_stale  # still stale: kept
        # the control plane is shared: a gang stale since KAI's time would be evicted by the next
        # test's scheduler (rightly), so the pods go with this test
        await client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)

    records = [r async for r in log.read()]
    state = ClusterState()
    stale_since: list[int] = []
    for r in records:
        apply(state, r)
        job = state.jobs.get(f"{ns}/{gang}")
        if job is not None and job.stale_since_ns and (not stale_since or stale_since[-1] != job.stale_since_ns):
            stale_since.append(job.stale_since_ns)
    # one clock for the gang from the moment it was stale: reading the written second back moved nothing
    assert len(stale_since) == 1, stale_since
    assert written == _seconds(stale_since[0]), (written, stale_since)
    assert state.jobs[f"{ns}/{gang}"].stale_since_ns == 0
    # the gang that came with KAI's time is stale since KAI's time, not since kai-es saw it
    assert state.jobs[f"{ns}/{handed}"].stale_since_ns == parse_rfc3339(kai_stale)
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
