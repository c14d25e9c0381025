"""The real operators, each running as itself: JobSet, LeaderWorkerSet, KubeRay, the MPI operator,
Kubeflow Trainer and Kubeflow's training-operator, built from the Go module proxy at the versions in
tools/k8s/controlplane.py (OPERATORS) and run by a control plane of this module's own with their
own CRDs and webhooks (`ControlPlane(operators=...)`; the session's control plane does not pay
for them). For each kind, an object written the way the operator's documentation writes it (the
scheduler name and KAI's queue and node-pool labels added where KAI's documentation adds them)
is submitted; the operator (and, below it, kube-controller-manager's Job and StatefulSet
controllers) creates the pods; kai-es's informer groups them (KAI's podgrouper rules); its
scheduler places them and its binder binds them onto KWOK GPU nodes.

Every test first fills the pool with a Deployment so that only part of the gang fits: not one pod
of the gang binds (each is reported `GangUnsatisfied`). Freeing room (the Deployment scaled
down) binds the gang's minimum in one cycle, with each sub-group's minimum; pods beyond the
minimum (elastic) bind only after it. The run's log replays exactly. Each test fails when its
kind's rule is taken out of the podgrouper's table (its kind grouped by the default grouper,
TrainJob no longer looked through, PaddleJob no longer read): tried once for each. A PaddleJob is
the exception KAI makes: its podgrouper has no rule for it, so its default grouper puts its pods
in one group of minimum 1, and they bind as they fit (what its test shows).

If the operators cannot be built or started, every test here FAILS with the logs' tails."""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.events.envelope import Record
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import K8s, cp_mod, operator_plane
from tests.k8s.helpers import create_queue, raw, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"
QUEUE_LABEL = "kai.scheduler/queue"
SCHEDULER = "kai-scheduler"
ONE_GPU = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}}
NO_GPU = {"requests": {"cpu": "100m", "memory": "128Mi"}}
OPERATORS = ("jobset", "lws", "ray-operator", "mpi-operator", "trainer-controller-manager", "training-operator")


@pytest.fixture(scope="module")
def ops() -> Iterator[K8s]:
    """A control plane running every operator of OPERATORS, with KAI's CRDs and the scheduler's
    RBAC (deploy/rbac) bound."""
    with operator_plane(OPERATORS) as plane:
        yield plane


def container(name: str, resources: Mapping[str, Any] = ONE_GPU) -> dict[str, Any]:
    return {"name": name, "image": "example.invalid/train:1", "resources": dict(resources)}


def pod_spec(*containers: dict[str, Any], restart: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": SCHEDULER, "containers": list(containers)}
    if restart:
        spec["restartPolicy"] = restart
    return spec


def filler(pool: str, queue: str, replicas: int) -> dict[str, Any]:
    labels = {"app": "fill", POOL_LABEL: pool, QUEUE_LABEL: queue}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "fill", "labels": {QUEUE_LABEL: queue}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "fill"}},
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec(container("main"))}}}


@dataclass
class Run:
    """One test's namespace, queue, pool and log on the operators' control plane."""

    k8s: K8s
    ns: str
    queue: str
    pool: str
    nodes: set[str]
    log: MemoryEventLog
    api: client.ApiClient

    def labels(self, **more: str) -> dict[str, str]:
        return {QUEUE_LABEL: self.queue, POOL_LABEL: self.pool, **more}

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.k8s.cp.create_object(obj, self.ns)
        return out

    async def pods(self) -> list[dict[str, Any]]:
        status, out = await raw(await client.CoreV1Api(self.api).list_namespaced_pod(self.ns, _preload_content=False))
        assert status == 200, out
        return [pod for pod in out["items"] if pod["metadata"].get("labels", {}).get("app") != "fill"]

    async def fillers(self) -> list[dict[str, Any]]:
        status, out = await raw(await client.CoreV1Api(self.api).list_namespaced_pod(
            self.ns, label_selector="app=fill", _preload_content=False))
        assert status == 200, out
        return [pod for pod in out["items"] if not pod["metadata"].get("deletionTimestamp")]

    async def fill(self, replicas: int) -> None:
        """The filler Deployment at `replicas` one-GPU pods, each Running, the others gone."""
        status, out = await raw(await client.AppsV1Api(self.api).patch_namespaced_deployment_scale(
            "fill", self.ns, {"spec": {"replicas": replicas}}, _preload_content=False))
        assert status == 200, out

        async def settled() -> bool:
            got = await self.fillers()
            return len(got) == replicas and all(pod["status"].get("phase") == "Running" for pod in got)

        await wait_for(settled, f"the filler at {replicas} Running pods", timeout_s=60)

    def records(self) -> Awaitable[list[Record]]:
        async def read() -> list[Record]:
            return [r async for r in self.log.read()]
        return read()


