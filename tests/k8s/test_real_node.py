"""kai-es schedules onto a real node: a kubelet v1.36.5 with Debian's containerd and runc
(tools/k8s/controlplane.py RealNode), on a control plane of this module's own. A busybox pod
(the image made from busybox-static and imported into containerd: no registry) is bound by
kai-es's binder, run by the kubelet in its kubepods cgroup and CNI bridge network, and runs to
completion; the run's log, Succeeded included, replays exactly.

Needs root and the Debian packages in controlplane.REAL_NODE_PACKAGES (.ci/run installs them);
without them the module's control plane fails to start and the test FAILS, naming what is
missing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import cp_mod, started_control_plane
from tests.k8s.helpers import create_pod, create_queue, get_pod, services_running, wait_for

POOL_LABEL = "kai.scheduler/node-pool"
POOL = "real"


@pytest.fixture(scope="module")
def real_cp() -> Iterator[Any]:
    with started_control_plane(real_node=True, real_node_labels={POOL_LABEL: POOL}) as cp:
        yield cp


async def test_kai_es_binds_a_pod_that_the_kubelet_runs_to_completion(real_cp: Any) -> None:
    from kai_es.adapters.kubernetes.client import api_client

    tag = uuid.uuid4().hex[:8]
    node = real_cp.real_node.name
    qname, ns, name = f"q-{tag}", "default", f"hello-{tag}"
    log = MemoryEventLog()
    api = await api_client(real_cp.kubeconfig)
    try:
        await create_queue(api, qname)
        await create_pod(api, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"kai.scheduler/queue": qname, POOL_LABEL: POOL}},
            "spec": {"schedulerName": "kai-scheduler", "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": cp_mod.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/busybox", "sh", "-c", f"echo {tag} from $(hostname)"],
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})

        async def finished() -> dict[str, Any] | None:
            status, pod = await get_pod(api, ns, name)
            return pod if status == 200 and pod["status"].get("phase") in ("Succeeded", "Failed") else None

        async def succeeded_observed() -> bool:
            return any([isinstance(r.envelope.data, p.PodObserved) and r.envelope.data.name == name
                        and r.envelope.data.phase == "Succeeded" async for r in log.read()])

        async with services_running(log, api, grouping=True):
            pod = await wait_for(finished, f"{name} run to its end on {node}", timeout_s=90)
            await wait_for(succeeded_observed, "the Succeeded phase in the log", timeout_s=30)
    finally:
        await api.close()

    kubelet_log = real_cp.real_node.kubelet.tail(40)
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], kubelet_log)
    assert pod["spec"]["nodeName"] == node
    (state,) = [c["state"] for c in pod["status"]["containerStatuses"]]
    assert state["terminated"]["exitCode"] == 0 and state["terminated"]["containerID"].startswith("containerd://")
    assert pod["status"]["podIP"].startswith("10.88.")  # the CNI bridge's subnet
    (output,) = real_cp.real_node.pod_logs.glob(f"{ns}_{name}_*/main/0.log")
    assert f"stdout F {tag} from {name}" in output.read_text()
    records = [r async for r in log.read()]
    bound = [(d.name, d.node) for d in (r.envelope.data for r in records) if isinstance(d, p.PodBound)]
    assert bound == [(name, node)]
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence
