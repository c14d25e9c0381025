"""Status back to Kubernetes against the real apiserver, written by the binder-side StatusWriter
as kai-es's least-privilege identity: Events (Scheduled, FailedScheduling, Preempted), the
PodScheduled=False condition, PodGroup scheduling conditions, Queue status; deduplicated and
replay-safe."""

from __future__ import annotations

import re

import uuid
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.status import StatusWriter
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from tests.k8s.conftest import K8s
from tests.k8s.helpers import (create_pod, create_podgroup, create_queue, get_pod, gpu_pod, pool_node, raw,
                               running_on, services_running, wait_for)

POOL_LABEL = "kai.scheduler/node-pool"


async def pod_events(api: client.ApiClient, ns: str, pod: str) -> list[dict[str, Any]]:
    status, out = await raw(await client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pod}", _preload_content=False))
    assert status == 200, out
    return list(out["items"])


def record(position: int, payload: p.Payload, logicaltime: int = 1_700_000_000_000_000_000) -> Record:
    env = make_envelope(payload, event_id=str(uuid.uuid4()), source="test", subject="pod/x",
                        logicaltime=logicaltime)
    return Record(position, env)


async def test_scheduling_outcomes_reach_pods_podgroups_and_queues(k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    k8s.gpu_node(f"n-{tag}", gpus=8, labels={POOL_LABEL: pool})
    qname = f"q-{tag}"
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        custom = client.CustomObjectsApi(api)
        await create_queue(api, qname)
        await create_podgroup(api, ns, "big", qname, 2)
        labels = {POOL_LABEL: pool}
        for i in range(2):
            await create_pod(api, gpu_pod(f"big-{i}", ns, gpus=6, queue=qname, labels=labels,
                                          annotations={"pod-group-name": "big"}))
        await create_pod(api, gpu_pod("fits", ns, gpus=2, queue=qname, labels=labels))


        async def scheduled_event() -> bool:
            return any(e["reason"] == "Scheduled" for e in await pod_events(api, ns, "fits"))

        async def failed_event() -> list[dict[str, Any]] | None:
            events = [e for e in await pod_events(api, ns, "big-0") if e["reason"] == "FailedScheduling"]
            return events or None

        async def pod_condition() -> dict[str, Any] | None:
            _, pod = await get_pod(api, ns, "big-0")
            return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)

        async def group_condition() -> list[dict[str, Any]] | None:
            _, pg = await raw(await custom.get_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", "big", _preload_content=False))
            return (pg.get("status") or {}).get("schedulingConditions") or None

        async def queue_status() -> dict[str, Any] | None:
            _, q = await raw(await custom.get_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", qname, _preload_content=False))
            st = q.get("status") or {}
            return st if (st.get("allocated") or {}).get("gpu") == "2000m" else None

        async with services_running(log, kai_api, grouping=True,
                                    followers=[StatusWriter(kai_api, queue_interval_s=0.1)]):
            await wait_for(scheduled_event, "a Scheduled event on the bound pod", timeout_s=30)
            events = await wait_for(failed_event, "a FailedScheduling event on the gang's pod", timeout_s=30)
            condition = await wait_for(pod_condition, "PodScheduled on the pending pod")
            conditions = await wait_for(group_condition, "the PodGroup's scheduling condition")
            qstatus = await wait_for(queue_status, "the queue's status", timeout_s=30)
            # the verdict may change while the pods arrive and `fits` binds (each change is one
            # Event); once it holds, dozens of cycles with the gang still pending add none
            await anyio.sleep(1.0)
            settled = [e for e in await pod_events(api, ns, "big-0") if e["reason"] == "FailedScheduling"]
            condition = await wait_for(pod_condition, "PodScheduled on the pending pod")
            conditions = await wait_for(group_condition, "the PodGroup's scheduling condition")
            await anyio.sleep(2.0)
            again = [e for e in await pod_events(api, ns, "big-0") if e["reason"] == "FailedScheduling"]

    assert events and events[0]["type"] == "Warning" and events[0]["message"], events
    message = condition["message"]  # the verdict in force: the last Event's
    assert message in {e["message"] for e in settled}, (message, settled)
    assert len(again) == len(settled) and all(e.get("count", 1) == 1 for e in again), again  # not one per cycle
    assert (condition["status"], condition["reason"], condition["message"]) == ("False", "Unschedulable", message)
    assert conditions[0]["type"] == "UnschedulableOnNodePool" and conditions[0]["status"] == "True"
    # the group's condition leads with its place in the queue (the gang is the queue's one waiting job)
    # (and in the cluster-wide order: other tests' waiting jobs of this apiserver count there)
    assert re.fullmatch(rf"#1 of 1 in queue {re.escape(qname)}, #[0-9]+ of [0-9]+ in the cluster: "
                        rf"{re.escape(message)}", conditions[0]["message"]), conditions
    assert conditions[0]["reasons"][0]["reason"]
    assert qstatus["requested"]["gpu"] == "14000m"  # 2 running + 12 pending
    assert qstatus["fairShare"]["gpu"].endswith("m")
    unschedulable = [r.envelope.data for r in [r async for r in log.read()]
                     if isinstance(r.envelope.data, p.PodUnschedulable) and r.envelope.data.name == "big-0"]
    assert unschedulable and unschedulable[-1].reasons  # the words come from the structured reasons


async def test_repeated_verdicts_write_once_and_a_replay_writes_nothing_new(k8s: K8s, scheduler_kubeconfig: Path) -> None:
    ns = k8s.namespace()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        pod = await create_pod(api, gpu_pod("waits", ns))
        victim = await create_pod(api, gpu_pod("victim", ns))
        uid, vuid = pod["metadata"]["uid"], victim["metadata"]["uid"]
        verdict = [p.Reason(code="NotEnoughGPUs", message="0/3 nodes have 8 free GPUs", numbers={"requested": 8})]
        records = [record(i, p.PodUnschedulable(namespace=ns, name="waits", uid=uid, podgroup="", queue="q",
                                                reasons=verdict)) for i in range(1000)]
        decision = record(1000, p.EvictionDecided(namespace=ns, name="victim", uid=vuid, node="n", podgroup="g",
                                                  queue="q", action="preempt", reason="priority",
                                                  preemptor=f"{ns}/waits"))
        records += [decision, record(1001, p.PodEvicted(namespace=ns, name="victim", uid=vuid, node="n",
                                                        decision_id=decision.envelope.id))]
        for run in range(2):  # the second writer replays the same log
            writer = StatusWriter(kai_api, queue_status=False)
            for r in records:
                writer.observe(r)
            await writer.flush()
            assert writer.skipped_duplicates == 999
            failed = [e for e in await pod_events(api, ns, "waits") if e["reason"] == "FailedScheduling"]
            assert len(failed) == 1 and failed[0]["message"] == "0/3 nodes have 8 free GPUs", failed
            preempted = [e for e in await pod_events(api, ns, "victim") if e["reason"] == "Preempted"]
            assert len(preempted) == 1 and f"{ns}/waits" in preempted[0]["message"], preempted
            assert writer.writes == (3 if run == 0 else 1)  # the replay re-patches only the condition


async def test_a_podgroup_condition_tells_its_place_in_the_queue_and_kubectl_wide_shows_it(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    """Three gangs wait in one queue: each PodGroup's condition says #n of 3 (n = 1, 2, 3, in the
    order kai-es takes them), the `-o wide` column of kai-es's CRD shows it (the Table the
    apiserver serves kubectl), and when the first leaves the others move up."""
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = f"pool-{tag}"
    k8s.gpu_node(f"n-{tag}", gpus=4, labels={POOL_LABEL: pool})
    qname = f"q-{tag}"
    groups = ["a", "b", "c"]
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        custom = client.CustomObjectsApi(api)
        await create_queue(api, qname)
        for g in groups:
            await create_podgroup(api, ns, g, qname, 1)
            await create_pod(api, gpu_pod(f"{g}-0", ns, gpus=8, queue=qname, labels={POOL_LABEL: pool},
                                          annotations={"pod-group-name": g}))

        async def messages() -> dict[str, str]:
            out = {}
            for g in groups:
                status, pg = await raw(await custom.get_namespaced_custom_object(
                    "scheduling.run.ai", "v2alpha2", ns, "podgroups", g, _preload_content=False))
                if status == 200:
                    out[g] = ((pg.get("status") or {}).get("schedulingConditions") or [{}])[0].get("message", "")
            return out

        def places(of: int, got: dict[str, str]) -> dict[str, int] | None:
            found = {}
            for g, m in got.items():
                head = m.split(":", 1)[0].split(", ")[0]
                for n in range(1, of + 1):
                    if head == f"#{n} of {of} in queue {qname}":
                        found[g] = n
            return found if sorted(found.values()) == list(range(1, of + 1)) else None

        async def all_three() -> dict[str, int] | None:
            return places(3, await messages())

        log = MemoryEventLog()
        async with services_running(log, kai_api, grouping=True,
                                    followers=[StatusWriter(kai_api, queue_interval_s=0.1,
                                                            position_interval_s=0.1)]):
            first = await wait_for(all_three, "#1, #2 and #3 of 3 on the three PodGroups", timeout_s=30)
            status, table = await raw(await api.call_api(
                f"/apis/scheduling.run.ai/v2alpha2/namespaces/{ns}/podgroups", "GET",
                header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, auth_settings=["BearerToken"],
                _preload_content=False))
            assert status == 200, table
            names = [c["name"] for c in table["columnDefinitions"]]
            column = names.index("Waiting")
            assert table["columnDefinitions"][column]["priority"] == 1  # shown by -o wide
            wide = {row["object"]["metadata"]["name"]: row["cells"][column] for row in table["rows"]}
            assert {g: wide[g].split(":", 1)[0].split(", ")[0] for g in groups} == \
                {g: f"#{n} of 3 in queue {qname}" for g, n in first.items()}, wide
            ahead = min(first, key=first.__getitem__)
            await raw(await client.CoreV1Api(api).delete_namespaced_pod(f"{ahead}-0", ns, grace_period_seconds=0,
                                                                         _preload_content=False))
            await raw(await custom.delete_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", ahead, _preload_content=False))
            rest = [g for g in groups if g != ahead]

            async def two_left() -> dict[str, int] | None:
                got = await messages()
                return places(2, {g: got[g] for g in rest if g in got})

            moved = await wait_for(two_left, "the two others at #1 and #2 of 2", timeout_s=30)
    assert sorted(rest, key=moved.__getitem__) == sorted(rest, key=first.__getitem__)  # same order, moved up
    verdicts = [r for r in [r async for r in log.read()] if isinstance(r.envelope.data, p.PodUnschedulable)]
    assert verdicts  # the verdicts the conditions carry came from the log


async def test_a_gang_not_ready_gets_a_not_ready_event_and_no_unschedulable_verdict(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    """KAI's status updater for a job not ready for scheduling (kai-es/v14): a NotReady Event
    saying how many pods it waits for, and no unschedulable verdict — no FailedScheduling, no
    PodScheduled=False on its pods, no PodGroup scheduling condition — so an autoscaler does not
    provision for a gang that cannot start. A PodGroup of minMember 2: one pod, one gated; once the
    gate is removed, both run."""
    ns = k8s.namespace()
    pool = pool_node(k8s)
    node, qname, labels = pool.node, pool.queue, pool.labels
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        custom = client.CustomObjectsApi(api)
        await create_queue(api, qname)
        await create_podgroup(api, ns, "gang", qname, 2)
        await create_pod(api, gpu_pod("gang-0", ns, gpus=2, queue=qname, labels=labels,
                                      annotations={"pod-group-name": "gang"}))
        held = gpu_pod("gang-1", ns, gpus=2, queue=qname, labels=labels, annotations={"pod-group-name": "gang"})
        held["spec"]["schedulingGates"] = [{"name": "example.com/admission"}]
        await create_pod(api, held)

        async def not_ready() -> list[dict[str, Any]] | None:
            return [e for e in await pod_events(api, ns, "gang-0") if e["reason"] == "NotReady"] or None

        async with services_running(log, kai_api, grouping=True,
                                    followers=[StatusWriter(kai_api, queue_interval_s=0.1)]):
            events = await wait_for(not_ready, "a NotReady event on the gang's pod", timeout_s=30)
            await anyio.sleep(1.0)  # more cycles and flushes: still no unschedulable verdict
            failed = [e for e in await pod_events(api, ns, "gang-0") if e["reason"] == "FailedScheduling"]
            _, pod = await get_pod(api, ns, "gang-0")
            _, pg = await raw(await custom.get_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", "gang", _preload_content=False))
            status, out = await raw(await client.CoreV1Api(api).patch_namespaced_pod(
                "gang-1", ns, {"spec": {"schedulingGates": None}}, _preload_content=False,
                _content_type="application/merge-patch+json"))
            assert status == 200, out
            await wait_for(running_on(api, ns, ["gang-0", "gang-1"], node), "the gang Running once ungated",
                           timeout_s=30)
            # the binds' status writes flush after the binds: let them finish before the services
            # stop (a write cancelled mid-request leaves its connection to the garbage collector)
            await anyio.sleep(1.0)

    assert events[0]["type"] == "Normal" and "waiting for 2 pods, 2 exist, 1 gated" in events[0]["message"], events
    assert not failed, failed
    assert not [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"], pod["status"]
    assert not (pg.get("status") or {}).get("schedulingConditions"), pg.get("status")