def data_in(records: Iterable[Record], ns: str) -> list[Any]:
    return [r.envelope.data for r in records if getattr(r.envelope.data, "namespace", None) == ns]


def bind_cycles(records: Iterable[Record], ns: str, names: set[str]) -> dict[str, int]:
    """The cycle whose decisions bound each of the pods `names` in `ns`."""
    cycle, out = -1, {}
    for r in records:
        d = r.envelope.data
        if isinstance(d, p.CycleStarted):
            cycle = d.cycle
        elif isinstance(d, p.BindingDecided) and d.namespace == ns and d.name in names:
            out[d.name] = cycle
    return out


def bound(pod: Mapping[str, Any], nodes: set[str]) -> bool:
    return pod["spec"].get("nodeName") in nodes and pod["status"].get("phase") == "Running"


async def gang_waits(run: Run, size: int) -> list[dict[str, Any]]:
    """The workload's `size` pods once a cycle has ended after all of them were observed and each
    one's latest verdict is that the gang does not fit whole (a pod observed early keeps the
    verdict it was told then: kai-es tells a verdict again only when it changes); and not one of
    them bound."""

    async def reported() -> list[dict[str, Any]] | None:
        got = await run.pods()
        if len(got) < size:
            return None
        names = {pod["metadata"]["name"] for pod in got}
        seen: set[str] = set()
        judged = False  # a cycle ended after every pod of the gang was observed
        verdict: dict[str, set[str]] = {}  # each pod's latest reasons (a verdict is told once, when it changes)
        for record in await run.records():
            d = record.envelope.data
            if isinstance(d, p.CycleCompleted):
                judged = judged or seen == names
            elif getattr(d, "namespace", None) != run.ns or getattr(d, "name", None) not in names:
                continue
            elif isinstance(d, p.PodObserved):
                seen.add(d.name)
            elif isinstance(d, p.PodUnschedulable):
                verdict[d.name] = {reason.code for reason in d.reasons}
        return got if judged and all("GangUnsatisfied" in verdict.get(n, ()) for n in names) else None

    waiting = await wait_for(reported, f"the gang's {size} pods reported unschedulable", timeout_s=90)
    assert not [pod["metadata"]["name"] for pod in waiting if pod["spec"].get("nodeName")]
    names = {pod["metadata"]["name"] for pod in waiting}
    assert not [d for d in data_in(await run.records(), run.ns)
                if isinstance(d, (p.BindingDecided, p.PodPipelined, p.PodBound)) and d.name in names]
    return waiting


async def running(run: Run, want: Callable[[list[dict[str, Any]]], bool], what: str) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        got = await run.pods()
        return got if want(got) else None
    return await wait_for(check, what, timeout_s=90)


