"""Topology-aware placement on a real apiserver with KWOK nodes labelled by zone and rack: a
Topology and a PodGroup with a `topologyConstraint`, written as users write them, go in through
the informer (as the least-privilege identity of deploy/rbac/clusterrole.yaml), and under
kai-es/v5 every pod of the gang is bound inside one rack. The log then replays exactly."""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, create_queue, get_pod, gpu_pod, raw, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"
ZONE, RACK = "topology.kubernetes.io/zone", "example.com/rack"

USER_OBJECTS = """
apiVersion: kai.scheduler/v1alpha1
kind: Topology
metadata:
  name: {topology}
spec:
  levels:
  - nodeLabel: topology.kubernetes.io/zone
  - nodeLabel: example.com/rack
---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata:
  name: {group}
  namespace: {ns}
spec:
  queue: {queue}
  minMember: 3
  topologyConstraint:
    topology: {topology}
    requiredTopologyLevel: example.com/rack
"""


async def test_a_rack_bound_gang_is_bound_inside_one_rack(k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = {POOL_LABEL: f"pool-{tag}"}  # the test's own nodes: other tests' nodes and pods stay out
    # rack r1: two 2-GPU nodes (4 GPUs); rack r2: two 4-GPU nodes (8 GPUs). A gang of 3 x 2 GPUs
    # fits only in r2; packing alone would fill r1's 2-GPU nodes exactly first and span racks.
    racks: dict[str, str] = {}
    for rack, gpus in (("r1", 2), ("r2", 4)):
        for i in range(2):
            name = k8s.gpu_node(f"{rack}-{i}-{tag}", gpus=gpus, labels={
                **pool, ZONE: f"z-{tag}", RACK: f"{rack}-{tag}"})["metadata"]["name"]
            racks[name] = rack
    qname, group, topology = f"q-{tag}", f"train-{tag}", f"topo-{tag}"
    log = MemoryEventLog()
    topology_doc, podgroup_doc = yaml.safe_load_all(
        USER_OBJECTS.format(topology=topology, group=group, ns=ns, queue=qname))
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        custom = client.CustomObjectsApi(api)
        await create_queue(api, qname)
        status, out = await raw(await custom.create_cluster_custom_object(
            "kai.scheduler", "v1alpha1", "topologies", topology_doc, _preload_content=False))
        assert status == 201, out
        status, out = await raw(await custom.create_namespaced_custom_object(
            "scheduling.run.ai", "v2alpha2", ns, "podgroups", podgroup_doc, _preload_content=False))
        assert status == 201, out
        for i in range(3):
            await create_pod(api, gpu_pod(f"worker-{i}", ns, gpus=2, queue=qname, labels=pool,
                                          annotations={"pod-group-name": group}))

        async def all_running() -> dict[str, str] | None:
            nodes = {}
            for i in range(3):
                status, pod = await get_pod(api, ns, f"worker-{i}")
                if status != 200 or pod["status"].get("phase") != "Running":
                    return None
                nodes[f"worker-{i}"] = pod["spec"]["nodeName"]
            return nodes

        async with services_running(log, kai_api, SchedulerConfig(policy_version="kai-es/v5")):
            nodes = await wait_for(all_running, "the gang Running", timeout_s=60)
    assert {racks[n] for n in nodes.values()} == {"r2"}, nodes
    records = [r async for r in log.read()]
    observed = [r.envelope.data for r in records if isinstance(r.envelope.data, p.TopologyObserved)
                and r.envelope.data.name == topology]
    assert observed and observed[-1].levels == (ZONE, RACK)
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
