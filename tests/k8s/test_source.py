"""KubernetesSource against the real apiserver: LIST + WATCH of every kind, and recovery when a
watch cannot resume (410 Gone after an apiserver restart) by relisting that kind only."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.clock import SystemClock
from kai_es.adapters.ids import RandomIds
from kai_es.adapters.kubernetes.source import ALL_KINDS, KubernetesSource
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.ports import ObjectChange, Relist
from kai_es.services.informer import InformerService
from kai_es.state import fold
from tests.k8s.conftest import K8s
from tests.k8s.helpers import create_pod, gpu_pod, queue, raw, wait_for

MERGE = "application/merge-patch+json"


class Collector:
    """Runs source.changes() in the background and keeps every item."""

    def __init__(self, source: KubernetesSource) -> None:
        self.source = source
        self.items: list[ObjectChange | Relist] = []

    async def _consume(self) -> None:
        async with contextlib.aclosing(self.source.changes()) as it:  # type: ignore[type-var]
            async for batch in it:
                self.items.extend(batch)

    def actions(self, kind: str, name: str) -> list[str]:
        return [c.action for c in self.items if isinstance(c, ObjectChange) and c.kind == kind
                and c.obj["metadata"]["name"] == name]  # type: ignore[index]

    async def wait_actions(self, kind: str, name: str, *expected: str) -> None:
        async def ok() -> bool:
            acts = self.actions(kind, name)
            it = iter(acts)
            return all(any(a == e for a in it) for e in expected)  # expected is a subsequence

        await wait_for(ok, f"{kind} {name} {expected} (seen {self.actions(kind, name)})")


@contextlib.asynccontextmanager
async def collecting(source: KubernetesSource) -> AsyncIterator[Collector]:
    col = Collector(source)
    async with anyio.create_task_group() as tg:
        tg.start_soon(col._consume)
        try:
            yield col
        finally:
            tg.cancel_scope.cancel()


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}


def podgroup(name: str, ns: str, queue_name: str, min_member: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"queue": queue_name, "minMember": min_member}}


async def test_source_lists_then_watches_added_modified_deleted_of_every_kind(k8s: K8s) -> None:
    ns = k8s.namespace()
    tag = uuid.uuid4().hex[:8]
    pre = k8s.gpu_node(f"pre-{tag}", gpus=8)["metadata"]["name"]  # exists before the LIST
    async with k8s.client() as api:
        source = KubernetesSource(api, kinds=ALL_KINDS)
        listed = await source.list_objects()
        assert any(c.kind == "Node" and c.obj["metadata"]["name"] == pre for c in listed)  # type: ignore[index]
        assert all(c.obj.get("kind") == c.kind and c.obj.get("apiVersion") for c in listed)
        assert set(source.resource_versions()) == set(ALL_KINDS)

        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        sched = client.SchedulingV1Api(api)
        async with collecting(source) as col:
            # ADDED
            pc, q, node, pg, pod = f"pc-{tag}", f"q-{tag}", f"n-{tag}", f"pg-{tag}", f"pod-{tag}"
            topo = f"topo-{tag}"
            assert (await raw(await sched.create_priority_class(
                priority_class(pc, 77), _preload_content=False)))[0] == 201
            assert (await raw(await custom.create_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", queue(q), _preload_content=False)))[0] == 201
            assert (await raw(await custom.create_cluster_custom_object(
                "kai.scheduler", "v1alpha1", "topologies",
                {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
                 "metadata": {"name": topo}, "spec": {"levels": [{"nodeLabel": "zone"}]}},
                _preload_content=False)))[0] == 201
            k8s.gpu_node(node, gpus=4)
            assert (await raw(await custom.create_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", podgroup(pg, ns, q, 2),
                _preload_content=False)))[0] == 201
            await create_pod(api, gpu_pod(pod, ns, queue=q, annotations={"pod-group-name": pg}))
            for kind, name in (("PriorityClass", pc), ("Queue", q), ("Topology", topo),
                               ("Node", node), ("PodGroup", pg), ("Pod", pod)):
                await col.wait_actions(kind, name, "ADDED")
            added = next(c for c in col.items if isinstance(c, ObjectChange)
                         and c.kind == "PodGroup" and c.obj["metadata"]["name"] == pg)  # type: ignore[index]
            assert added.obj["spec"]["minMember"] == 2 and added.obj["kind"] == "PodGroup"  # type: ignore[index]

            # MODIFIED
            label = {"metadata": {"labels": {"touched": "yes"}}}
            await raw(await sched.patch_priority_class(pc, label, _preload_content=False,
                                                       _content_type=MERGE))
            await raw(await custom.patch_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", q, {"spec": {"priority": 7}},
                _preload_content=False, _content_type=MERGE))
            await raw(await custom.patch_cluster_custom_object(
                "kai.scheduler", "v1alpha1", "topologies", topo, label,
                _preload_content=False, _content_type=MERGE))
            await raw(await core.patch_node(node, {"spec": {"unschedulable": True}},
                                            _preload_content=False, _content_type=MERGE))
            await raw(await custom.patch_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", pg, {"spec": {"minMember": 1}},
                _preload_content=False, _content_type=MERGE))
            await raw(await core.patch_namespaced_pod(pod, ns, label, _preload_content=False,
                                                      _content_type=MERGE))
            for kind, name in (("PriorityClass", pc), ("Queue", q), ("Topology", topo),
                               ("Node", node), ("PodGroup", pg), ("Pod", pod)):
                await col.wait_actions(kind, name, "ADDED", "MODIFIED")

            # DELETED
            await raw(await sched.delete_priority_class(pc, _preload_content=False))
            await raw(await custom.delete_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", q, _preload_content=False))
            await raw(await custom.delete_cluster_custom_object(
                "kai.scheduler", "v1alpha1", "topologies", topo, _preload_content=False))
            await raw(await core.delete_node(node, _preload_content=False))
            await raw(await custom.delete_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", pg, _preload_content=False))
            await raw(await core.delete_namespaced_pod(pod, ns, grace_period_seconds=0,
                                                       _preload_content=False))
            for kind, name in (("PriorityClass", pc), ("Queue", q), ("Topology", topo),
                               ("Node", node), ("PodGroup", pg), ("Pod", pod)):
                await col.wait_actions(kind, name, "ADDED", "MODIFIED", "DELETED")
        assert not any(isinstance(c, Relist) for c in col.items)  # nothing forced a relist
        assert source.relists == {k: 0 for k in ALL_KINDS}


def _pod_names(state: Any, ns: str) -> list[str]:
    return sorted(k.split("/", 1)[1] for k in state.pods if k.startswith(f"{ns}/"))


async def test_410_after_apiserver_restart_relists_that_kind_and_drops_what_vanished(k8s: K8s) -> None:
    """An informer stops; meanwhile a pod is deleted and another created and the apiserver
    restarts (its watch cache forgets the old resourceVersions). Resuming from the stored
    versions gets 410 Gone: the source relists, the informer brackets the relist with resync
    markers, and the folded state loses the deleted pod."""
    ns = k8s.namespace()
    log = MemoryEventLog()
    async with k8s.client() as api:
        for name in ("keep", "gone"):
            await create_pod(api, gpu_pod(name, ns))
        source = KubernetesSource(api)
        informer = InformerService(log, source, SystemClock(), RandomIds())

        async def folded_pods() -> list[str]:
            return _pod_names(fold([r async for r in log.read()]), ns)

        async with anyio.create_task_group() as tg:
            tg.start_soon(informer.run)
            await wait_for(lambda: _eq(folded_pods(), ["gone", "keep"]), "both pods observed")
            tg.cancel_scope.cancel()
        versions = source.resource_versions()

        core = client.CoreV1Api(api)
        status, _ = await raw(await core.delete_namespaced_pod("gone", ns, grace_period_seconds=0,
                                                               _preload_content=False))
        assert status == 200
        await create_pod(api, gpu_pod("new", ns))
    k8s.cp.restart_apiserver()

    async with k8s.client() as api:
        resumed = KubernetesSource(api, resume_from=versions)
        informer.source = resumed
        async with anyio.create_task_group() as tg:
            tg.start_soon(informer.follow)
            await wait_for(lambda: _eq(folded_pods(), ["keep", "new"]), "relisted pods")
            tg.cancel_scope.cancel()
    assert resumed.relists["Pod"] == 1, resumed.relists
    records = [r async for r in log.read()]
    # the Pod relist is bracketed: ResyncStarted(Pod) ... ResyncCompleted(Pod), pods only inside
    starts = [i for i, r in enumerate(records)
              if isinstance(r.envelope.data, p.ResyncStarted) and r.envelope.data.kind == "Pod"]
    assert len(starts) == 2  # the informer's first resync, then the 410 relist
    inside = []
    for r in records[starts[1] + 1:]:
        if isinstance(r.envelope.data, p.ResyncCompleted) and r.envelope.data.kind == "Pod":
            break
        inside.append(r.envelope.data)
    else:
        raise AssertionError("the Pod relist was never completed")
    assert inside and all(isinstance(d, p.PodObserved) for d in inside)
    assert {d.name for d in inside if d.namespace == ns} == {"keep", "new"}
    assert not any(isinstance(r.envelope.data, p.PodRemoved) and r.envelope.data.name == "gone"
                   for r in records)  # it left the state through the relist, not a DELETED


async def _eq(coro: Any, expected: Any) -> bool:
    return bool(await coro == expected)


async def test_watch_cut_mid_stream_resumes_and_state_matches_the_api(k8s: K8s) -> None:
    """The apiserver restarts under running watches: each watch ends with a connection error,
    is resumed (and relisted on 410), and later changes still arrive."""
    ns = k8s.namespace()
    log = MemoryEventLog()
    async with k8s.client() as api:
        await create_pod(api, gpu_pod("before", ns))
        source = KubernetesSource(api, backoff_cap_s=0.5)
        informer = InformerService(log, source, SystemClock(), RandomIds())

        async def folded_pods() -> list[str]:
            return _pod_names(fold([r async for r in log.read()]), ns)

        async with anyio.create_task_group() as tg:
            tg.start_soon(informer.run)
            await wait_for(lambda: _eq(folded_pods(), ["before"]), "the first pod")
            await anyio.to_thread.run_sync(k8s.cp.restart_apiserver)
            await create_pod(api, gpu_pod("after", ns))
            await wait_for(lambda: _eq(folded_pods(), ["after", "before"]), "the pod made after",
                           timeout_s=30)
            tg.cancel_scope.cancel()
    assert source.watch_errors["Pod"] >= 1, source.watch_errors


async def test_changes_that_do_not_matter_to_scheduling_are_dropped(k8s: K8s) -> None:
    """A node annotation or status heartbeat changes nothing kai-es reads: the watch reports it,
    the informer drops it. A label change is observed."""
    node = k8s.gpu_node(gpus=8)["metadata"]["name"]
    log = MemoryEventLog()
    async with k8s.client() as api:
        source = KubernetesSource(api, kinds=("Node",))
        informer = InformerService(log, source, SystemClock(), RandomIds())
        core = client.CoreV1Api(api)

        async def node_events() -> list[p.NodeObserved]:
            return [r.envelope.data async for r in log.read()
                    if isinstance(r.envelope.data, p.NodeObserved) and r.envelope.data.name == node]

        async with anyio.create_task_group() as tg:
            tg.start_soon(informer.run)
            await wait_for(lambda: _len_is(node_events(), 1), "the node observed once")
            dropped = informer.dropped
            await raw(await core.patch_node(node, {"metadata": {"annotations": {"noise": "1"}}},
                                            _preload_content=False, _content_type=MERGE))
            await raw(await core.patch_node_status(
                node, {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                  "reason": "KubeletReady", "message": "beat",
                                                  "lastHeartbeatTime": "2030-01-01T00:00:00Z"}]}},
                _preload_content=False, _content_type="application/strategic-merge-patch+json"))
            await wait_for(lambda: _true(informer.dropped >= dropped + 2), "two dropped changes")
            await raw(await core.patch_node(node, {"metadata": {"labels": {"zone": "b"}}},
                                            _preload_content=False, _content_type=MERGE))
            await wait_for(lambda: _len_is(node_events(), 2), "the label change observed")
            tg.cancel_scope.cancel()
        events = await node_events()
        assert events[-1].labels["zone"] == "b"


async def _len_is(coro: Any, n: int) -> bool:
    return len(await coro) == n


async def _true(value: bool) -> bool:
    return value