async def minimum_first(run: Run, total: int, minimum: int, what: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The workload's `total` pods wait as a gang; with the filler down to 6 of 8 GPUs its
    `minimum` pods bind and Run and the rest wait. Returns the pods and the waiting ones' names."""
    await gang_waits(run, total)
    await run.fill(6)

    def minimum_only(got: list[dict[str, Any]]) -> bool:
        placed = [x for x in got if x["spec"].get("nodeName")]
        return len(got) == total and len(placed) == minimum and all(bound(x, run.nodes) for x in placed)

    got = await running(run, minimum_only, what)
    return got, [x["metadata"]["name"] for x in got if not x["spec"].get("nodeName")]


def groups_in(data: Iterable[Any]) -> dict[str, p.PodGroupObserved]:
    """Each PodGroup's last observation."""
    return {d.name: d for d in data if isinstance(d, p.PodGroupObserved)}


def podgroup_of(data: Iterable[Any]) -> dict[str, str]:
    """pod name -> its PodGroup, as last observed."""
    return {d.name: d.podgroup for d in data if isinstance(d, p.PodObserved)}


def subgroup_of(data: Iterable[Any]) -> dict[str, str]:
    """pod name -> its sub-group, as last observed."""
    return {d.name: d.subgroup for d in data if isinstance(d, p.PodObserved)}


def subgroups(group: p.PodGroupObserved) -> dict[str, tuple[int, str, int | None]]:
    return {sg.name: (sg.min_member, sg.parent, sg.min_subgroup) for sg in group.subgroups}


def assert_replays(records: list[Record]) -> None:
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence


async def scenario(ops: K8s, gpus: int, fill: int, body: Callable[[Run], Awaitable[None]],
                   **node: Any) -> None:
    """`body` with the services running, after `fill` of the pool's `gpus` GPUs (4 per node;
    `node`: more of `create_gpu_node`'s options) are taken by the filler Deployment."""
    tag = uuid.uuid4().hex[:8]
    ns, qname, pool = ops.namespace("op"), f"q-{tag}", f"pool-{tag}"
    nodes = {ops.gpu_node(f"n-{tag}-{i}", gpus=4, labels={POOL_LABEL: pool}, **node)["metadata"]["name"]
             for i in range(gpus // 4)}
    log = MemoryEventLog()
    async with ops.client() as api, ops.client(Path(ops.scheduler_kubeconfig)) as kai_api:
        await create_queue(api, qname)
        run = Run(ops, ns, qname, pool, nodes, log, api)
        run.create(filler(pool, qname, fill))
        async with services_running(log, kai_api, grouping=True):
            await run.fill(fill)
            await body(run)


# -- JobSet ----------------------------------------------------------------------------------

def jobset(run: Run) -> dict[str, Any]:
    """A leader and two worker Jobs of two pods each (JobSet's docs: replicated jobs whose
    template is a Job's spec; the pod template asks kai-scheduler)."""
    def job(parallelism: int) -> dict[str, Any]:
        return {"spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                         "template": {"metadata": {"labels": run.labels()},
                                      "spec": pod_spec(container("main"), restart="Never")}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"replicatedJobs": [{"name": "leader", "replicas": 1, "template": job(1)},
                                        {"name": "workers", "replicas": 2, "template": job(2)}]}}


async def test_a_jobset_made_by_its_controller_binds_as_one_gang_of_replicated_jobs(ops: K8s) -> None:
    """5 pods (a leader Job of 1, two worker Jobs of 2): with 3 GPUs free none binds; with 5 all
    bind in one cycle, each replica's sub-group whole."""
    async def body(run: Run) -> None:
        js = run.create(jobset(run))
        await gang_waits(run, 5)
        await run.fill(3)
        gang = await running(run, lambda got: len(got) == 5 and all(bound(x, run.nodes) for x in got),
                             "the JobSet's 5 pods Running")
        records = await run.records()
        data = data_in(records, run.ns)
        pg = f"pg-train-{js['metadata']['uid']}"
        group = groups_in(data)[pg]
        assert group.queue == run.queue and group.min_subgroup == 2
        assert subgroups(group) == {
            "leader": (1, "", 1), "leader-replica-0": (1, "leader", None),
            "workers": (1, "", 2), "workers-replica-0": (2, "workers", None), "workers-replica-1": (2, "workers", None)}
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg}
        assert len(set(bind_cycles(records, run.ns, names).values())) == 1
        by_leaf = {(x["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"],
                    x["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"]) for x in gang}
        assert by_leaf == {("leader", "0"), ("workers", "0"), ("workers", "1")}
        assert_replays(records)

    await scenario(ops, 8, 6, body)


# -- LeaderWorkerSet -------------------------------------------------------------------------

def leader_worker_set(run: Run) -> dict[str, Any]:
    """Two replica groups of a leader and two workers (LWS's docs: leaderWorkerTemplate with a
    size and a worker template)."""
    template = {"metadata": {"labels": run.labels()}, "spec": pod_spec(container("worker"))}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 3, "workerTemplate": template}}}


async def test_a_leaderworkerset_binds_each_replica_group_whole_or_not_at_all(ops: K8s) -> None:
    """Two groups of 3 (a PodGroup each, sub-groups leader 1 and workers 2): with 4 GPUs free
    exactly one group binds, whole, and no pod of the other; with 6 the other binds whole."""
    async def body(run: Run) -> None:
        lws = run.create(leader_worker_set(run))

        async def one_group_bound() -> list[dict[str, Any]] | None:
            got = await run.pods()
            if len(got) < 6:
                return None
            placed = [x for x in got if x["spec"].get("nodeName")]
            return got if len(placed) == 3 and all(bound(x, run.nodes) for x in placed) else None

        got = await wait_for(one_group_bound, "one LWS group of 3 bound", timeout_s=90)
        group_of = {x["metadata"]["name"]: x["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
                    for x in got}
        placed = {group_of[x["metadata"]["name"]] for x in got if x["spec"].get("nodeName")}
        assert len(placed) == 1, group_of  # one whole group, not parts of two
        await gang_waits_for_group(run, {n for n, g in group_of.items() if g not in placed})
        await run.fill(2)
        gang = await running(run, lambda got: len(got) == 6 and all(bound(x, run.nodes) for x in got),
                             "both LWS groups Running")
        records = await run.records()
        data = data_in(records, run.ns)
        groups = groups_in(data)
        uid = lws["metadata"]["uid"]
        for i in ("0", "1"):
            group = groups[f"pg-serve-{uid}-group-{i}"]
            assert group.min_member == 3 and group.queue == run.queue
            assert subgroups(group) == {"leader": (1, "", None), "workers": (2, "", None)}
            names = {x["metadata"]["name"] for x in gang if group_of[x["metadata"]["name"]] == i}
            assert len(names) == 3 and {podgroup_of(data)[n] for n in names} == {group.name}
            assert len(set(bind_cycles(records, run.ns, names).values())) == 1
        assert_replays(records)

    await scenario(ops, 8, 4, body)


async def gang_waits_for_group(run: Run, names: set[str]) -> None:
    """Each of `names` reported GangUnsatisfied, and none of them bound."""
    async def reported() -> bool:
        seen = {d.name for d in data_in(await run.records(), run.ns) if isinstance(d, p.PodUnschedulable)
                and d.name in names and "GangUnsatisfied" in {r.code for r in d.reasons}}
        return seen == names

    await wait_for(reported, f"pods {sorted(names)} reported unschedulable", timeout_s=60)
    assert not [x for x in await run.pods() if x["metadata"]["name"] in names and x["spec"].get("nodeName")]


# -- KubeRay ---------------------------------------------------------------------------------

def ray_cluster(run: Run) -> dict[str, Any]:
    """A head and a worker group of 3 replicas, at least 2 (KubeRay's docs: headGroupSpec with
    rayStartParams, workerGroupSpecs with replicas / minReplicas / maxReplicas)."""
    def template(name: str, resources: Mapping[str, Any]) -> dict[str, Any]:
        return {"metadata": {"labels": run.labels()}, "spec": pod_spec(container(name, resources))}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "ray", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"rayVersion": "2.46.0",
                     "headGroupSpec": {"rayStartParams": {}, "template": template("ray-head", NO_GPU)},
                     "workerGroupSpecs": [{"groupName": "gpu", "replicas": 3, "minReplicas": 2, "maxReplicas": 4,
                                           "rayStartParams": {}, "template": template("ray-worker", ONE_GPU)}]}}


