"""Consolidation against the real apiserver with KWOK nodes: the moves kai-es decides are
evictions through the Eviction API, and the job they make room for binds where the room was
made. (No controller-manager runs here, so nothing recreates the moved pod: in a cluster its
Job or Deployment would, and the room it was moved to is free for it.)"""

from __future__ import annotations

import uuid
from pathlib import Path

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, create_queue, get_pod, gpu_pod, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


async def test_a_move_is_an_eviction_and_the_job_binds_where_room_was_made(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = {POOL_LABEL: f"pool-{tag}"}
    node_a = k8s.gpu_node(f"a-{tag}", gpus=8, labels=pool)["metadata"]["name"]
    node_b = k8s.gpu_node(f"b-{tag}", gpus=8, labels=pool)["metadata"]["name"]
    qname = f"q-{tag}"
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        await create_queue(api, qname)
        # node a runs 3 one-GPU pods (5 GPUs free), node b 5 (3 free): a 6-GPU pod fits neither
        # until one pod of node a moves to node b
        running = {**{f"a{i}": node_a for i in range(3)}, **{f"b{i}": node_b for i in range(5)}}
        for name, node in running.items():
            pod = gpu_pod(name, ns, gpus=1, queue=qname, labels=pool)
            pod["spec"]["nodeName"] = node
            await create_pod(api, pod)

        async def all_running() -> bool:
            for name in running:
                status, pod = await get_pod(api, ns, name)
                if status != 200 or pod["status"].get("phase") != "Running":
                    return False
            return True

        await wait_for(all_running, "the pods on their nodes Running", timeout_s=30)

        async def big_running() -> bool:
            status, pod = await get_pod(api, ns, "big")
            return status == 200 and pod["status"].get("phase") == "Running"

        async with services_running(log, kai_api):
            await create_pod(api, gpu_pod("big", ns, gpus=6, queue=qname, labels=pool))
            await wait_for(big_running, "the 6-GPU pod Running", timeout_s=60)
        status, big = await get_pod(api, ns, "big")
        assert big["spec"]["nodeName"] == node_a
        gone = []
        for name in running:
            status, pod = await get_pod(api, ns, name)
            if status == 404 or pod["metadata"].get("deletionTimestamp"):
                gone.append(name)
    records = [r async for r in log.read()]
    decided = [r.envelope.data for r in records if isinstance(r.envelope.data, p.EvictionDecided)]
    assert len(decided) == 1 and decided[0].action == "consolidation" and decided[0].name in ("a0", "a1", "a2")
    # kai-es/v6: one decision with both nodes as fields
    assert (decided[0].node, decided[0].to_node) == (node_a, node_b)
    assert decided[0].reason == f"moved to make room for {ns}/big"
    assert gone == [decided[0].name]
    assert [r.envelope.data.name for r in records if isinstance(r.envelope.data, p.PodEvicted)] == gone
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
