"""Scheduling gates on a real apiserver (policy kai-es/v14 on; the default is v15): the API server refuses
the Binding of a pod with `spec.schedulingGates`, so kai-es must not decide one — the informer
reads the gates, the pipeline binds the ungated pod beside it and leaves the gated one alone (no
binding decided, no verdict), and binds it once the gates are removed; the log replays exactly.
"""

from __future__ import annotations

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import (binding, create_pod, create_queue, get_pod, gpu_pod, pool_node, raw, running_on,
                               services_running, wait_for)

MERGE = "application/merge-patch+json"
GATE = "example.com/admission"


async def test_a_gated_pod_waits_for_its_gates_and_is_bound_once_they_are_removed(k8s: K8s) -> None:
    ns = k8s.namespace()
    pool = pool_node(k8s)
    node, qname, labels = pool.node, pool.queue, pool.labels
    log = MemoryEventLog()
    async with k8s.client() as api:
        core = client.CoreV1Api(api)
        await create_queue(api, qname)
        held = gpu_pod("held", ns, gpus=2, queue=qname, labels=labels)
        held["spec"]["schedulingGates"] = [{"name": GATE}]
        created = await create_pod(api, held)
        # why kai-es must wait: the API server refuses to bind a gated pod
        status, refusal = await raw(await core.create_namespaced_pod_binding(
            "held", ns, binding("held", ns, created["metadata"]["uid"], node), _preload_content=False))
        assert 400 <= status < 500, (status, refusal)
        await create_pod(api, gpu_pod("free", ns, gpus=1, queue=qname, labels=labels))
        async with services_running(log, api, grouping=True):
            await wait_for(running_on(api, ns, ["free"], node), "the ungated pod Running", timeout_s=30)
            await anyio.sleep(1.0)  # more cycles: the gated pod stays unbound
            status, pod = await get_pod(api, ns, "held")
            assert status == 200 and not pod["spec"].get("nodeName")
            status, out = await raw(await core.patch_namespaced_pod(
                "held", ns, {"spec": {"schedulingGates": None}}, _preload_content=False, _content_type=MERGE))
            assert status == 200, (status, out)
            await wait_for(running_on(api, ns, ["held"], node), "the pod Running once its gate is removed",
                           timeout_s=30)

    records = [r async for r in log.read()]
    observed = [d.scheduling_gates for d in (r.envelope.data for r in records)
                if isinstance(d, p.PodObserved) and d.namespace == ns and d.name == "held"]
    assert observed[0] == (GATE,) and observed[-1] == (), observed
    ungated_at = next(r.position for r in records if isinstance(r.envelope.data, p.PodObserved)
                      and r.envelope.data.name == "held" and r.envelope.data.namespace == ns
                      and not r.envelope.data.scheduling_gates)
    decided = [(r.position, type(r.envelope.data).__name__) for r in records
               if isinstance(r.envelope.data, (p.BindingDecided, p.PodUnschedulable, p.PodPipelined))
               and r.envelope.data.namespace == ns and r.envelope.data.name == "held"]
    assert decided and all(pos > ungated_at for pos, _ in decided), (ungated_at, decided)
    assert [kind for _, kind in decided] == ["BindingDecided"], decided
    failed = [r for r in records if isinstance(r.envelope.data, p.PodBindFailed) and r.envelope.data.namespace == ns]
    assert not failed, failed
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