async def test_a_rayclusters_minimum_binds_first_and_its_elastic_worker_after(ops: K8s) -> None:
    """A head (no GPU) and 3 one-GPU workers, minimum 2: with 1 GPU free nothing binds; with 2
    the head and 2 workers bind in one cycle and the third worker waits; with a third GPU it
    binds too, in a later cycle."""
    async def body(run: Run) -> None:
        rc = run.create(ray_cluster(run))
        got, extra = await minimum_first(run, 4, 3, "the RayCluster's head and 2 workers Running")
        assert len(extra) == 1 and got[[x["metadata"]["name"] for x in got].index(extra[0])][
            "metadata"]["labels"]["ray.io/group"] == "gpu"
        await run.fill(5)
        gang = await running(run, lambda got: len(got) == 4 and all(bound(x, run.nodes) for x in got),
                             "all 4 Ray pods Running")
        records = await run.records()
        data = data_in(records, run.ns)
        pg = f"pg-ray-{rc['metadata']['uid']}"
        group = groups_in(data)[pg]
        assert group.min_member == 3 and group.queue == run.queue
        assert subgroups(group) == {"headgroup": (1, "", None), "gpu": (2, "", None)}
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg}
        cycles = bind_cycles(records, run.ns, names)
        first = {n for n in names if n not in extra}
        assert len({cycles[n] for n in first}) == 1 and cycles[extra[0]] > cycles[next(iter(first))]
        assert_replays(records)

    await scenario(ops, 8, 7, body)


def ray_job(run: Run) -> dict[str, Any]:
    """KubeRay's RayJob sample: an entrypoint and the RayCluster to run it on (a head and 2
    one-GPU workers)."""
    cluster = ray_cluster(run)["spec"]
    cluster["workerGroupSpecs"][0].update(replicas=2, minReplicas=2, maxReplicas=2)
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "job", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"entrypoint": "python /home/ray/samples/sample_code.py", "rayClusterSpec": cluster}}


async def ray_owner_binds_as_one_gang(ops: K8s, make: Callable[[Run], dict[str, Any]], what: str) -> None:
    """`make(run)`'s KubeRay object (its RayCluster: a head and 2 one-GPU workers) with 1 GPU
    free binds none of its pods, with 2 all three in one cycle; they are grouped by the object
    (`pg-<its name>-<uid>`), minimum 3, sub-groups head and workers, each pod made by KubeRay's
    RayCluster controller; the log replays."""
    async def body(run: Run) -> None:
        owner = run.create(make(run))
        await gang_waits(run, 3)
        await run.fill(6)

        def ray_pods(got: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [x for x in got if "ray.io/node-type" in x["metadata"].get("labels", {})]

        gang = ray_pods(await running(run, lambda got: len(ray_pods(got)) == 3 and all(
            bound(x, run.nodes) for x in ray_pods(got)), f"the {what}'s head and 2 workers Running"))
        records = await run.records()
        data = data_in(records, run.ns)
        pg = f"pg-{owner['metadata']['name']}-{owner['metadata']['uid']}"
        group = groups_in(data)[pg]
        assert group.min_member == 3 and group.queue == run.queue
        assert subgroups(group) == {"headgroup": (1, "", None), "gpu": (2, "", None)}
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg}
        owners = {x["metadata"]["ownerReferences"][0]["kind"] for x in gang}
        assert owners == {"RayCluster"}, owners
        assert len(set(bind_cycles(records, run.ns, names).values())) == 1
        assert_replays(records)

    await scenario(ops, 8, 7, body)


