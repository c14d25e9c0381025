"""The cluster says no, for real.

- A ValidatingAdmissionPolicy denies every binding of one pod: kai-es's binder reports each
  refusal, the scheduler backs off, the fifth failure is final and the pod is never picked
  again — while the other pods of the same queue are bound and run.
- A PodDisruptionBudget refuses the eviction of a victim kai-es chose: the binder retries, then
  records PodEvictionFailed — never PodEvicted — and the victim keeps running.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import load_packer
from kai_es.services.binder import MAX_BIND_FAILURES
from tests.k8s.conftest import K8s
from tests.k8s.helpers import binding, create_pod, disruption_budget, get_pod, gpu_pod, queue, raw, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"


def _deny_binding_policy(name: str, namespace: str, prefix: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["pods/binding"]}]},
                 "validations": [{"expression": f"!object.metadata.name.startsWith('{prefix}')",
                                  "message": "binding denied by the test's admission policy"}]},
    }
    policy_binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }  # fmt: skip
    return policy, policy_binding


async def test_a_pod_whose_bind_is_always_denied_ends_final_and_starves_nobody(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = {POOL_LABEL: f"pool-{tag}"}
    k8s.gpu_node(f"n-{tag}", gpus=8, labels=pool)
    qname = f"q-{tag}"
    policy, policy_binding = _deny_binding_policy(f"deny-stuck-{tag}", ns, "stuck")
    k8s.cp.call("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", policy)
    k8s.cp.call("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                policy_binding)
    log = MemoryEventLog()
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        core = client.CoreV1Api(api)
        # the policy takes effect asynchronously: probe it with the binding of a pod that does
        # not exist (admission answers before the pod is looked up: 404 means not yet in force)
        async def denied() -> bool:
            status, _ = await raw(await core.create_namespaced_pod_binding(
                "stuck-probe", ns, binding("stuck-probe", ns, "", f"n-{tag}"),  # type: ignore[arg-type]
                _preload_content=False))
            assert status in (404, 403, 422), status
            return status != 404

        await wait_for(denied, "the admission policy in force", timeout_s=30)
        status, _ = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(qname), _preload_content=False))
        assert status == 201
        # the stuck pod is first in line (older); the others arrive after it
        await create_pod(api, gpu_pod("stuck", ns, gpus=1, queue=qname, labels=pool))
        await anyio.sleep(1.1)
        for i in range(3):
            await create_pod(api, gpu_pod(f"ok-{i}", ns, gpus=2, queue=qname, labels=pool))

        async def others_running() -> bool:
            for i in range(3):
                status, pod = await get_pod(api, ns, f"ok-{i}")
                if status != 200 or pod["status"].get("phase") != "Running":
                    return False
            return True

        async def final_failure() -> bool:
            return any([isinstance(r.envelope.data, p.PodBindFailed) and r.envelope.data.name == "stuck"
                        and r.envelope.data.final async for r in log.read()])

        async with services_running(log, kai_api):
            await wait_for(others_running, "the other pods Running", timeout_s=30)
            await wait_for(final_failure, "the stuck pod's final bind failure", timeout_s=60)
            await anyio.sleep(2.0)  # cycles after the final failure
        status, stuck = await get_pod(api, ns, "stuck")
        assert status == 200 and not stuck["spec"].get("nodeName")
    records = [r async for r in log.read()]
    failures = [r.envelope.data for r in records
                if isinstance(r.envelope.data, p.PodBindFailed) and r.envelope.data.name == "stuck"]
    assert [f.final for f in failures] == [False] * (MAX_BIND_FAILURES - 1) + [True]
    assert all("binding denied by the test's admission policy" in f.message for f in failures), failures[0]
    decided = [r.position for r in records
               if isinstance(r.envelope.data, p.BindingDecided) and r.envelope.data.name == "stuck"]
    final_at = next(r.position for r in records if r.envelope.data is failures[-1])
    assert len(decided) == MAX_BIND_FAILURES and max(decided) < final_at  # never re-picked
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence


def _priority_class(name: str, value: int) -> dict:  # type: ignore[type-arg]
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}


async def test_an_eviction_a_disruption_budget_refuses_is_reported_not_recorded_as_done(
        k8s: K8s, scheduler_kubeconfig: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    pool = {POOL_LABEL: f"pool-{tag}"}
    node = k8s.gpu_node(f"n-{tag}", gpus=8, labels=pool)["metadata"]["name"]
    qname, low, high = f"q-{tag}", f"low-{tag}", f"high-{tag}"
    for name, value in ((low, 40), (high, 150)):
        k8s.cp.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", _priority_class(name, value))
    log = MemoryEventLog()
    config = SchedulerConfig(actions=["allocate", "preempt"])
    async with k8s.client() as api, k8s.client(scheduler_kubeconfig) as kai_api:
        status, _ = await raw(await client.CustomObjectsApi(api).create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", queue(qname), _preload_content=False))
        assert status == 201
        victim = gpu_pod("victim", ns, gpus=8, queue=qname, labels={**pool, "app": "guarded"})
        victim["spec"]["priorityClassName"] = low
        await create_pod(api, victim)
        await disruption_budget(api, ns, {"app": "guarded"})

        async def victim_running() -> bool:
            status, pod = await get_pod(api, ns, "victim")
            return status == 200 and pod["status"].get("phase") == "Running"

        async def eviction_failed() -> bool:
            return any([isinstance(r.envelope.data, p.PodEvictionFailed) and r.envelope.data.name == "victim"
                        async for r in log.read()])

        async with services_running(log, kai_api, config):
            await wait_for(victim_running, "the victim Running", timeout_s=30)
            urgent = gpu_pod("urgent", ns, gpus=8, queue=qname, labels=pool)
            urgent["spec"]["priorityClassName"] = high
            await create_pod(api, urgent)
            await wait_for(eviction_failed, "the refused eviction reported", timeout_s=60)
        status, still = await get_pod(api, ns, "victim")
        assert status == 200 and not still["metadata"].get("deletionTimestamp")
        assert still["spec"]["nodeName"] == node and still["status"]["phase"] == "Running"
    records = [r async for r in log.read()]
    decided = [r.envelope for r in records if isinstance(r.envelope.data, p.EvictionDecided)]
    assert decided and all(e.data.name == "victim" and e.data.action == "preempt" for e in decided)
    failed = [r.envelope.data for r in records if isinstance(r.envelope.data, p.PodEvictionFailed)]
    assert failed[0].retryable and "disruption budget" in failed[0].message.lower()
    assert not any(isinstance(r.envelope.data, p.PodEvicted) for r in records)
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence

