"""Seeded workloads for deterministic simulation runs: queues that take from each other.

`workload(seed)` is a scenario (YAML text, as a user writes one) with a few GPU nodes, two or
three queues of different quotas and weights (one sometimes with a limit), one queue's Job
filling the cluster at the start, and later Jobs (gangs by `kai.scheduler/batch-min-member`)
and bare pods of every queue and priority class — so reclaim, preempt and consolidation all
have work. Every pod runs for a while and its controller recreates it when evicted. The same
seed gives the same text.
"""

from __future__ import annotations

import random
from typing import Any

import yaml

PRIORITY_CLASSES = ("train", "train", "build", "inference")


def _job(name: str, queue: str, *, gpus: int, parallelism: int, min_member: int, priority: str,
         submit_s: int, run_s: int) -> dict[str, Any]:
    annotations = {"kai.scheduler/batch-min-member": str(min_member), "kai-es.io/run-for": f"{run_s}s"}
    if submit_s:
        annotations["kai-es.io/submit-after"] = f"{submit_s}s"
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kai.scheduler/queue": queue},
                         "annotations": annotations},
            "spec": {"parallelism": parallelism, "completions": parallelism,
                     "template": {"spec": {
                         "schedulerName": "kai-scheduler", "restartPolicy": "Never",
                         "priorityClassName": priority,
                         "containers": [{"name": "main", "image": "example/train:1", "resources": {
                             "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}}}]}}}}


def _pod(name: str, queue: str, *, gpus: int, priority: str, submit_s: int, run_s: int) -> dict[str, Any]:
    annotations = {"kai-es.io/run-for": f"{run_s}s"}
    if submit_s:
        annotations["kai-es.io/submit-after"] = f"{submit_s}s"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"kai.scheduler/queue": queue},
                         "annotations": annotations},
            "spec": {"schedulerName": "kai-scheduler", "priorityClassName": priority,
                     "containers": [{"name": "main", "image": "example/infer:1", "resources": {
                         "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}}}]}}


def workload(seed: int) -> str:
    """The scenario of `seed` (see the module docstring)."""
    rng = random.Random(f"dst-workload/{seed}")
    docs: list[dict[str, Any]] = [{"apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario",
                                   "metadata": {"name": f"dst-{seed}"},
                                   "spec": {"simulation": {"until": "idle", "cyclePeriod": "1s"}}}]
    sizes = [rng.choice((4, 8)) for _ in range(rng.randint(2, 4))]
    for i, gpus in enumerate(sizes):
        docs.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i}"},
                     "status": {"allocatable": {"cpu": "64", "memory": "512Gi",
                                                "nvidia.com/gpu": str(gpus), "pods": "110"}}})
    capacity = sum(sizes)
    queues = [f"q{i}" for i in range(rng.randint(2, 3))]
    for name in queues:
        quota = rng.randint(0, capacity // 2)
        limit = rng.choice((-1, -1, -1, quota + rng.randint(1, capacity)))
        docs.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
                     "spec": {"resources": {"gpu": {"quota": quota, "limit": limit,
                                                    "overQuotaWeight": rng.randint(1, 3)}}}})
    hog = rng.randint(capacity // 2, capacity)
    docs.append(_job("hog", queues[0], gpus=1, parallelism=hog, min_member=rng.randint(1, min(hog, 4)),
                     priority="train", submit_s=0, run_s=rng.randint(40, 120)))
    for i in range(rng.randint(3, 8)):
        queue = rng.choice(queues)
        priority = rng.choice(PRIORITY_CLASSES)
        submit, run = rng.randint(1, 40), rng.randint(10, 60)
        if rng.randrange(3):
            parallelism = rng.randint(1, 4)
            docs.append(_job(f"job-{i}", queue, gpus=rng.randint(1, 2), parallelism=parallelism,
                             min_member=rng.randint(1, parallelism), priority=priority,
                             submit_s=submit, run_s=run))
        else:
            docs.append(_pod(f"pod-{i}", queue, gpus=rng.randint(1, 2), priority=priority,
                             submit_s=submit, run_s=run))
    return yaml.safe_dump_all(docs, sort_keys=False)