async def test_a_rayjobs_cluster_binds_as_one_gang_named_after_the_rayjob(ops: K8s) -> None:
    """KubeRay makes the RayJob's RayCluster, then its head and 2 workers: grouped by the RayJob
    (its `status.rayClusterName`)."""
    await ray_owner_binds_as_one_gang(ops, ray_job, "RayJob")


def ray_service(run: Run) -> dict[str, Any]:
    """KubeRay's RayService sample: Ray Serve applications (serveConfigV2, a YAML string) and
    the RayCluster to serve them on (a head and 2 one-GPU workers)."""
    cluster = ray_cluster(run)["spec"]
    cluster["workerGroupSpecs"][0].update(replicas=2, minReplicas=2, maxReplicas=2)
    serve = ("applications:\n"
             "  - name: fruit_app\n"
             "    import_path: fruit.deployment_graph\n"
             "    route_prefix: /fruit\n"
             "    runtime_env:\n"
             "      working_dir: https://example.invalid/test_dag.zip\n")
    return {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "serve", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"serveConfigV2": serve, "rayClusterConfig": cluster}}


async def test_a_rayservices_cluster_binds_as_one_gang_named_after_the_rayservice(ops: K8s) -> None:
    """KubeRay makes the RayService's RayCluster (its pending cluster: it turns active only once
    Ray Serve answers on the head, which a KWOK pod never does), then its head and 2 workers:
    grouped by the RayService through `status.pendingServiceStatus.rayClusterName`."""
    await ray_owner_binds_as_one_gang(ops, ray_service, "RayService")


# -- MPI operator ----------------------------------------------------------------------------

def mpi_job(run: Run) -> dict[str, Any]:
    """The MPI operator's pi example, v2beta1: a launcher (no GPU) and 2 one-GPU workers."""
    def spec(replicas: int, name: str, resources: Mapping[str, Any]) -> dict[str, Any]:
        return {"replicas": replicas, "template": {"metadata": {"labels": run.labels()},
                                                   "spec": pod_spec(container(name, resources))}}
    launcher = spec(1, "mpi-launcher", NO_GPU)
    launcher["template"]["spec"]["containers"][0]["command"] = ["mpirun", "-n", "2", "/home/mpiuser/pi"]
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": "pi", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"}, "sshAuthMountPath": "/home/mpiuser/.ssh",
                     "mpiReplicaSpecs": {"Launcher": launcher, "Worker": spec(2, "mpi-worker", ONE_GPU)}}}


async def test_an_mpijob_binds_its_launcher_and_workers_as_one_gang(ops: K8s) -> None:
    """A launcher (made through a batch Job) and 2 workers (made by the operator), minimum 3:
    with 1 GPU free none binds; with 2 all three bind in one cycle."""
    async def body(run: Run) -> None:
        job = run.create(mpi_job(run))
        await gang_waits(run, 3)
        await run.fill(6)
        gang = await running(run, lambda got: len(got) == 3 and all(bound(x, run.nodes) for x in got),
                             "the MPIJob's 3 pods Running")
        records = await run.records()
        data = data_in(records, run.ns)
        pg = f"pg-pi-{job['metadata']['uid']}"
        group = groups_in(data)[pg]
        assert group.min_member == 3 and group.queue == run.queue and group.priority_class == "train"
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg}
        roles = sorted(x["metadata"]["labels"]["training.kubeflow.org/job-role"] for x in gang)
        assert roles == ["launcher", "worker", "worker"]
        assert len(set(bind_cycles(records, run.ns, names).values())) == 1
        assert_replays(records)

    await scenario(ops, 8, 7, body)


# -- Kubeflow Trainer ------------------------------------------------------------------------

def kai_runtime(name: str, run: Run) -> dict[str, Any]:
    """A ClusterTrainingRuntime as Kubeflow Trainer's KAI guide writes one: the shipped
    `torch-distributed` runtime with the pod template asking kai-scheduler (and the test's
    node pool)."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                     "template": {"spec": {"replicatedJobs": [{
                         "name": "node",
                         "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                      "spec": {"template": {"metadata": {"labels": {POOL_LABEL: run.pool}},
                                                            "spec": pod_spec(container("node", NO_GPU))}}}}]}}}}


def train_job(run: Run, runtime: str) -> dict[str, Any]:
    """Kubeflow Trainer's KAI guide's TrainJob: the runtime, 3 nodes of one GPU, the queue label."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "torch", "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"runtimeRef": {"name": runtime},
                     "trainer": {"numNodes": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}}}}}


