"""Kubernetes' own workloads, as KAI's podgrouper groups them: a bare Pod (and spark-submit's
driver), batch/v1 Job and CronJob, apps/v1 Deployment, ReplicaSet and StatefulSet, and the kinds
KAI hands to its default grouper. Pure.

- Pod (no owner): `pg-<pod>-<uid>`, minimum 1, `train`. A pod labelled `spark-app-name` and
  `spark-app-selector` (spark-submit's driver, and its executors, which it owns) is grouped under
  the selector's value instead, so the application is one group.
- Job: `pg-<job>-<uid>`, minimum 1 or the Job's `kai.scheduler/batch-min-member`.
- CronJob: the Job the pod belongs to, by KAI's default grouper (the annotation is not read).
- Deployment: one group per pod, `pg-<pod>-<pod uid>`, owned by the pod, `inference`.
- ReplicaSet, StatefulSet and KAI's default-grouper kinds: `pg-<owner>-<uid>`, minimum 1.
  kai-es extension: a StatefulSet with `podManagementPolicy: Parallel` honours
  `kai.scheduler/batch-min-member` (its pods are created at once, so they can be one gang); KAI's
  default grouper ignores the annotation, and so does kai-es for OrderedReady (one pod at a time).
"""

from __future__ import annotations

from kai_es.ingest.groupers.base import (
    INFERENCE,
    MIN_MEMBER_OVERRIDE,
    Decision,
    Obj,
    OwnerError,
    Source,
    annotations_of,
    count,
    default,
    describe,
    dig,
    group_name,
    labels,
    top_priority,
)

SPARK_APP_NAME = "spark-app-name"
SPARK_APP_SELECTOR = "spark-app-selector"


def default_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    return default(top, src.pod, lookup)


def pod_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    decision = default(top, src.pod, lookup)
    pod_labels = labels(top)
    if SPARK_APP_NAME in pod_labels and SPARK_APP_SELECTOR in pod_labels:
        return decision.with_(name=pod_labels[SPARK_APP_SELECTOR])
    return decision


def _min_member_override(top: Obj) -> int | None:
    raw = annotations_of(top).get(MIN_MEMBER_OVERRIDE)
    if raw is None:
        return None
    return count(top, raw, f"metadata.annotations[{MIN_MEMBER_OVERRIDE}]")


def job_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    decision = default(top, src.pod, (top,))
    override = _min_member_override(top)
    return decision if override is None else decision.with_(min_member=override)


def cronjob_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    job = next((o for o in src.owners if o.get("kind") == "Job"), None)
    if job is None:
        raise OwnerError(describe(src.pod), "metadata.ownerReferences",
                         f"a pod of {describe(top)} needs a Job owner")
    return default(job, src.pod, (job,))


def deployment_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    pod = src.pod
    decision = default(top, pod, (top,))
    return decision.with_(name=group_name(pod), owner=pod, priority_class=top_priority(top, pod, INFERENCE))


def statefulset_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    decision = default(top, src.pod, lookup)
    if dig(top, "spec", "podManagementPolicy") != "Parallel":
        return decision
    override = _min_member_override(top)
    return decision if override is None else decision.with_(min_member=override)
