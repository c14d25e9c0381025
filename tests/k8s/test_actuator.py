"""KubernetesActuator against the real apiserver: binds (with uid precondition and idempotency)
and evictions (Eviction API), and bounded retries when the apiserver cannot be reached."""

from __future__ import annotations

import time


from kai_es.adapters.kubernetes.actuator import KubernetesActuator
from tests.k8s.conftest import K8s, cp_mod
from tests.k8s.helpers import create_pod, disruption_budget, get_pod, gpu_pod, wait_for, wait_pod_phase


async def test_bind_runs_the_pod_and_a_repeated_bind_is_already_done(k8s: K8s) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=8)["metadata"]["name"]
    other = k8s.gpu_node(gpus=8)["metadata"]["name"]
    async with k8s.client() as api:
        pod = await create_pod(api, gpu_pod("p", ns, gpus=2))
        uid = pod["metadata"]["uid"]
        act = KubernetesActuator(api)
        first = await act.bind(ns, "p", uid, node, [], [])
        assert first.ok and not first.already, first
        running = await wait_pod_phase(api, ns, "p", "Running")
        assert running["spec"]["nodeName"] == node

        again = await act.bind(ns, "p", uid, node, [], [])  # a replayed decision
        assert again.ok and again.already, again

        elsewhere = await act.bind(ns, "p", uid, other, [], [])
        assert not elsewhere.ok and node in elsewhere.message, elsewhere


async def test_bind_fails_for_a_missing_pod_or_a_recreated_one(k8s: K8s) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=8)["metadata"]["name"]
    async with k8s.client() as api:
        act = KubernetesActuator(api)
        missing = await act.bind(ns, "nobody", "00000000-0000-0000-0000-000000000000", node, [], [])
        assert not missing.ok and "not found" in missing.message, missing

        await create_pod(api, gpu_pod("p", ns))
        stale = await act.bind(ns, "p", "11111111-1111-1111-1111-111111111111", node, [], [])
        assert not stale.ok and "re-created" in stale.message, stale
        status, pod = await get_pod(api, ns, "p")
        assert status == 200 and not pod["spec"].get("nodeName")  # the uid precondition held


async def test_evict_a_running_pod_and_a_missing_pod_counts_as_done(k8s: K8s) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=8)["metadata"]["name"]
    async with k8s.client() as api:
        pod = await create_pod(api, gpu_pod("victim", ns))
        act = KubernetesActuator(api)
        assert (await act.bind(ns, "victim", pod["metadata"]["uid"], node, [], [])).ok
        await wait_pod_phase(api, ns, "victim", "Running")

        out = await act.evict(ns, "victim", pod["metadata"]["uid"])
        assert out.ok and not out.already, out

        async def gone() -> bool:
            status, _ = await get_pod(api, ns, "victim")
            return status == 404

        await wait_for(gone, "the evicted pod to be deleted")  # KWOK finishes the deletion
        again = await act.evict(ns, "victim", pod["metadata"]["uid"])
        assert again.ok and again.already, again
        never = await act.evict(ns, "never-existed", "")
        assert never.ok and never.already, never


async def test_evict_refused_by_a_disruption_budget_is_a_failure(k8s: K8s) -> None:
    ns = k8s.namespace()
    node = k8s.gpu_node(gpus=8)["metadata"]["name"]
    async with k8s.client() as api:
        pod = await create_pod(api, gpu_pod("guarded", ns, labels={"app": "guarded"}))
        act = KubernetesActuator(api)
        assert (await act.bind(ns, "guarded", pod["metadata"]["uid"], node, [], [])).ok
        await disruption_budget(api, ns, {"app": "guarded"})
        refused = await act.evict(ns, "guarded", pod["metadata"]["uid"])
        assert not refused.ok and "disruption budget" in refused.message.lower(), refused
        assert refused.retryable  # a budget may allow it later: the binder retries, then reports
        status, still = await get_pod(api, ns, "guarded")
        assert status == 200 and not still["metadata"].get("deletionTimestamp")


async def test_unreachable_apiserver_is_retried_a_bounded_number_of_times(k8s: K8s) -> None:
    async with k8s.client() as api:
        api.configuration.host = f"https://127.0.0.1:{cp_mod.free_port()}"  # nobody listens
        act = KubernetesActuator(api, max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
        t0 = time.monotonic()
        out = await act.bind("default", "p", "", "n", [], [])
        assert not out.ok and "gave up after 3 attempts" in out.message, out
        assert act.retries == 2
        out = await act.evict("default", "p", "")
        assert not out.ok and "gave up after 3 attempts" in out.message, out
        assert time.monotonic() - t0 < 10
