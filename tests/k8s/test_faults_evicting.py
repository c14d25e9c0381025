"""The three processes on the real broker and the real apiserver (KWOK nodes) while two queues
reclaim from each other all the time (and preempt within themselves), under the faults of Reliability II §3:

- SIGKILL of the informer, the scheduler and the binder in turn (`KILLS` times each, 20 unless
  KAI_ES_KILLS says otherwise) while evictions are in flight;
- a broker restart, an apiserver restart and an etcd restart while evictions are in flight, and
  the leading scheduler stopped (SIGSTOP) past its Lease, so that its standby leads, and woken
  again (SIGCONT): it must not write on (Kafka fences its transactional producer; its Lease
  renewal fails and it stops, to stand by when restarted).

Each round the queue that lent its share takes it back: the other queue's pods fill the cluster
over its quota, this queue's pods arrive and reclaim evicts; then an urgent pod of the other
queue arrives and preempt evicts one of its own. In a round whose fault strikes consolidation
(a third of them, each fault in turn), a third queue on a node pool of its own has a pod of a
ReplicaSet and a non-preemptible pod on two 2-GPU nodes with one GPU free on each when a 2-GPU
pod arrives: consolidation moves the ReplicaSet's pod (evicts it; the replicaset-controller
makes its replacement, placed on the other node) and the 2-GPU pod takes the node it freed. A
fraction of a second after the step's evictions begin, the fault strikes. After every step each
queue holds exactly its quota (nothing evicted that was not needed); at the end every pod was
bound at most once, every eviction performed at most once, every decision has exactly one
outcome, each queue's allocation in the folded log is what the apiserver shows, and `kai-es
replay` is exact.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import yaml
from kubernetes_asyncio import client

from kai_es.app import open_log
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.state import ClusterState, fold
from tests.k8s.conftest import LEADER_ROLE, K8s
from tests.k8s.helpers import create_pod, gpu_pod, log_records, queue, raw, wait_for
from tests.processes import ROOT, Proc

POOL_LABEL = "kai.scheduler/node-pool"
NODES, GPUS_PER_NODE = 2, 8
HALF = NODES * GPUS_PER_NODE // 2
#: the consolidation pool: 2 nodes of 2 GPUs, a queue of quota 4
MOVE_NODES, MOVE_GPUS = 2, 2
#: the step whose evictions a round's fault strikes
STEPS = ("reclaim", "preempt", "consolidation")
NON_PREEMPTIBLE = {"kai.scheduler/preemptibility": "non-preemptible"}
KILLS = int(os.environ.get("KAI_ES_KILLS", "20"))
DECISIONS = (p.BindingDecided, p.EvictionDecided)
T = TypeVar("T")
OUTCOMES = (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)


def _gpus(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", "0"))


def _placed(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName")) and not pod["metadata"].get("deletionTimestamp")


def _unanswered(records: list[Record]) -> list[str]:
    answered = {r.envelope.data.decision_id for r in records if isinstance(r.envelope.data, OUTCOMES)}
    return [r.envelope.id for r in records if isinstance(r.envelope.data, DECISIONS) and r.envelope.id not in answered]


@dataclass
class Reclaiming:
    """Two queues of quota HALF on NODES×GPUS_PER_NODE GPUs that take their share back from
    each other, one round at a time, with a fault in each round's eviction window."""

    api: client.ApiClient
    ns: str
    log: str
    queues: tuple[str, str]
    pool: dict[str, str]
    rng: random.Random
    urgent: str
    #: the consolidation pool: its namespace, queue and node-pool label
    move_ns: str
    move_queue: str
    move_pool: dict[str, str]
    rounds: int = 0
    evictions: int = 0
    #: rounds with a consolidation step
    moves: int = 0
    counter: collections.abc.Iterator[int] = field(default_factory=lambda: iter(range(10**6)))

    @classmethod
    async def create(cls, k8s: K8s, api: client.ApiClient, log: str) -> Reclaiming:
        tag = uuid.uuid4().hex[:8]
        pool = {POOL_LABEL: f"pool-{tag}"}
        for i in range(NODES):
            k8s.gpu_node(f"r-{tag}-{i}", gpus=GPUS_PER_NODE, labels=pool)
        queues = (f"qa-{tag}", f"qb-{tag}")
        for name in queues:
            status, _ = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", queue(name, gpu_quota=HALF), _preload_content=False))
            assert status == 201
        # above the `train` priority bare pods get (podgrouper), below 100: still preemptible
        urgent = f"urgent-{tag}"
        k8s.cp.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": urgent}, "value": 75})
        move_pool = {POOL_LABEL: f"move-{tag}"}
        for i in range(MOVE_NODES):
            k8s.gpu_node(f"m-{tag}-{i}", gpus=MOVE_GPUS, labels=move_pool)
        move_queue = f"qc-{tag}"
        status, _ = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(move_queue, gpu_quota=MOVE_NODES * MOVE_GPUS),
            _preload_content=False))
        assert status == 201
        return cls(api, k8s.namespace(), log, queues, pool, random.Random(tag), urgent,
                   k8s.namespace(), move_queue, move_pool)

    async def pods(self, ns: str = "") -> list[dict[str, Any]]:
        status, body = await raw(await client.CoreV1Api(self.api).list_namespaced_pod(ns or self.ns,
                                                                                     _preload_content=False))
        assert status == 200
        return list(body["items"])

    async def submit(self, q: str, count: int, priority_class: str = "") -> list[str]:
        names = []
        for _ in range(count):
            name = f"{q}-p{next(self.counter)}"
            body = gpu_pod(name, self.ns, gpus=1, queue=q, labels=self.pool)
            if priority_class:
                body["spec"]["priorityClassName"] = priority_class
            await create_pod(self.api, body)
            names.append(name)
        return names

    async def running(self, names: list[str]) -> bool:
        pods = {pod["metadata"]["name"]: pod for pod in await self.pods()}
        return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

    async def finish(self, q: str) -> None:
        for pod in await self.pods():
            if pod["metadata"]["labels"].get("kai.scheduler/queue") == q:
                await client.CoreV1Api(self.api).delete_namespaced_pod(pod["metadata"]["name"], self.ns,
                                                                       grace_period_seconds=0)

    async def picture(self) -> str:
        """The pods and the log's tail, for a failure message."""
        rows = [f"{pod['metadata']['name']} node={pod['spec'].get('nodeName')} "
                f"phase={pod.get('status', {}).get('phase')} deleting={bool(pod['metadata'].get('deletionTimestamp'))}"
                for pod in await self.pods() + await self.pods(self.move_ns)]
        tail = [f"{r.position} {type(r.envelope.data).__name__} {r.envelope.data}"[:300]
                for r in (await log_records(self.log))[-40:]]
        return "\n".join(rows + ["--- log tail"] + tail)

    async def expect(self, fn: Callable[[], Awaitable[Any]], what: str, timeout_s: float) -> None:
        await self.expect_value(fn, what, timeout_s)

    async def expect_value(self, fn: Callable[[], Awaitable[T | None]], what: str, timeout_s: float) -> T:
        try:
            return await wait_for(fn, what, timeout_s=timeout_s, interval_s=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e} (the log, copied: {await self.copy_log()})\n{await self.picture()}") from None

    async def copy_log(self) -> Path:
        """The log's events copied into a file log (in $KAI_ES_DUMP, default /tmp), to explain
        a failure with `kai-es explain` after the broker is gone."""
        path = Path(os.environ.get("KAI_ES_DUMP", "/tmp")) / f"{self.queues[0]}.events.jsonl"
        copy = open_log(str(path), fresh=True)
        try:
            await copy.append([r.envelope for r in await log_records(self.log)])
        finally:
            await copy.close()
        return path

    async def start(self) -> None:
        held = await self.submit(self.queues[0], HALF)
        await self.expect(lambda: self.running(held), "the first queue's pods Running", timeout_s=90)

    async def round(self, fault: Callable[[], Awaitable[None]], what: str, step: str) -> None:
        """One round: the lender's pods fill what the taker's finished pods free (the lender
        goes over its quota), the taker asks for its share back (reclaim evicts HALF of the
        lender's pods), then one urgent pod of the lender's arrives (preempt evicts one of its
        own); with `step` "consolidation", a move follows (`consolidate`). `fault` strikes while
        `step` evicts; after each step, the pods that asked run and each queue holds exactly its
        quota."""
        assert step in STEPS, step
        lender, taker = self.queues[self.rounds % 2], self.queues[1 - self.rounds % 2]
        label = f"round {self.rounds} ({what} in {step})"
        in_reclaim = step == "reclaim"
        await self.finish(taker)
        filled = await self.submit(lender, HALF)
        await self.expect(lambda: self.running(filled), f"{label}: the lender's pods Running", timeout_s=120)
        for action, asking in (("reclaim", (taker, HALF, "")), ("preempt", (lender, 1, self.urgent))):
            names = await self.submit(*asking)
            if action == step:
                await anyio.sleep(self.rng.uniform(0.05, 0.6))  # evictions in flight
                await fault()
            await self.expect(lambda: self.running(names), f"{label}: the pods {action} made room for Running",
                              timeout_s=120)
            holding = collections.Counter(pod["metadata"]["labels"]["kai.scheduler/queue"]
                                          for pod in await self.pods() if _placed(pod))
            assert holding == {lender: HALF, taker: HALF}, (label, action, holding, await self.picture())
        if step == "consolidation":
            await self.consolidate(fault, label)
        self.rounds += 1
        self.evictions += HALF + 1

    async def _move_pod(self, name: str, gpus: int, labels: dict[str, str]) -> str:
        body = gpu_pod(name, self.move_ns, gpus=gpus, queue=self.move_queue, labels={**self.move_pool, **labels})
        await create_pod(self.api, body)
        return name

    async def consolidate(self, fault: Callable[[], Awaitable[None]], label: str) -> None:
        """The consolidation step: on the pool's 2 × 2 GPUs, a ReplicaSet's pod (movable) and a
        non-preemptible pod sit on different nodes with one GPU free on each; a 2-GPU pod
        arrives and fits nowhere until consolidation moves the ReplicaSet's pod. `fault` strikes
        while it evicts. Then the 2-GPU pod and the ReplicaSet's replacement run and the queue
        holds its quota; everything is deleted again."""
        core, apps, n = client.CoreV1Api(self.api), client.AppsV1Api(self.api), next(self.counter)
        blockers = [await self._move_pod(f"block-{n}-{i}", 1, NON_PREEMPTIBLE) for i in range(3)]
        rs_name, app = f"movable-{n}", {"app": f"movable-{n}"}
        template = gpu_pod("", self.move_ns, gpus=1, queue=self.move_queue, labels={**self.move_pool, **app})
        rs: dict[str, Any] = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": rs_name, "namespace": self.move_ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": app},
                     "template": {"metadata": {"labels": template["metadata"]["labels"]}, "spec": template["spec"]}}}
        status, out = await raw(await apps.create_namespaced_replica_set(self.move_ns, rs, _preload_content=False))
        assert status == 201, out

        async def full() -> dict[str, str] | None:  # pod -> node, once the blockers and the movable pod run
            pods = await self.pods(self.move_ns)
            running = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in pods
                       if pod.get("status", {}).get("phase") == "Running" and _placed(pod)}
            ours = sorted(name for name in running if name.startswith(rs_name))
            return running if len(ours) == 1 and all(b in running for b in blockers) else None

        where = await self.expect_value(full, f"{label}: the consolidation pool full", timeout_s=60)
        movable = next(name for name in where if name.startswith(rs_name))
        # one GPU free on each node: free the blocker beside the movable pod and one other
        beside = next(b for b in blockers if where[b] == where[movable])
        other = next(b for b in blockers if where[b] != where[movable])
        for name in (beside, other):
            await core.delete_namespaced_pod(name, self.move_ns, grace_period_seconds=0)
        wide = await self._move_pod(f"wide-{n}", 2, {})
        await anyio.sleep(self.rng.uniform(0.05, 0.6))  # the move's eviction in flight
        await fault()

        async def moved() -> bool:
            pods = {pod["metadata"]["name"]: pod for pod in await self.pods(self.move_ns) if _placed(pod)}
            replacement = [name for name in pods if name.startswith(rs_name) and name != movable]
            return (movable not in pods and len(replacement) == 1
                    and all(pods.get(x, {}).get("status", {}).get("phase") == "Running" for x in (wide, replacement[0])))

        # a move whose eviction a fault refused is tried again once the victim's 60 s eviction
        # back-off ends, at the 2-GPU pod's next search (its searches back off 1 s doubling)
        await self.expect(moved, f"{label}: the 2-GPU pod and the moved pod's replacement Running", timeout_s=150)
        holding = sum(_gpus(pod) for pod in await self.pods(self.move_ns) if _placed(pod))
        assert holding == MOVE_NODES * MOVE_GPUS, (label, holding, await self.picture())
        status, out = await raw(await apps.delete_namespaced_replica_set(
            rs_name, self.move_ns, propagation_policy="Background", _preload_content=False))
        assert status == 200, out
        for pod in await self.pods(self.move_ns):  # (the garbage collector may delete the ReplicaSet's first)
            status, out = await raw(await core.delete_namespaced_pod(
                pod["metadata"]["name"], self.move_ns, grace_period_seconds=0, _preload_content=False))
            assert status in (200, 404), out

        async def empty() -> bool:
            return not await self.pods(self.move_ns)

        await self.expect(empty, f"{label}: the consolidation pool emptied", timeout_s=60)
        self.moves += 1
        self.evictions += 1

    async def settle(self) -> list[dict[str, Any]]:
        """Wait until nothing is pending and every decision is answered; the pods then."""
        async def settled() -> bool:
            pods = await self.pods()
            if any(not pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp") for pod in pods):
                return False
            return not _unanswered(await log_records(self.log))

        await self.expect(settled, "every pod placed and every decision answered", timeout_s=120)
        return [pod for pod in await self.pods() if not pod["metadata"].get("deletionTimestamp")]

    async def check(self, final: list[dict[str, Any]], *, every_eviction_answered_evicted: bool = True) -> list[Record]:
        """The invariants of the module docstring over the whole log; returns the log.

        `every_eviction_answered_evicted`: each round's HALF evictions all have a PodEvicted
        (without apiserver faults); with them an eviction the apiserver applied while its answer
        was lost is reported failed, so only "never more than needed" holds."""
        records = await log_records(self.log)
        outcomes = collections.Counter(r.envelope.data.decision_id for r in records
                                       if isinstance(r.envelope.data, OUTCOMES))
        decisions = [r.envelope for r in records if isinstance(r.envelope.data, DECISIONS)]
        extra = [(d.id, type(d.data).__name__, outcomes[d.id]) for d in decisions if outcomes[d.id] != 1]
        assert not extra, f"decisions without, or with more than one, outcome: {extra[:10]}"
        bound = collections.Counter(r.envelope.data.uid for r in records if isinstance(r.envelope.data, p.PodBound))
        evicted = collections.Counter(r.envelope.data.uid for r in records if isinstance(r.envelope.data, p.PodEvicted))
        assert max(bound.values()) == 1, [u for u, n in bound.items() if n > 1]
        assert max(evicted.values()) == 1, [u for u, n in evicted.items() if n > 1]
        if every_eviction_answered_evicted:
            assert len(evicted) == self.evictions, f"{len(evicted)} pods evicted, {self.evictions} needed"
        else:
            assert self.evictions // 2 <= len(evicted) <= self.evictions, (len(evicted), self.evictions)
        actions = collections.Counter(d.data.action for d in decisions if isinstance(d.data, p.EvictionDecided))
        assert actions["reclaim"] >= HALF * self.rounds and actions["preempt"] >= self.rounds, actions
        assert actions["consolidation"] >= self.moves > 0, (actions, self.moves)
        state = ClusterState()
        fold(records, state)
        shown: collections.Counter[str] = collections.Counter()
        for pod in final:
            if pod["spec"].get("nodeName"):
                shown[pod["metadata"]["labels"]["kai.scheduler/queue"]] += 1000 * _gpus(pod)
        for name in (*self.queues, self.move_queue):  # (the consolidation pool ends empty)
            assert state.queues[name].allocated_milli_gpu == shown[name], (name, state.queues[name].allocated_milli_gpu, shown)
        run = subprocess.run([sys.executable, "-m", "kai_es", "replay", self.log], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        return records


async def test_kill_9_of_every_process_while_queues_reclaim_from_each_other(
        k8s: K8s, scheduler_kubeconfig: Path, kafka_bootstrap: str, tmp_path: Path, procs: list[Proc]) -> None:
    log = f"kafka://{kafka_bootstrap}/kai-es-{uuid.uuid4().hex[:8]}"
    kube = ["--kubeconfig", str(scheduler_kubeconfig)]
    informer = Proc("informer", ["informer", "--log", log, *kube], tmp_path)
    scheduler = Proc("scheduler", ["scheduler", "--log", log, "--period", "100ms", "--snapshot-every", "5"], tmp_path)
    binder = Proc("binder", ["binder", "--log", log, *kube], tmp_path)
    procs += [informer, scheduler, binder]
    async with k8s.client() as api:
        game = await Reclaiming.create(k8s, api, log)
        for proc in (informer, scheduler, binder):
            proc.start()
            proc.wait_ready(proc.name)
        await game.start()
        for i, proc in enumerate((informer, scheduler, binder) * KILLS):
            async def kill_and_start(proc: Proc = proc) -> None:
                proc.kill9()
                proc.start()
                proc.wait_ready(proc.name)

            # each process is killed in each step's evictions in turn
            await game.round(kill_and_start, f"kill -9 of the {proc.name}", STEPS[(i + i // 3) % 3])
        final = await game.settle()
    for proc in procs:
        proc.kill9()
    await game.check(final)
    assert informer.starts == scheduler.starts == binder.starts == KILLS + 1


#: the schedulers' Lease: deposed after 6 s without renewal (a SIGSTOP of 9 s outlasts it)
LEASE = ["--leader-elect-lease-duration", "6s", "--leader-elect-renew-deadline", "4s",
         "--leader-elect-retry-period", "500ms"]
STOPPED_S = 9.0


async def test_broker_apiserver_and_etcd_restarts_and_a_stopped_leader_while_queues_reclaim(
        k8s: K8s, kafka_broker: Any, scheduler_kubeconfig: Path, tmp_path: Path, procs: list[Proc]) -> None:
    tag = uuid.uuid4().hex[:8]
    log = f"kafka://{kafka_broker.bootstrap}/kai-es-{tag}"
    kube = ["--kubeconfig", str(scheduler_kubeconfig)]
    lease_ns = yaml.safe_load(LEADER_ROLE.read_text())["metadata"]["namespace"]
    lease_name = f"kai-es-scheduler-{tag}"
    informer = Proc("informer", ["informer", "--log", log, *kube], tmp_path)
    binder = Proc("binder", ["binder", "--log", log, *kube], tmp_path)
    schedulers = {who: Proc(f"scheduler-{who}", [
        "scheduler", "--log", log, "--period", "100ms", "--snapshot-every", "5", *kube, "--leader-elect",
        "--leader-elect-lease", f"{lease_ns}/{lease_name}", "--leader-elect-identity", f"scheduler-{who}",
        *LEASE], tmp_path) for who in ("a", "b")}
    procs += [informer, binder, *schedulers.values()]
    woken: list[Proc] = []

    async def holder(api: client.ApiClient) -> Proc:
        status, lease = await raw(await client.CoordinationV1Api(api).read_namespaced_lease(
            lease_name, lease_ns, _preload_content=False))
        assert status == 200, lease
        return schedulers[lease["spec"]["holderIdentity"].removeprefix("scheduler-")]

    async def restarted(restart: Callable[[], Any]) -> None:
        await anyio.to_thread.run_sync(restart)

    async def supervise() -> None:
        """Start again whatever exited, as a Deployment's kubelet would (a scheduler that lost
        its Lease exits by design; any other exit is a failure, reported at the end)."""
        while True:
            for proc in procs:
                if not proc.alive() and proc.popen is not None:
                    proc.start()
            await anyio.sleep(0.5)

    async with k8s.client() as api, anyio.create_task_group() as tg:
        game = await Reclaiming.create(k8s, api, log)
        for proc in (informer, binder, schedulers["a"]):
            proc.start()
            proc.wait_ready(proc.name.split("-")[0])
        schedulers["b"].start()
        schedulers["b"].wait_output("standing by: Lease")
        tg.start_soon(supervise)
        await game.start()

        async def stop_the_leader() -> None:
            old = await holder(api)
            assert old.popen is not None
            os.killpg(old.popen.pid, signal.SIGSTOP)
            try:
                await anyio.sleep(STOPPED_S)
            finally:
                os.killpg(old.popen.pid, signal.SIGCONT)
            new = await holder(api)
            assert new is not old, f"{old.name} stopped for {STOPPED_S} s still holds the Lease"
            woken.append(old)

        faults: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("broker restart", lambda: restarted(kafka_broker.restart)),
            ("apiserver restart", lambda: restarted(k8s.cp.restart_apiserver)),
            # then KWOK (the nodes' fake kubelet) relists, as a kubelet would: it was seen to
            # miss an evicted pod's deletion across the etcd restart and leave it Terminating;
            # and so does kube-controller-manager: its replicaset-controller was seen to miss a
            # moved pod's deletion and never make the replacement
            ("etcd restart", lambda: restarted(lambda: (k8s.cp.restart_etcd(), k8s.cp.restart_kwok(),
                                                        k8s.cp.restart_controller_manager()))),
            ("the leading scheduler stopped past its Lease", stop_the_leader),
        ]
        for i, (what, fault) in enumerate(faults * 3):  # each fault in each step's evictions
            await game.round(fault, what, STEPS[i // len(faults)])
        final = await game.settle()
        tg.cancel_scope.cancel()
    for proc in procs:
        proc.kill9()
    await game.check(final, every_eviction_answered_evicted=False)
    # each scheduler woken after its Lease was taken stopped, with a line saying why: Kafka
    # fenced its producer (the standby's took its transactional id) or its Lease was gone
    fenced = ("took over writing to Kafka topic", "lost the leader Lease", "could not renew the leader Lease")
    for proc in woken:
        assert any(line in proc.stderr() for line in fenced), proc.stderr()[-3000:]
    # the informer and the binder never exited: they rode out every restart
    assert informer.starts == binder.starts == 1, (informer.stderr()[-3000:], binder.stderr()[-3000:])
