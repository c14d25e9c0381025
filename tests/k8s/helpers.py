"""Small builders and waits for the Kubernetes tests (plain dicts, raw JSON calls)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.clock import SystemClock
from kai_es.adapters.ids import RandomIds
from kai_es.adapters.kubernetes.actuator import KubernetesActuator
from kai_es.adapters.kubernetes.gpushare import GpuSharing
from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.adapters.kubernetes.source import DEFAULT_KINDS, INFORMER_KINDS, KubernetesSource
from kai_es.app import open_log
from kai_es.events import Record
from kai_es.ports import EventLog
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import load_packer
from kai_es.services.binder import BinderService, Follower
from kai_es.services.informer import InformerService
from kai_es.services.scheduler import SchedulerService

T = TypeVar("T")


def gpu_pod(name: str, namespace: str, *, gpus: int = 1, queue: str = "",
            scheduler: str = "kai-scheduler", labels: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"cpu": "100m", "memory": "128Mi"}
    limits: dict[str, Any] = {}
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)  # extended resources: requests == limits
    all_labels = dict(labels or {})
    if queue:
        all_labels["kai.scheduler/queue"] = queue
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": all_labels,
                     "annotations": dict(annotations or {})},
        "spec": {"schedulerName": scheduler,
                 "containers": [{"name": "main", "image": "example.invalid/train:1",
                                 "resources": {"requests": res, "limits": limits}}]},
    }  # fmt: skip


def queue(name: str, *, parent: str = "", gpu_quota: int = -1) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": gpu_quota, "limit": -1,
                                                  "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
            "spec": spec}


def binding(name: str, namespace: str, uid: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


async def log_records(url: str) -> list[Record]:
    """Every record of the log at `url` (a process's log: Kafka or a file), read-only."""
    events = open_log(url, readonly=True)
    try:
        return [r async for r in events.read()]
    finally:
        await events.close()


async def raw(resp: Any) -> tuple[int, Any]:
    """(status, decoded JSON) of a `_preload_content=False` response; releases it."""
    try:
        body = await resp.read()
    finally:
        resp.release()
    try:
        return int(resp.status), json.loads(body) if body else None
    except ValueError:
        return int(resp.status), body.decode("utf-8", "replace")


async def create_pod(api: client.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    status, out = await raw(await core.create_namespaced_pod(
        body["metadata"]["namespace"], body, _preload_content=False))
    assert status == 201, (status, out)
    assert isinstance(out, dict)
    return out


async def get_pod(api: client.ApiClient, namespace: str, name: str) -> tuple[int, Any]:
    core = client.CoreV1Api(api)
    return await raw(await core.read_namespaced_pod(name, namespace, _preload_content=False))


def running_on(api: client.ApiClient, ns: str, names: Sequence[str], node: str) -> Callable[[], Awaitable[bool]]:
    """A `wait_for` check: every pod of `names` is Running, each on `node` (asserted)."""
    async def check() -> bool:
        for name in names:
            status, pod = await get_pod(api, ns, name)
            if status != 200 or pod["status"].get("phase") != "Running":
                return False
            assert pod["spec"]["nodeName"] == node, (name, pod["spec"].get("nodeName"))
        return True

    return check


async def wait_for(fn: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 15.0,
                   interval_s: float = 0.05) -> T:
    """Poll `fn` until it returns something other than None/False; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await fn()
        if last is not None and last is not False:
            return last  # type: ignore[return-value]
        await anyio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


async def wait_pod_phase(api: client.ApiClient, namespace: str, name: str, phase: str,
                         timeout_s: float = 15.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        status, pod = await get_pod(api, namespace, name)
        if status == 200 and pod.get("status", {}).get("phase") == phase:
            return dict(pod)
        return None

    return await wait_for(check, f"pod {namespace}/{name} {phase}", timeout_s)


@contextlib.asynccontextmanager
async def services_running(log: EventLog, api: client.ApiClient,
                           config: SchedulerConfig | None = None, *, grouping: bool = False,
                           gpu_sharing: GpuSharing | None = None,
                           followers: Sequence[Follower] = ()) -> AsyncIterator[EventLog]:
    """The informer, scheduler and binder services in this process, over `log` and the cluster
    of `api` (`config`, default: the default config; native packer), running until the block
    ends. `grouping`: the informer's source groups pods (PodGroupingSource); the binder prepares
    shared GPUs with `gpu_sharing` and runs `followers`."""
    clock, ids = SystemClock(), RandomIds()
    source: Any = KubernetesSource(api, kinds=INFORMER_KINDS if grouping else DEFAULT_KINDS)
    config = config or SchedulerConfig()
    ours = config.scheduler_name
    informer = InformerService(log, PodGroupingSource(source, api, ours=ours) if grouping else source, clock, ids,
                               ours=ours)
    scheduler = SchedulerService(log, config, load_packer("native"), clock, ids)
    binder = BinderService(log, KubernetesActuator(api, gpu_sharing=gpu_sharing), clock, followers=followers)
    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        tg.start_soon(scheduler.run, 50_000_000)
        tg.start_soon(binder.run, 20_000_000)
        yield log
        tg.cancel_scope.cancel()


async def create_queue(api: client.ApiClient, name: str) -> None:
    status, out = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
        "scheduling.run.ai", "v2", "queues", queue(name), _preload_content=False))
    assert status == 201, out


POOL_LABEL = "kai.scheduler/node-pool"


@dataclass(frozen=True)
class Pool:
    """A test's own node pool (other tests' nodes and pods stay out of it): one KWOK GPU node
    labelled with it, and a queue name of the same tag (not created)."""
    name: str
    node: str
    queue: str

    @property
    def labels(self) -> dict[str, str]:
        return {POOL_LABEL: self.name}


def pool_node(k8s: Any, gpus: int = 8) -> Pool:
    """A new Pool on the test control plane `k8s` (tests.k8s.conftest.K8s), its node `gpus` GPUs."""
    tag = uuid.uuid4().hex[:8]
    node = k8s.gpu_node(f"n-{tag}", gpus=gpus, labels={POOL_LABEL: f"pool-{tag}"})["metadata"]["name"]
    return Pool(f"pool-{tag}", node, f"q-{tag}")


async def create_podgroup(api: client.ApiClient, namespace: str, name: str, queue_name: str,
                          min_member: int) -> None:
    """A KAI PodGroup `name` of `queue_name` with `minMember: min_member`."""
    status, out = await raw(await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", namespace, "podgroups",
        {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
         "metadata": {"name": name, "namespace": namespace}, "spec": {"queue": queue_name, "minMember": min_member}},
        _preload_content=False))
    assert status == 201, out


async def disruption_budget(api: client.ApiClient, namespace: str, labels: Mapping[str, str],
                            name: str = "guard") -> None:
    """A PodDisruptionBudget (minAvailable 1) over the pods with `labels`, waited for in the
    apiserver's watch cache, where the eviction handler reads it. The controller-manager runs
    no disruption-controller here (controlplane.CONTROLLERS), so its status never allows a
    disruption: every eviction it covers is refused (429)."""
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": dict(labels)}}}
    policy = client.PolicyV1Api(api)
    status, out = await raw(await policy.create_namespaced_pod_disruption_budget(
        namespace, pdb, _preload_content=False))
    assert status == 201, out

    async def cached() -> bool:
        status, got = await raw(await policy.list_namespaced_pod_disruption_budget(
            namespace, resource_version="0", _preload_content=False))
        return status == 200 and any(i["metadata"]["name"] == name for i in got["items"])

    await wait_for(cached, "the PodDisruptionBudget in the watch cache")

