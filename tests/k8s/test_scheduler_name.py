"""kai-es beside a KAI that keeps `kai-scheduler`, on a real apiserver: configured with
`schedulerName: kai-es`, the pipeline binds the pods that name kai-es (grouped by its podgrouper)
and leaves the pods of kai-scheduler alone — no binding, no verdict, no status written — and
the log replays exactly."""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio

from kai_es.adapters.kubernetes.status import StatusWriter
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.config import parse_config
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, create_queue, get_pod, gpu_pod, running_on, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


async def test_only_the_pods_of_the_configured_name_are_scheduled(k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    node = k8s.gpu_node(f"n-{tag}", gpus=8, labels={POOL_LABEL: pool})["metadata"]["name"]
    qname, name = f"q-{tag}", f"kai-es-{tag}"
    log = MemoryEventLog()
    labels = {POOL_LABEL: pool}
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        await create_queue(api, qname)
        for i in range(2):
            await create_pod(api, gpu_pod(f"ours-{i}", ns, gpus=2, queue=qname, labels=labels, scheduler=name))
        await create_pod(api, gpu_pod("kais", ns, gpus=2, queue=qname, labels=labels))  # kai-scheduler's
        writer = StatusWriter(kai_api, queue_interval_s=0.2)
        config = parse_config({"schedulerName": name})
        async with services_running(log, kai_api, config, grouping=True, followers=[writer]):
            await wait_for(running_on(api, ns, ["ours-0", "ours-1"], node), "kai-es's pods Running", timeout_s=30)
            await anyio.sleep(1.0)  # a few more cycles: kai-scheduler's pod must stay untouched
        status, kais = await get_pod(api, ns, "kais")
        assert status == 200 and not kais["spec"].get("nodeName")
        assert not [c for c in kais["status"].get("conditions", []) if c.get("type") == "PodScheduled"]

    records = [r async for r in log.read()]
    touched = {d.name for d in (r.envelope.data for r in records)
               if isinstance(d, (p.BindingDecided, p.PodUnschedulable, p.PodPipelined, p.EvictionDecided))
               and d.namespace == ns}
    assert touched == {"ours-0", "ours-1"}, touched
    # the podgrouper made PodGroups for kai-es's pods only; kai-scheduler's is an implicit group
    implicit = {d.name: d.implicit_podgroup for d in (r.envelope.data for r in records)
                if isinstance(d, p.PodObserved) and d.namespace == ns}
    assert implicit == {"ours-0": False, "ours-1": False, "kais": True}, implicit
    made = {d.name for d in (r.envelope.data for r in records) if isinstance(d, p.PodGroupObserved) and d.namespace == ns}
    assert len(made) == 2 and all(n.startswith("pg-ours-") for n in made), made
    applied = [r.envelope.data for r in records if isinstance(r.envelope.data, p.ConfigApplied)]
    assert applied and applied[-1].config["schedulerName"] == name  # in the log: replay knows it
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
