"""KAI-style manifests (queues, a gang, fractional-GPU pods, a batch/v1 Job whose pods the
controller-manager's job-controller makes) applied to a real apiserver end up bound exactly as
`kai-es cycle` predicts for the same file: `kai-es informer`, `kai-es scheduler` and `kai-es binder` run as
processes over a file log, on a control plane of the test's own (no other test's nodes, queues
or pods can change a fair share or a placement).

The manifests are applied before the processes start, so the scheduler's first cycle sees what
`kai-es cycle` sees: the informer's first relist is one atomic append.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import payloads as p
from kai_es.ingest.quantity import parse_quantity
from kai_es.adapters.kubernetes.source import RESERVATION_NAMESPACE
from tests.k8s.conftest import started_control_plane
from tests.processes import ROOT, Proc

MANIFESTS = Path(__file__).resolve().parent / "manifests" / "kai-style.yaml"


@pytest.fixture(scope="module")
def own_cp() -> Iterator[Any]:
    with started_control_plane() as cp:
        yield cp


def apply(cp: Any, doc: dict[str, Any]) -> None:
    """What `kubectl apply` would create for `doc` (a Node becomes a KWOK node with its
    allocatable as capacity)."""
    kind, meta = doc["kind"], doc["metadata"]
    if kind == "Node":
        alloc = doc["status"]["allocatable"]
        labels = dict(meta.get("labels") or {})
        cp.create_gpu_node(meta["name"], gpus=int(alloc.get("nvidia.com/gpu", 0)),
                           gpu_product=labels.pop("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
                           gpu_memory_mib=int(labels.pop("nvidia.com/gpu.memory", "81920")),
                           cpu=str(alloc["cpu"]), memory=str(alloc["memory"]),
                           pods=int(alloc.get("pods", 110)), labels=labels)
    elif kind == "Queue":
        cp.call("POST", "/apis/scheduling.run.ai/v2/queues", doc, ok=(201,))
    elif kind == "PodGroup":
        ns = meta.get("namespace", "default")
        cp.call("POST", f"/apis/scheduling.run.ai/v2alpha2/namespaces/{ns}/podgroups", doc, ok=(201,))
    elif kind == "Pod":
        ns = meta.get("namespace", "default")
        cp.call("POST", f"/api/v1/namespaces/{ns}/pods", doc, ok=(201,))
    elif kind == "Job":  # the controller-manager's job-controller makes its pods
        ns = meta.get("namespace", "default")
        cp.call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", doc, ok=(201,))
    else:
        raise AssertionError(f"the test does not apply {kind}")


def job_pods(cp: Any, docs: list[dict[str, Any]], timeout_s: float = 30.0) -> dict[str, str]:
    """Each Job's pods as `kai-es cycle` names them (`<job>-<i>`) -> the pod the job-controller
    made in its place (`<job>-<random>`), once it made all `parallelism` of them. A Job's pods
    come from one template, so which one stands for which is arbitrary."""
    deadline = time.monotonic() + timeout_s
    out: dict[str, str] = {}
    for doc in docs:
        if doc["kind"] != "Job":
            continue
        ns, name = doc["metadata"].get("namespace", "default"), doc["metadata"]["name"]
        count = int(doc["spec"].get("parallelism", 1))
        while True:
            made = sorted(pod["metadata"]["name"] for pod in cp.call(
                "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=batch.kubernetes.io/job-name={name}")["items"])
            if len(made) == count:
                break
            assert time.monotonic() < deadline, f"the job-controller made {made} for Job {name}"
            time.sleep(0.05)
        out.update({f"{ns}/{name}-{i}": f"{ns}/{pod}" for i, pod in enumerate(made)})
    return out


def test_manifests_bind_as_kai_es_cycle_predicts(own_cp: Any, tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d and d["kind"] != "Scenario"]
    predicted = json.loads(subprocess.run(
        [sys.executable, "-m", "kai_es", "cycle", str(MANIFESTS), "-o", "json"], cwd=ROOT,
        capture_output=True, text=True, check=True, timeout=120).stdout)["pods"]
    assert {s["status"] for s in predicted.values()} == {"Binding", "Pending"}  # both kinds tested

    for doc in docs:
        apply(own_cp, doc)
    made = job_pods(own_cp, docs)  # before the informer starts: its first relist holds them
    assert made
    predicted = {made.get(key, key): s for key, s in predicted.items()}
    log = tmp_path / "events.jsonl"
    kube = ["--kubeconfig", str(own_cp.kubeconfig)]
    procs = [Proc("informer", ["informer", "--log", str(log), *kube], tmp_path),
             Proc("scheduler", ["scheduler", "--log", str(log), "--period", "100ms"], tmp_path),
             Proc("binder", ["binder", "--log", str(log), *kube, "--scheduled-events"], tmp_path)]
    try:
        for proc in procs:
            proc.start()
            proc.wait_ready(proc.name)
        to_bind = {key for key, s in predicted.items() if s["status"] == "Binding"}
        deadline = time.monotonic() + 60
        while True:
            pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
                    for p in own_cp.call("GET", "/api/v1/pods")["items"]}
            if all(pods[k].get("status", {}).get("phase") == "Running" for k in to_bind):
                break
            assert time.monotonic() < deadline, {k: pods[k].get("status", {}).get("phase") for k in to_bind}
            time.sleep(0.2)
        time.sleep(1.0)  # a few more cycles: nothing else may be bound
        pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
                for p in own_cp.call("GET", "/api/v1/pods")["items"]}
    finally:
        for proc in procs:
            proc.kill9()
    reserved = {k: p for k, p in pods.items() if k.startswith(f"{RESERVATION_NAMESPACE}/")}
    got = {key: pod["spec"].get("nodeName") for key, pod in pods.items() if key not in reserved}
    want = {key: s["node"] for key, s in predicted.items()}
    want_nodes = dict(want)
    assert got.keys() == want.keys()
    # identical members of one gang are interchangeable: which of them goes first is decided by
    # uid, and the apiserver's uids are random; so a gang is compared as the nodes it got
    gangs = {f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}":
             d["metadata"]["annotations"]["pod-group-name"] for d in docs
             if d["kind"] == "Pod" and "pod-group-name" in d["metadata"].get("annotations", {})}
    gangs.update({key: "job" for key in made.values()})  # a Job's pods are interchangeable too
    for gang in set(gangs.values()):
        members = [key for key, g in gangs.items() if g == gang]
        assert sorted(str(got.pop(k)) for k in members) == sorted(str(want.pop(k)) for k in members), gang
    assert got == want
    # each shared GPU is held by one reservation pod on the node of the pods sharing it
    groups = {(p["metadata"]["labels"]["runai-gpu-group"], p["spec"]["nodeName"]) for k, p in pods.items()
              if k not in reserved and "runai-gpu-group" in p["metadata"].get("labels", {})}
    assert groups and sorted(groups) == sorted((p["metadata"]["labels"]["runai-gpu-group"], p["spec"]["nodeName"])
                                               for p in reserved.values())
    # the whole GPUs each node's bound pods (reservation pods included) ask for never exceed its capacity
    for node in {n for n in got.values() if n}:
        asked = sum(parse_quantity(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", "0"))
                    for p in pods.values() if p["spec"].get("nodeName") == node
                    for c in p["spec"]["containers"])
        capacity = own_cp.call("GET", f"/api/v1/nodes/{node}")["status"]["capacity"]["nvidia.com/gpu"]
        assert asked <= parse_quantity(capacity)
    # --scheduled-events: a Scheduled Event for every bound pod
    scheduled = {e["involvedObject"]["name"] for e in own_cp.call("GET", "/api/v1/namespaces/default/events")["items"]
                 if e.get("reason") == "Scheduled"}
    assert scheduled == {key.split("/", 1)[1] for key, node in want_nodes.items() if node}
    # the Job's pods were grouped from their owner, as KAI's podgrouper groups them
    job_uid = own_cp.call("GET", "/apis/batch/v1/namespaces/default/jobs/finetune")["metadata"]["uid"]
    records = FileEventLog(log, readonly=True).scan()
    groups = {(r.envelope.data.name, r.envelope.data.min_member, r.envelope.data.queue,
               r.envelope.data.priority_class) for r in records
              if isinstance(r.envelope.data, p.PodGroupObserved) and r.envelope.data.name.startswith("pg-finetune")}
    assert groups == {(f"pg-finetune-{job_uid}", 2, "team-b", "train")}
    run = subprocess.run([sys.executable, "-m", "kai_es", "replay", str(log)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
