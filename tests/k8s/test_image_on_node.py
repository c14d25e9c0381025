"""The kai-es image as a pod on the real node: built from this checkout (tools/build_image.py),
imported into the kubelet's containerd (`ctr images import`, no registry), bound by kai-es onto
the real node and started by the kubelet with the chart's security context (non-root 10001, a
read-only root filesystem, every capability dropped, RuntimeDefault seccomp, an emptyDir on /tmp)
and a scenario from a ConfigMap volume. It runs `kai-es cycle` to completion and prints the
decisions this checkout computes for the same scenario, byte for byte once parsed.

Needs root (the image build's chroot, the kubelet) and the packages of .ci/run; without them the
module fails, naming what is missing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from tests.k8s.conftest import started_control_plane
from tests.k8s.helpers import create_pod, create_queue, get_pod, raw, services_running, wait_for

ROOT = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "kai-es" / "values.yaml").read_text())
SCENARIO = ROOT / "tests" / "scenarios" / "fractional-sharing.yaml"
POOL_LABEL = "kai.scheduler/node-pool"
POOL = "real"


@pytest.fixture(scope="module")
def node_with_image(kai_es_image: Any) -> Iterator[tuple[Any, str]]:
    """The real node's control plane with the session's image (tests/conftest.py) imported."""
    with started_control_plane(real_node=True, real_node_labels={POOL_LABEL: POOL}) as cp:
        cp.real_node._ctr("images", "import", str(kai_es_image.archive), timeout=300)  # noqa: SLF001
        listed = cp.real_node._ctr("images", "list", "-q")  # noqa: SLF001
        assert kai_es_image.tag in listed.split(), listed
        yield cp, kai_es_image.tag


def _container_output(log_file: Path) -> str:
    """The container's stdout from the kubelet's CRI log file (`<time> stdout F|P <text>`: P
    lines are parts of one longer line)."""
    out: list[str] = []
    for line in log_file.read_text().splitlines():
        _, stream, tag, text = line.split(" ", 3)
        if stream == "stdout":
            out.append(text if tag == "P" else text + "\n")
    return "".join(out)


async def test_the_image_runs_a_cycle_on_the_real_node_as_the_chart_runs_it(node_with_image: tuple[Any, str],
                                                                         tmp_path: Path) -> None:
    from kai_es.adapters.kubernetes.client import api_client

    cp, image = node_with_image
    tag = uuid.uuid4().hex[:8]
    ns, name, qname = "default", f"kai-es-cycle-{tag}", f"q-{tag}"
    log = MemoryEventLog()
    api = await api_client(cp.kubeconfig)
    try:
        await create_queue(api, qname)
        status, out = await raw(await client.CoreV1Api(api).create_namespaced_config_map(ns, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"scenario.yaml": SCENARIO.read_text()}}, _preload_content=False))
        assert status == 201, out
        await create_pod(api, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"kai.scheduler/queue": qname, POOL_LABEL: POOL}},
            "spec": {
                "schedulerName": "kai-scheduler", "restartPolicy": "Never",
                "securityContext": VALUES["podSecurityContext"],
                "containers": [{
                    "name": "main", "image": image, "imagePullPolicy": "Never",
                    "args": ["cycle", "/etc/kai-es/scenario.yaml", "--output", "json"],
                    "securityContext": VALUES["securityContext"],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                     {"name": "scenario", "mountPath": "/etc/kai-es", "readOnly": True}]}],
                "volumes": [{"name": "tmp", "emptyDir": {}},
                            {"name": "scenario", "configMap": {"name": name}}]}})

        async def finished() -> dict[str, Any] | None:
            status, pod = await get_pod(api, ns, name)
            return pod if status == 200 and pod["status"].get("phase") in ("Succeeded", "Failed") else None

        async with services_running(log, api, grouping=True):
            pod = await wait_for(finished, f"{name} run to its end on the real node", timeout_s=180)
    finally:
        await api.close()

    kubelet_log = cp.real_node.kubelet.tail(40)
    assert pod["spec"]["nodeName"] == cp.real_node.name
    (state,) = [c["state"] for c in pod["status"]["containerStatuses"]]
    (log_file,) = cp.real_node.pod_logs.glob(f"{ns}_{name}_*/main/0.log")
    printed = _container_output(log_file)
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], printed[-2000:], kubelet_log)
    assert state["terminated"]["exitCode"] == 0
    here = tmp_path / "scenario.yaml"  # the name the pod read it under: ids derive from it
    here.write_text(SCENARIO.read_text())
    assert json.loads(printed) == one_cycle(load_scenario(here), load_packer("native"))
