"""Kubernetes' own controllers, as a scenario expands their workloads: Job, CronJob, Deployment
(through a ReplicaSet), ReplicaSet and StatefulSet. Pure.

Pod names follow the scenario convention `<owner>-<index>`; labels are what the controllers set
(`job-name`, `pod-template-hash`, `statefulset.kubernetes.io/pod-name`, …) over the template's.
A CronJob is expanded into the Job of its first run, `<cronjob>-<minutes since the epoch of the
scenario's start>` (the CronJob controller's naming), and that Job's pods.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kai_es.controllers.base import Budget, Context, ExpandedPod, Expansion, made, pod_from_template, pods_count
from kai_es.ingest.groupers.base import Obj, dig, mapping, name_of, uid_of

JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
CONTROLLER_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def template_hash(obj: Obj) -> str:
    """A stable pod-template-hash for a made ReplicaSet (10 hex digits of its owner's uid)."""
    return hashlib.sha256(uid_of(obj).encode()).hexdigest()[:10]


def job_pods(ctx: Context, top: Obj, job: Obj, path: str, budget: Budget, chain: tuple[dict[str, Any], ...],
             *, pod_name: Any = None, labels: dict[str, str] | None = None) -> list[ExpandedPod]:
    """The pods of Job `job` (whose fields are at `path` of `top`): `spec.parallelism` of them
    (default 1), owned by the Job; `chain` are the owners above the Job."""
    n = budget.take(pods_count(ctx, top, dig(job, "spec", "parallelism"), f"{path}.parallelism", default=1),
                    f"{path}.parallelism")
    indexed = dig(job, "spec", "completionMode") == "Indexed"
    out = []
    for i in range(n):
        extra = {k: name_of(job) for k in JOB_NAME_LABELS} | {k: uid_of(job) for k in CONTROLLER_UID_LABELS}
        extra.update(labels or {})
        annotations = {}
        if indexed:
            extra[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(i)
        name = pod_name(i) if pod_name is not None else f"{name_of(job)}-{i}"
        pod = pod_from_template(ctx, top, dig(job, "spec", "template"), f"{path}.template", name, job,
                                labels=extra, annotations=annotations)
        out.append(ExpandedPod(pod, (dict(job), *chain)))
    return out


def expand_job(top: dict[str, Any], ctx: Context) -> Expansion:
    return Expansion([top], job_pods(ctx, top, top, "spec", Budget(ctx, top), ()))


def expand_cronjob(top: dict[str, Any], ctx: Context) -> Expansion:
    template = mapping(top, dig(top, "spec", "jobTemplate"), "spec.jobTemplate")
    tmeta = mapping(top, template.get("metadata"), "spec.jobTemplate.metadata")
    name = f"{name_of(top)}-{ctx.start_ns // 60_000_000_000}"
    job = made(ctx, "batch/v1", "Job", name, top, labels=tmeta.get("labels"),
               annotations=tmeta.get("annotations"), spec=mapping(top, template.get("spec"), "spec.jobTemplate.spec"))
    return Expansion([top, job], job_pods(ctx, top, job, "spec.jobTemplate.spec", Budget(ctx, top), (top,)))


def _replica_pods(ctx: Context, top: Obj, owner: dict[str, Any], chain: tuple[dict[str, Any], ...],
                  extra: dict[str, str], naming: str) -> list[ExpandedPod]:
    n = pods_count(ctx, top, dig(top, "spec", "replicas"), "spec.replicas", default=1)
    return [ExpandedPod(pod_from_template(ctx, top, dig(top, "spec", "template"), "spec.template",
                                          f"{naming}-{i}", owner, labels=extra), (owner, *chain))
            for i in range(n)]


def expand_deployment(top: dict[str, Any], ctx: Context) -> Expansion:
    hash_ = template_hash(top)
    template_labels = mapping(top, dig(top, "spec", "template", "metadata", "labels"), "spec.template.metadata.labels")
    rs = made(ctx, "apps/v1", "ReplicaSet", f"{name_of(top)}-{hash_}", top,
              labels={**template_labels, "pod-template-hash": hash_}, spec=mapping(top, top.get("spec"), "spec"))
    return Expansion([top, rs], _replica_pods(ctx, top, rs, (top,), {"pod-template-hash": hash_}, name_of(top)))


def expand_replicaset(top: dict[str, Any], ctx: Context) -> Expansion:
    return Expansion([top], _replica_pods(ctx, top, top, (), {}, name_of(top)))


def expand_statefulset(top: dict[str, Any], ctx: Context) -> Expansion:
    n = pods_count(ctx, top, dig(top, "spec", "replicas"), "spec.replicas", default=1)
    pods = []
    for i in range(n):
        name = f"{name_of(top)}-{i}"
        extra = {"statefulset.kubernetes.io/pod-name": name, "apps.kubernetes.io/pod-index": str(i),
                 "controller-revision-hash": f"{name_of(top)}-{template_hash(top)}"}
        pods.append(ExpandedPod(pod_from_template(ctx, top, dig(top, "spec", "template"), "spec.template", name,
                                                  top, labels=extra), (top,)))
    return Expansion([top], pods)