async def test_a_trainjob_binds_its_nodes_as_one_gang_through_its_jobset(ops: K8s) -> None:
    """The trainer makes a JobSet of one Job of 3 pods; KAI looks through the TrainJob to the
    JobSet (the TrainJob's queue label carried down): with 2 GPUs free none binds, with 3 all
    bind in one cycle."""
    async def body(run: Run) -> None:
        runtime = f"kai-torch-{run.pool}"
        ops.cp.create_object(kai_runtime(runtime, run))
        run.create(train_job(run, runtime))
        await gang_waits(run, 3)
        await run.fill(5)
        gang = await running(run, lambda got: len(got) == 3 and all(bound(x, run.nodes) for x in got),
                             "the TrainJob's 3 pods Running")
        records = await run.records()
        data = data_in(records, run.ns)
        status, js = ops.cp.request("GET", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{run.ns}/jobsets/torch")
        assert status == 200, js
        assert [r["kind"] for r in js["metadata"]["ownerReferences"]] == ["TrainJob"]
        pg = f"pg-torch-{js['metadata']['uid']}"
        group = groups_in(data)[pg]
        assert group.queue == run.queue and group.min_subgroup == 1
        assert subgroups(group) == {"node": (1, "", 1), "node-replica-0": (3, "node", None)}
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg}
        assert len(set(bind_cycles(records, run.ns, names).values())) == 1
        assert_replays(records)

    await scenario(ops, 8, 6, body)


# -- Kubeflow training-operator (v1: PyTorchJob, TFJob, XGBoostJob, PaddleJob) ----------------

REPLICA_TYPE = "training.kubeflow.org/replica-type"


def replica_spec(run: Run, replicas: int, name: str, resources: Mapping[str, Any] = ONE_GPU, *,
                 restart: str = "OnFailure", labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One replica type as Kubeflow's examples write it: replicas, restartPolicy and a pod
    template whose container has the kind's default name (the operator's webhook insists);
    the scheduler name and the test's labels (queue and pool) on the template."""
    return {"replicas": replicas, "restartPolicy": restart,
            "template": {"metadata": {"labels": dict(run.labels() if labels is None else labels)},
                         "spec": pod_spec(container(name, resources))}}


def training_job(run: Run, kind: str, name: str, field: str, specs: Mapping[str, Any], **spec: Any) -> dict[str, Any]:
    """A kubeflow.org/v1 job with KAI's queue label on it, as KAI's docs add it."""
    return {"apiVersion": "kubeflow.org/v1", "kind": kind,
            "metadata": {"name": name, "labels": {QUEUE_LABEL: run.queue}},
            "spec": {**spec, field: dict(specs)}}


