"""Active/standby replicas (`--leader-elect`) on the real apiserver, as the least-privilege
identity (deploy/rbac/, including leader-election-role.yaml): of two binders one leads and
binds, the other stands by (and is ready); when the leader is killed the standby takes the Lease
over and binds what arrives next; a leader whose Lease is taken away stops with one line."""

from __future__ import annotations

import re
import signal
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import anyio
import yaml
from kubernetes_asyncio import client

from tests.k8s.conftest import LEADER_ROLE, K8s
from tests.k8s.helpers import create_pod, create_queue, gpu_pod, raw, wait_for
from tests.processes import Proc

POOL_LABEL = "kai.scheduler/node-pool"
FAST = ["--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s",
        "--leader-elect-retry-period", "500ms"]



async def _lease(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    status, lease = await raw(await client.CoordinationV1Api(api).read_namespaced_lease(
        name, ns, _preload_content=False))
    assert status == 200, lease
    return dict(lease)


async def test_binder_replicas_lead_stand_by_and_take_over(k8s: K8s, scheduler_kubeconfig: Path,
                                                          tmp_path: Path, procs: list[Proc]) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace()
    lease_ns = yaml.safe_load(LEADER_ROLE.read_text())["metadata"]["namespace"]
    lease_name = f"kai-es-binder-{tag}"
    pool = {POOL_LABEL: f"pool-{tag}"}
    for i in range(2):
        k8s.gpu_node(f"le-{tag}-{i}", gpus=8, labels=pool)
    log = str(tmp_path / "events.jsonl")
    kube = ["--kubeconfig", str(scheduler_kubeconfig)]
    informer = Proc("informer", ["informer", "--log", log, *kube], tmp_path)
    scheduler = Proc("scheduler", ["scheduler", "--log", log, "--period", "100ms"], tmp_path)
    binders = [Proc(f"binder-{who}", ["binder", "--log", log, *kube, "--leader-elect",
                                      "--leader-elect-lease", f"{lease_ns}/{lease_name}",
                                      "--leader-elect-identity", f"binder-{who}", *FAST,
                                      "--http-bind-address", "127.0.0.1:0"], tmp_path)
               for who in ("a", "b")]
    first, second = binders
    procs += [informer, scheduler, *binders]

    async with k8s.client() as api:
        qname = f"q-{tag}"
        await create_queue(api, qname)
        created: list[str] = []

        async def submit(prefix: str, count: int) -> None:
            for i in range(count):
                await create_pod(api, gpu_pod(f"{prefix}-{i}", ns, queue=qname, labels=pool))
                created.append(f"{prefix}-{i}")

        async def all_running() -> bool:
            st, body = await raw(await client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False))
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in body["items"]}
            return all(phases.get(name) == "Running" for name in created)

        informer.start()
        informer.wait_ready("informer")
        scheduler.start()
        scheduler.wait_ready("scheduler")
        first.start()
        first.wait_ready("binder")  # only a leader reads the log and says it is ready
        assert f"leading: acquired Lease {lease_ns}/{lease_name} as binder-a" in first.stderr()
        second.start()
        second.wait_output("standing by: Lease")
        assert "binder ready" not in second.stderr()
        served = re.search(r"on (http://\S+)", second.stderr())
        assert served, second.stderr()
        with urllib.request.urlopen(served.group(1) + "/readyz", timeout=5) as resp:  # a standby is ready
            assert resp.read().decode().startswith(f"standing by: Lease {lease_ns}/{lease_name} is held by binder-a")
        assert (await _lease(api, lease_ns, lease_name))["spec"]["holderIdentity"] == "binder-a"
        await submit("a", 4)
        await wait_for(all_running, "pods bound by the leader", timeout_s=60)

        first.kill9()
        await submit("b", 4)
        second.wait_ready("binder", timeout=30)  # the Lease expired: the standby leads
        await wait_for(all_running, "pods bound by the replica that took over", timeout_s=60)
        lease = await _lease(api, lease_ns, lease_name)
        assert lease["spec"]["holderIdentity"] == "binder-b"
        assert lease["spec"]["leaseTransitions"] >= 1

        # the Lease is taken away (another holder renews it): the leader stops, exit 2, one line
        lease["spec"]["holderIdentity"] = "someone-else"
        status, doc = await raw(await client.CoordinationV1Api(api).replace_namespaced_lease(
            lease_name, lease_ns, lease, _preload_content=False))
        assert status == 200, doc
        assert second.popen is not None
        with anyio.fail_after(30):
            while second.popen.poll() is None:
                await anyio.sleep(0.2)
        lines = [line for line in second.stderr().splitlines() if line.strip()]
        assert second.popen.returncode == 2, second.stderr()[-2000:]
        assert lines[-1].startswith("error: lost the leader Lease") and "someone-else" in lines[-1], lines[-3:]


async def test_sigterm_hands_the_lease_over_at_once(k8s: K8s, scheduler_kubeconfig: Path,
                                                    tmp_path: Path, procs: list[Proc]) -> None:
    """Kubernetes stops a pod with SIGTERM: the leader stops cleanly (exit 0, one line) and
    hands the Lease back, so the standby leads within seconds, not after the 30 s lease."""
    lease_ns = yaml.safe_load(LEADER_ROLE.read_text())["metadata"]["namespace"]
    lease = f"{lease_ns}/kai-es-binder-{uuid.uuid4().hex[:8]}"
    log = str(tmp_path / "events.jsonl")
    slow = ["--leader-elect-lease-duration", "30s", "--leader-elect-renew-deadline", "20s",
            "--leader-elect-retry-period", "500ms"]
    first, second = (Proc(f"binder-{who}", ["binder", "--log", log, "--kubeconfig", str(scheduler_kubeconfig),
                                            "--leader-elect", "--leader-elect-lease", lease, *slow], tmp_path)
                     for who in ("a", "b"))
    procs += [first, second]
    first.start()
    first.wait_ready("binder")
    second.start()
    second.wait_output("standing by: Lease")
    assert first.popen is not None
    first.popen.send_signal(signal.SIGTERM)
    assert first.popen.wait(15) == 0, first.stderr()[-2000:]
    assert first.stderr().rstrip().splitlines()[-1] == "binder: stopped by SIGTERM"
    t = time.monotonic()
    second.wait_ready("binder", timeout=30)
    assert time.monotonic() - t < 10, "the standby waited for the lease to expire"
