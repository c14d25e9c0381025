"""Scheduling shards on the real apiserver (KWOK nodes) and the real Kafka broker: one informer
(`--shard a=... --shard b=...`), and per shard a scheduler and a binder process of its own
(`--shard a`, `--shard b`), as if on separate machines, each shard on its own topic.

Written as a KAI user sets shards up: nodes, queues and pods labelled `kai.scheduler/node-pool`.
Each shard's pods land only on its nodes; a pod asking for a pool no shard serves is rejected
naming the pool; killing one shard's scheduler does not stop the other; a node relabelled from
one pool to the other is used by its new shard; each shard's log replays byte for byte."""

from __future__ import annotations

import collections
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from kai_es.events import payloads as p
from kai_es.ingest.shards import shard_log_url
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, gpu_pod, log_records, queue, raw, wait_for
from tests.processes import ROOT, Proc

POOL = "kai.scheduler/node-pool"
GPUS = 4


async def _pods(api: client.ApiClient, ns: str) -> dict[str, dict[str, Any]]:
    status, body = await raw(await client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False))
    assert status == 200
    return {pod["metadata"]["name"]: pod for pod in body["items"]}


@pytest.mark.parametrize("backend", ["kafka", "file"])
async def test_two_shards_schedule_their_own_pools_and_survive_each_other(
        k8s: K8s, scheduler_kubeconfig: Path, backend: str, tmp_path: Path, procs: list[Proc],
        request: pytest.FixtureRequest) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pools = {"a": f"pool-a-{tag}", "b": f"pool-b-{tag}"}
    nodes = {shard: [k8s.gpu_node(f"{shard}-{tag}-{i}", gpus=GPUS, labels={POOL: pools[shard]})["metadata"]["name"]
                     for i in range(count)]
             for shard, count in (("a", 2), ("b", 4))}
    if backend == "kafka":
        base = f"kafka://{request.getfixturevalue('kafka_bootstrap')}/kai-es-{tag}"
    else:
        base = str(tmp_path / "events.jsonl")
    kube = ["--kubeconfig", str(scheduler_kubeconfig)]
    informer = Proc("informer", ["informer", "--log", base, *kube,
                                 *[f"--shard={s}={v}" for s, v in pools.items()]], tmp_path)
    schedulers = {s: Proc(f"scheduler-{s}", ["scheduler", "--log", base, "--shard", s, "--period", "100ms",
                                             "--snapshot-every", "1"], tmp_path) for s in pools}
    binders = {s: Proc(f"binder-{s}", ["binder", "--log", base, "--shard", s, *kube], tmp_path) for s in pools}
    procs += [informer, *schedulers.values(), *binders.values()]

    async with k8s.client() as api:
        custom = client.CustomObjectsApi(api)
        for shard, pool in pools.items():
            body = queue(f"q-{shard}-{tag}")
            body["metadata"]["labels"] = {POOL: pool}  # KAI filters queues by the label too
            status, _ = await raw(await custom.create_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", body, _preload_content=False))
            assert status == 201
        created: dict[str, str] = {}  # pod -> shard

        async def submit(shard: str, name: str, gpus: int) -> None:
            await create_pod(api, gpu_pod(name, ns, gpus=gpus, queue=f"q-{shard}-{tag}",
                                          labels={POOL: pools[shard]}))
            created[name] = shard

        def running(*names: str) -> Any:
            async def check() -> bool:
                pods = await _pods(api, ns)
                return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)
            return check

        informer.start()
        informer.wait_ready("informer")
        for proc in (*schedulers.values(), *binders.values()):
            proc.start()
        for s in pools:
            schedulers[s].wait_ready("scheduler")
            binders[s].wait_ready("binder")

        # each shard fills its own pool
        for i in range(4):
            await submit("a", f"a{i}", 2)
        for i in range(4):
            await submit("b", f"b{i}", 2)
        await create_pod(api, gpu_pod("lost", ns, gpus=1, queue=f"q-a-{tag}", labels={POOL: f"nowhere-{tag}"}))
        await wait_for(running(*created), "both shards' first pods Running", timeout_s=60)

        # shard a's scheduler dies for good: shard b goes on, shard a's new pod waits
        schedulers["a"].kill9()
        await submit("a", "a-late", 1)
        await submit("b", "b-late", 2)
        await wait_for(running("b-late"), "shard b's pod Running while shard a has no scheduler", timeout_s=60)
        assert (await _pods(api, ns))["a-late"]["status"].get("phase") == "Pending"

        # the idle node of pool b is relabelled into pool a; shard a's scheduler comes back and
        # uses it for a pod that fits nowhere else in pool a
        pods = await _pods(api, ns)
        busy = {pod["spec"].get("nodeName") for pod in pods.values()}
        idle = [n for n in nodes["b"] if n not in busy]
        assert len(idle) == 1, (idle, busy)
        status, _ = await raw(await client.CoreV1Api(api).patch_node(
            idle[0], {"metadata": {"labels": {POOL: pools["a"]}}}, _preload_content=False))
        assert status == 200
        await submit("a", "a-big", 3)  # with a-late, exactly the new node
        schedulers["a"].start()
        schedulers["a"].wait_ready("scheduler")
        await wait_for(running("a-late", "a-big"), "shard a's pods Running on its grown pool", timeout_s=60)
        final = await _pods(api, ns)

        async def outcomes_logged() -> bool:  # a binder appends its outcome after the bind shows
            for shard in pools:
                records = await log_records(shard_log_url(base, shard))
                bound = {r.envelope.data.name for r in records if isinstance(r.envelope.data, p.PodBound)}
                if not {n for n, s in created.items() if s == shard} <= bound:
                    return False
            return True

        await wait_for(outcomes_logged, "each binder's outcomes in its shard's log", timeout_s=60, interval_s=0.5)
    for proc in procs:
        proc.kill9()

    # every pod on a node of its own shard (the relabelled node counts as a's), none overfull
    owned = {n: s for s, names in nodes.items() for n in names} | {idle[0]: "a"}
    used: collections.Counter[str] = collections.Counter()
    for name, shard in created.items():
        node = final[name]["spec"]["nodeName"]
        assert owned[node] == shard, (name, node)
        used[node] += int(final[name]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
    assert max(used.values()) <= GPUS
    assert final["a-big"]["spec"]["nodeName"] == final["a-late"]["spec"]["nodeName"] == idle[0]
    assert final["lost"]["status"].get("phase") == "Pending" and not final["lost"]["spec"].get("nodeName")

    # each shard's log holds its own story only, and replays byte for byte
    for shard in pools:
        url = shard_log_url(base, shard)
        records = await log_records(url)
        bound = {r.envelope.data.name for r in records if isinstance(r.envelope.data, p.PodBound)}
        assert bound == {n for n, s in created.items() if s == shard}, (shard, bound)
        rejected = [r.envelope.data for r in records if isinstance(r.envelope.data, p.ObjectRejected)
                    and (r.envelope.data.namespace, r.envelope.data.name) == (ns, "lost")]
        if shard == "a":  # the first declared shard: no shard owns the unlabelled objects
            assert rejected and f"nowhere-{tag}" in rejected[0].reason, rejected
        else:
            assert not rejected
        run = subprocess.run([sys.executable, "-m", "kai_es", "replay", url], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
    assert schedulers["a"].starts == 2 and schedulers["b"].starts == 1