def roles(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(x["metadata"]["labels"][REPLICA_TYPE] for x in pods)


async def binds_whole(run: Run, job: Mapping[str, Any], size: int) -> tuple[list[Record], p.PodGroupObserved, list[dict[str, Any]]]:
    """After the gang was refused: all `size` pods Running on the pool, bound in one cycle, all
    in the job's PodGroup (KAI's `pg-<job>-<uid>`, priority class `train`, the job's queue);
    the log replays exactly. Returns the records, the group and the pods."""
    gang = await running(run, lambda got: len(got) == size and all(bound(x, run.nodes) for x in got),
                         f"the {job['kind']}'s {size} pods Running")
    records = await run.records()
    data = data_in(records, run.ns)
    group = groups_in(data)[f"pg-{job['metadata']['name']}-{job['metadata']['uid']}"]
    assert group.queue == run.queue and group.priority_class == "train"
    names = {x["metadata"]["name"] for x in gang}
    assert {podgroup_of(data)[n] for n in names} == {group.name}
    assert len(set(bind_cycles(records, run.ns, names).values())) == 1
    assert_replays(records)
    return records, group, gang


def pytorch_job(run: Run) -> dict[str, Any]:
    """KAI's batch sample (docs/batch/pytorch-job.yaml): a master and 2 workers of one GPU."""
    return training_job(run, "PyTorchJob", "pytorch-dist-mnist-nccl", "pytorchReplicaSpecs", {
        "Master": replica_spec(run, 1, "pytorch"), "Worker": replica_spec(run, 2, "pytorch")})


async def test_a_pytorchjob_binds_its_master_and_workers_as_one_gang_of_two_sub_groups(ops: K8s) -> None:
    """The training-operator makes a master and 2 workers, minimum 3, sub-groups master (1) and
    worker (2), each pod in its own by its replica type: with 2 GPUs free none binds, with 3
    all bind in one cycle."""
    async def body(run: Run) -> None:
        job = run.create(pytorch_job(run))
        await gang_waits(run, 3)
        await run.fill(5)
        records, group, gang = await binds_whole(run, job, 3)
        assert group.min_member == 3
        assert subgroups(group) == {"master": (1, "", None), "worker": (2, "", None)}
        data = data_in(records, run.ns)
        assert {x["metadata"]["name"]: subgroup_of(data)[x["metadata"]["name"]] for x in gang} == {
            x["metadata"]["name"]: x["metadata"]["labels"][REPLICA_TYPE] for x in gang}
        assert roles(gang) == ["master", "worker", "worker"]

    await scenario(ops, 8, 6, body)


def elastic_pytorch_job(run: Run) -> dict[str, Any]:
    """KAI's elastic sample (docs/elastic/pytorch-elastic.yaml) without its HPA metrics: 3
    one-GPU workers, elasticPolicy minReplicas 2, maxReplicas 3."""
    return training_job(run, "PyTorchJob", "elastic-example-imagenet", "pytorchReplicaSpecs",
                        {"Worker": replica_spec(run, 3, "pytorch")},
                        elasticPolicy={"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 3, "maxRestarts": 100})


async def test_an_elastic_pytorchjobs_min_replicas_bind_first_and_its_third_worker_after(ops: K8s) -> None:
    """3 workers, elasticPolicy.minReplicas 2 (the minimum; sub-group worker 2): with 1 GPU
    free none binds; with 2 two workers bind in one cycle and the third waits; with a third GPU
    it binds too, in a later cycle."""
    async def body(run: Run) -> None:
        job = run.create(elastic_pytorch_job(run))
        _, extra = await minimum_first(run, 3, 2, "the PyTorchJob's 2 minimum workers Running")
        await run.fill(5)
        _, group, gang = await binds_whole_after(run, job, 3, extra)
        assert group.min_member == 2 and subgroups(group) == {"worker": (2, "", None)}
        assert roles(gang) == ["worker"] * 3

    await scenario(ops, 8, 7, body)


async def binds_whole_after(run: Run, job: Mapping[str, Any], size: int, extra: list[str], *,
                            together: bool = True) -> tuple[list[Record], p.PodGroupObserved, list[dict[str, Any]]]:
    """All `size` pods Running, in the job's PodGroup; the pods but `extra` bound first (in one
    cycle if `together`: a gang's minimum) and each of `extra` (elastic) in a later cycle; the
    log replays exactly."""
    gang = await running(run, lambda got: len(got) == size and all(bound(x, run.nodes) for x in got),
                         f"all {size} pods of the {job['kind']} Running")
    records = await run.records()
    data = data_in(records, run.ns)
    group = groups_in(data)[f"pg-{job['metadata']['name']}-{job['metadata']['uid']}"]
    assert group.queue == run.queue
    names = {x["metadata"]["name"] for x in gang}
    assert {podgroup_of(data)[n] for n in names} == {group.name}
    cycles = bind_cycles(records, run.ns, names)
    first = {cycles[n] for n in names if n not in extra}
    assert extra and set(extra) < names and (len(first) == 1 or not together)
    assert all(cycles[n] > max(first) for n in extra)
    assert_replays(records)
    return records, group, gang


def tf_job(run: Run) -> dict[str, Any]:
    """A TFJob with a chief, a parameter server (no GPU) and 2 workers (Kubeflow's dist-mnist
    example's replica types)."""
    return training_job(run, "TFJob", "dist-mnist", "tfReplicaSpecs", {
        "Chief": replica_spec(run, 1, "tensorflow", restart="Never"),
        "PS": replica_spec(run, 1, "tensorflow", NO_GPU, restart="Never"),
        "Worker": replica_spec(run, 2, "tensorflow", restart="Never")})


async def test_a_tfjob_binds_its_chief_ps_and_workers_as_one_gang(ops: K8s) -> None:
    """4 pods (3 of one GPU), minimum every replica: with 2 GPUs free none binds, with 3 all
    four bind in one cycle."""
    async def body(run: Run) -> None:
        job = run.create(tf_job(run))
        await gang_waits(run, 4)
        await run.fill(5)
        _, group, gang = await binds_whole(run, job, 4)
        assert group.min_member == 4 and not group.subgroups
        assert roles(gang) == ["chief", "ps", "worker", "worker"]

    await scenario(ops, 8, 6, body)


def xgboost_job(run: Run) -> dict[str, Any]:
    """Kubeflow's XGBoostJob example (xgboostjob.yaml): a master and 2 workers."""
    return training_job(run, "XGBoostJob", "xgboost-dist-iris-test-train", "xgbReplicaSpecs", {
        "Master": replica_spec(run, 1, "xgboost", restart="Never"),
        "Worker": replica_spec(run, 2, "xgboost", restart="ExitCode")})


async def test_an_xgboostjob_binds_its_master_and_workers_as_one_gang(ops: K8s) -> None:
    """3 one-GPU pods, minimum 3: with 2 GPUs free none binds, with 3 all bind in one cycle."""
    async def body(run: Run) -> None:
        job = run.create(xgboost_job(run))
        await gang_waits(run, 3)
        await run.fill(5)
        _, group, gang = await binds_whole(run, job, 3)
        assert group.min_member == 3 and not group.subgroups
        assert roles(gang) == ["master", "worker", "worker"]

    await scenario(ops, 8, 6, body)


def paddle_job(run: Run) -> dict[str, Any]:
    """A PaddleJob of a master and 2 workers (Kubeflow's simple-gpu example's form), KAI's
    queue label on the job only, as KAI's docs put it."""
    pool = {POOL_LABEL: run.pool}
    return training_job(run, "PaddleJob", "paddle-simple-gpu", "paddleReplicaSpecs", {
        "Master": replica_spec(run, 1, "paddle", labels=pool), "Worker": replica_spec(run, 2, "paddle", labels=pool)})


async def test_a_paddlejob_is_one_group_of_minimum_one_as_kais_default_grouper_makes_it(ops: K8s) -> None:
    """KAI's podgrouper has no PaddleJob rule: its default grouper makes one group per job, of
    minimum 1, with the job's queue. With 2 GPUs free 2 of the 3 pods bind (no gang), the third
    waits; with a third GPU it binds, in a later cycle."""
    async def body(run: Run) -> None:
        job = run.create(paddle_job(run))

        def two_bound(got: list[dict[str, Any]]) -> bool:
            placed = [x for x in got if x["spec"].get("nodeName")]
            return len(got) == 3 and len(placed) == 2 and all(bound(x, run.nodes) for x in placed)

        got = await running(run, two_bound, "2 of the PaddleJob's 3 pods Running")
        extra = [x["metadata"]["name"] for x in got if not x["spec"].get("nodeName")]
        await run.fill(5)
        _, group, gang = await binds_whole_after(run, job, 3, extra, together=False)
        assert group.min_member == 1 and not group.subgroups and group.priority_class == "train"
        assert roles(gang) == ["master", "worker", "worker"]

    await scenario(ops, 8, 6, body)


def test_the_operators_run_as_built_at_their_pinned_versions(ops: K8s) -> None:
    """Each operator is the binary built from its module at the pinned version, running, and its
    webhooks are registered with the apiserver."""
    cp = ops.cp
    assert set(cp.operators) == set(OPERATORS)
    for name, proc in cp.operators.items():
        assert proc.proc.running(), proc.proc.tail()
        assert Path(os.readlink(f"/proc/{proc.proc.pid}/exe")) == cp_mod.operator_bin(cp_mod.OPERATORS[name]).resolve()
    hooks = {h["metadata"]["name"] for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
             for h in cp.call("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}")["items"]}
    assert {h.split("-", 1)[0] for h in hooks} >= {"jobset", "lws", "trainer", "training"}
    # the training-operator's webhook is called (with the control plane's CA) and refuses a
    # PyTorchJob without its `pytorch` container
    bad = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "no-pytorch"},
           "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {
               "containers": [{"name": "main", "image": "example.invalid/train:1"}]}}}}}}
    status, out = cp.request("POST", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs", bad)
    assert status == 403 and 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied' in str(out), (status, out)


def operator_user(cp: Any, name: str, proc: Any) -> dict[str, Any]:
    """The apiserver's userInfo of operator `name`'s process: its own user, never system:masters."""
    _, review = cp.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                           token=proc.user.token)
    info: dict[str, Any] = review["status"]["userInfo"]
    assert info["username"] == f"kai-es-operator:{name}"
    assert "system:masters" not in info.get("groups", []), info
    return info


