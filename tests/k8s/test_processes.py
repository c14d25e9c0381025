"""The three processes as a user runs them (`kai-es informer`, `kai-es scheduler`,
`kai-es binder --kubeconfig`) over one log (a file, and a topic on the real Kafka broker),
against the real apiserver with KWOK nodes.

Each process is killed with SIGKILL mid-run and started again while pods keep arriving: every
pod still ends up Running on a node with room for it, no pod is bound twice, the binder resumes
from its saved progress instead of re-reading the log, and `kai-es replay` of the log is exact.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from kai_es.adapters.file_checkpoints import DEFAULT_KEEP, list_checkpoints
from kai_es.events import payloads as p
from kai_es.adapters.kafka_log import KafkaEventLog
from kai_es.replay_parallel import kafka_checkpoints, replay_file, replay_kafka
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, gpu_pod, log_records, queue, raw, wait_for
from tests.processes import ROOT, Proc

POOL_LABEL = "kai.scheduler/node-pool"
NODES, GPUS_PER_NODE = 4, 8


async def _pods(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    status, body = await raw(await client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False))
    assert status == 200
    return list(body["items"])


def _proc(name: str, args: list[str], tmp_path: Path) -> Proc:
    return Proc(name, args, tmp_path)



@pytest.mark.parametrize("backend", ["file", "kafka"])
async def test_three_processes_survive_kill_9_each(k8s: K8s, scheduler_kubeconfig: Path, backend: str,
                                                   tmp_path: Path, procs: list[Proc],
                                                   request: pytest.FixtureRequest) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = {POOL_LABEL: f"pool-{tag}"}
    nodes = {k8s.gpu_node(f"p-{tag}-{i}", gpus=GPUS_PER_NODE, labels=pool)["metadata"]["name"]
             for i in range(NODES)}
    if backend == "kafka":
        log = f"kafka://{request.getfixturevalue('kafka_bootstrap')}/kai-es-{tag}"
    else:
        log = str(tmp_path / "events.jsonl")
    kube = ["--kubeconfig", str(scheduler_kubeconfig)]
    informer = _proc("informer", ["informer", "--log", log, *kube], tmp_path)
    scheduler = _proc("scheduler", ["scheduler", "--log", log, "--period", "100ms",
                                    "--snapshot-every", "1"], tmp_path)
    binder = _proc("binder", ["binder", "--log", log, *kube], tmp_path)
    procs += [informer, scheduler, binder]

    async with k8s.client() as api:
        qname = f"q-{tag}"
        status, _ = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(qname), _preload_content=False))
        assert status == 201
        created: list[str] = []

        async def submit(prefix: str, count: int, gpus: int = 1) -> None:
            for i in range(count):
                name = f"{prefix}-{i}"
                await create_pod(api, gpu_pod(name, ns, gpus=gpus, queue=qname, labels=pool))
                created.append(name)

        async def all_running() -> bool:
            pods = {pod["metadata"]["name"]: pod for pod in await _pods(api, ns)}
            return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in created)

        informer.start()
        informer.wait_ready("informer")
        scheduler.start()
        scheduler.wait_ready("scheduler")
        binder.start()
        binder.wait_ready("binder")
        await submit("a", 6)
        await submit("big", 2, gpus=4)
        await wait_for(all_running, "the first pods Running", timeout_s=60)

        # the informer dies; pods created meanwhile are found by its relist
        informer.kill9()
        await submit("b", 4)
        informer.start()
        informer.wait_ready("informer")
        await wait_for(all_running, "pods created while the informer was down Running", timeout_s=60)

        # the binder dies right after new decisions may have been made
        await submit("c", 6)
        await anyio.sleep(0.3)
        binder.kill9()
        await anyio.sleep(0.5)
        binder.start()
        binder.wait_ready("binder")
        await wait_for(all_running, "pods decided around the binder's death Running", timeout_s=60)

        # the scheduler dies while pods arrive
        await submit("d", 4)
        scheduler.kill9()
        await submit("e", 4)
        scheduler.start()
        scheduler.wait_ready("scheduler")
        await wait_for(all_running, "pods created while the scheduler was down Running", timeout_s=60)

        final = {pod["metadata"]["name"]: pod for pod in await _pods(api, ns)}

        # the restarted binder resumed from its progress, yet keeps the Queue status current: its
        # status writer starts from the scheduler's snapshot and the records up to the resume point
        async def queue_status_current() -> bool:
            got = await client.CustomObjectsApi(api).get_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", qname)
            return ((got.get("status") or {}).get("allocated") or {}).get("gpu") == f"{used_gpus}000m"

        used_gpus = 6 + 8 + 4 + 6 + 4 + 4
        await wait_for(queue_status_current, "the queue's status counting every bound GPU", timeout_s=30)
    for proc in procs:
        proc.kill9()

    # the cluster: every pod on a pool node, no node over its GPUs
    used: collections.Counter[str] = collections.Counter()
    for name in created:
        pod = final[name]
        assert pod["spec"]["nodeName"] in nodes, (name, pod["spec"].get("nodeName"))
        used[pod["spec"]["nodeName"]] += int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
    assert all(n <= GPUS_PER_NODE for n in used.values()), used
    assert sum(used.values()) == used_gpus

    # the log: one outcome per decision, no pod bound twice, the binder resumed from its progress
    records = await log_records(log)
    outcomes: collections.Counter[str] = collections.Counter()
    bound_by_uid: dict[str, set[str]] = collections.defaultdict(set)
    for r in records:
        data = r.envelope.data
        if isinstance(data, (p.PodBound, p.PodBindFailed)):
            outcomes[data.decision_id] += 1
        if isinstance(data, p.PodBound):
            bound_by_uid[data.uid].add(data.decision_id)
    ours = {pod["metadata"]["uid"] for pod in final.values()}
    assert all(len(bound_by_uid[uid]) == 1 for uid in ours), "a pod was bound by two decisions"
    assert set(outcomes.values()) == {1}, "a decision has more than one outcome"
    assert informer.starts == binder.starts == scheduler.starts == 2  # each killed once mid-run
    assert "saved progress, from position" in binder.stderr().rsplit("--- start #2 ", 1)[-1], binder.stderr()
    if backend == "file":
        assert (tmp_path / "events.jsonl.binder-progress").exists()

    # and the log replays byte for byte
    run = subprocess.run([sys.executable, "-m", "kai_es", "replay", log], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    # the scheduler process (killed once, so its second life thinned what its first kept) kept
    # checkpoints, beside the file or in the topic's checkpoints topic, and replays start from them
    if backend == "file":
        assert len(list_checkpoints(log)) == DEFAULT_KEEP
        one = replay_file(log, jobs=1)
        many = replay_file(log, jobs=3, min_records=1)
    else:  # (each runs its own event loop: in a thread, outside this test's)
        events = KafkaEventLog.from_url(log, create=False)
        assert len(await anyio.to_thread.run_sync(kafka_checkpoints, events)) == DEFAULT_KEEP
        one = await anyio.to_thread.run_sync(lambda: replay_kafka(events, jobs=1))
        many = await anyio.to_thread.run_sync(lambda: replay_kafka(events, jobs=3, min_records=1))
    assert many.ok and many.resumed >= 1 and (many.cycles, many.decisions, many.state_digest) == (
        one.cycles, one.decisions, one.state_digest)
