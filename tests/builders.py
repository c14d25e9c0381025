"""Fluent builders for Kubernetes objects and scenario text (k8s scheduler's wrappers.go style)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from typing import Any

import yaml

from kai_es.ports import ObjectChange, Relist
from kai_es.scheduling.packing import RankFn


class ScriptedSource:
    """A ClusterSource that lists `initial` and then yields `batches`, one per pump."""

    def __init__(self, initial: list[ObjectChange], batches: list[list[ObjectChange | Relist]]) -> None:
        self.initial = initial
        self.batches = batches

    async def list_objects(self) -> list[ObjectChange]:
        return list(self.initial)

    async def changes(self) -> AsyncIterator[Sequence[ObjectChange | Relist]]:
        for batch in self.batches:
            yield batch


class MakeNode:
    def __init__(self, name: str) -> None:
        self._o: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": name, "labels": {}},
                                   "status": {"allocatable": {"cpu": "32", "memory": "256Gi",
                                                              "nvidia.com/gpu": "8", "pods": "110"}}}

    def gpus(self, n: int) -> MakeNode:
        self._o["status"]["allocatable"]["nvidia.com/gpu"] = str(n)
        return self

    def cpu(self, q: str) -> MakeNode:
        self._o["status"]["allocatable"]["cpu"] = q
        return self

    def memory(self, q: str) -> MakeNode:
        self._o["status"]["allocatable"]["memory"] = q
        return self

    def label(self, k: str, v: str) -> MakeNode:
        self._o["metadata"]["labels"][k] = v
        return self

    def gpu_memory(self, mib: int) -> MakeNode:
        return self.label("nvidia.com/gpu.memory", str(mib))

    def taint(self, key: str, effect: str = "NoSchedule", value: str = "") -> MakeNode:
        self._o.setdefault("spec", {}).setdefault("taints", []).append(
            {"key": key, "value": value, "effect": effect})
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._o)


class MakePod:
    def __init__(self, name: str, queue: str | None = "team-a") -> None:
        self._o: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {}, "annotations": {}},
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": "main", "image": "x",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
        if queue:
            self._o["metadata"]["labels"]["kai.scheduler/queue"] = queue

    def req(self, **resources: str) -> MakePod:
        reqs = self._o["spec"]["containers"][0]["resources"]["requests"]
        for k, v in resources.items():
            reqs["nvidia.com/gpu" if k == "gpu" else k] = v
        return self

    def gpu(self, n: int) -> MakePod:
        return self.req(gpu=str(n))

    def fraction(self, f: str, devices: int | None = None) -> MakePod:
        self._o["metadata"]["annotations"]["gpu-fraction"] = f
        if devices:
            self._o["metadata"]["annotations"]["gpu-fraction-num-devices"] = str(devices)
        return self

    def gpu_memory(self, mib: int) -> MakePod:
        self._o["metadata"]["annotations"]["gpu-memory"] = str(mib)
        return self

    def group(self, name: str) -> MakePod:
        self._o["metadata"]["annotations"]["pod-group-name"] = name
        return self

    def priority_class(self, name: str) -> MakePod:
        self._o["spec"]["priorityClassName"] = name
        return self

    def running_on(self, node: str, devices: str | None = None) -> MakePod:
        self._o["spec"]["nodeName"] = node
        self._o["status"] = {"phase": "Running"}
        if devices is not None:
            self._o["metadata"]["annotations"]["kai-es.io/gpu-devices"] = devices
        return self

    def terminating(self) -> MakePod:
        self._o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return self

    def annotate(self, k: str, v: str) -> MakePod:
        self._o["metadata"]["annotations"][k] = v
        return self

    def label(self, k: str, v: str) -> MakePod:
        self._o["metadata"]["labels"][k] = v
        return self

    def node_selector(self, **sel: str) -> MakePod:
        self._o["spec"]["nodeSelector"] = dict(sel)
        return self

    def tolerate(self, key: str, effect: str = "NoSchedule") -> MakePod:
        self._o["spec"].setdefault("tolerations", []).append({"key": key, "operator": "Exists", "effect": effect})
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._o)


def queue(name: str, gpu_quota: int | str = -1, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": gpu_quota, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    spec.update(extra)
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def podgroup(name: str, min_member: int, queue_name: str = "team-a", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"minMember": min_member, "queue": queue_name}
    body.update(spec)
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": body}


def scenario_text(*docs: dict[str, Any], settings: dict[str, Any] | None = None) -> str:
    all_docs = list(docs)
    if settings is not None:
        all_docs.insert(0, {"apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario",
                            "metadata": {"name": "test"}, "spec": settings})
    return yaml.safe_dump_all(all_docs, sort_keys=False)


def counting_rank(rank: RankFn, caps: list[int]) -> RankFn:
    """`rank` that appends the cap of each call to `caps` (how many scans a caller asked for)."""

    def counted(task: Any, eligible: Any, cap: int) -> Any:
        caps.append(cap)
        return rank(task, eligible, cap)

    return counted