def operator_may(cp: Any, proc: Any, info: dict[str, Any]) -> Callable[..., bool]:
    """`may(verb, group, resource, namespace="default")`: whether the apiserver allows operator
    process `proc` (its user `info`, from `operator_user`) that, by a SubjectAccessReview."""
    def may(verb: str, group: str, resource: str, namespace: str = "default") -> bool:
        sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
               "spec": {"user": proc.user.name, "groups": info.get("groups", []),
                        "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                               "namespace": namespace}}}
        out = cp.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)
        return bool(out["status"].get("allowed"))

    return may


def test_each_operator_runs_as_its_own_user_with_only_its_installs_role(ops: K8s) -> None:
    """No operator is in system:masters: the apiserver knows each by its own user, holding only
    the manager ClusterRole its install ships (what let the tests above run). Each may create
    what it makes (pods, Jobs, StatefulSets or JobSets), none may write RBAC or
    delete nodes, and none was refused a request while the tests ran (its log names no
    `forbidden`)."""
    cp = ops.cp
    for name, proc in cp.operators.items():
        may = operator_may(cp, proc, operator_user(cp, name, proc))
        makes = {"jobset": ("batch", "jobs"), "trainer-controller-manager": ("jobset.x-k8s.io", "jobsets"),
                 "lws": ("apps", "statefulsets")}.get(name, ("", "pods"))
        assert may("create", *makes), (name, makes)
        assert not may("create", "rbac.authorization.k8s.io", "clusterroles"), name
        assert not may("delete", "", "nodes"), name
        assert "forbidden" not in proc.proc.log_path.read_text(errors="replace").lower(), proc.proc.tail()
