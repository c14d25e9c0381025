"""The PodGroup of a pod that names none, following KAI's podgrouper defaults. Pure functions.

Input: the pod (Kubernetes JSON) and its owner chain — the objects reached by following
`metadata.ownerReferences[0]` from the pod up to the top owner, nearest first, as the caller
fetched them (an owner of a kind not in `FETCHED_KINDS` ends the chain as the bare reference).
Output: a `Grouping` — the PodGroup object (KAI's `scheduling.run.ai/v2alpha2` JSON, so the
ordinary PodGroup translation reads it) and the pod with `pod-group-name` set to it, as KAI's
podgrouper annotates pods. The same pod and owners always give the same result.

Contract (KAI's defaults, read from its podgrouper's behaviour; kai-es's own code):
- Only pods for kai-es's scheduler (`schedulerName: kai-scheduler`) are grouped, as KAI's
  podgrouper only groups its scheduler's pods. A pod with `pod-group-name`, or
  `kai.scheduler/skip-podgrouper: "true"` on it or an owner, is not grouped (`group_pod` returns
  None). (KAI re-groups a pod that has owners even when it names a group; kai-es keeps the name
  the user gave.)
- Name: `pg-<top owner name>-<top owner uid>`; a bare pod is its own top owner. For a
  Deployment (apps/v1, reached through its ReplicaSet) every pod is its own group,
  `pg-<pod name>-<pod uid>`, as KAI does for inference replicas.
- minMember: 1; a batch/v1 Job's `kai.scheduler/batch-min-member` annotation overrides it; a
  kubeflow.org PyTorchJob needs all its replicas (the sum of `pytorchReplicaSpecs.*.replicas`,
  each > 0), unless `spec.elasticPolicy.minReplicas` or
  `spec.runPolicy.schedulingPolicy.minAvailable` (the latter wins) say otherwise.
- Queue: the top owner's `kai.scheduler/queue` label, else the pod's, else `<project>` (or
  `<project>-<node pool>`) from a `project` label, else `default-queue`.
- Priority class: an owner's (nearest first) or the pod's `priorityClassName` label, else the
  pod's `spec.priorityClassName`, else `train` (`inference` for Deployments). Unlike KAI, the
  name is not checked against the cluster's PriorityClasses (that needs a lookup): an unknown
  name gets the reducer's default priority.
- Preemptibility: an owner's `kai.scheduler/preemptibility` label, else the pod's.
- Topology: the top owner's `kai.scheduler/topology*` annotations. Staleness grace period and
  preemption delay: an owner's (nearest first) or the pod's `kai.scheduler/staleness-grace-period`
  / `kai.scheduler/preemption-delay` annotation.
- creationTimestamp: the top owner's (the group is as old as its workload).
Malformed input (a non-numeric override, a PyTorchJob without replicas) raises
`IngestError` naming the field; nothing else is raised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.translate import NODE_POOL_LABEL, PODGROUP_ANNOTATION, PREEMPTIBILITY_LABEL, QUEUE_LABEL, \
    IngestError, int_field

SKIP_ANNOTATION = "kai.scheduler/skip-podgrouper"
MIN_MEMBER_OVERRIDE = "kai.scheduler/batch-min-member"
PRIORITY_LABEL = "priorityClassName"
PROJECT_LABEL = "project"
DEFAULT_QUEUE = "default-queue"
TOPOLOGY_ANNOTATIONS = {"topology": "kai.scheduler/topology",
                        "requiredTopologyLevel": "kai.scheduler/topology-required-placement",
                        "preferredTopologyLevel": "kai.scheduler/topology-preferred-placement"}
STALENESS_ANNOTATION = "kai.scheduler/staleness-grace-period"
PREEMPTION_DELAY_ANNOTATION = "kai.scheduler/preemption-delay"

#: (apiVersion group, kind) of owners whose objects the caller fetches; any other owner ends the
#: chain as its bare ownerReference (the default grouper needs only its name and uid)
FETCHED_KINDS = frozenset({("apps", "ReplicaSet"), ("apps", "Deployment"), ("apps", "StatefulSet"),
                           ("batch", "Job"), ("batch", "CronJob"), ("kubeflow.org", "PyTorchJob")})

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Grouping:
    """A PodGroup object and the pod annotated to belong to it."""

    podgroup: dict[str, Any]
    pod: dict[str, Any]


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _strmap(obj: Obj, field: str) -> dict[str, str]:
    raw = _meta(obj).get(field)
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


def api_group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def first_owner(obj: Obj) -> dict[str, str] | None:
    """The ownerReference KAI follows (the first), as {apiVersion, kind, name, uid}, or None."""
    refs = _meta(obj).get("ownerReferences")
    if not isinstance(refs, list) or not refs:
        return None
    ref = refs[0]
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str) or not ref.get("name"):
        raise IngestError("metadata.ownerReferences[0]", "needs a name")
    return {k: str(ref.get(k, "") or "") for k in ("apiVersion", "kind", "name", "uid")}


def is_fetched(ref: Mapping[str, str]) -> bool:
    return (api_group(ref.get("apiVersion", "")), ref.get("kind", "")) in FETCHED_KINDS


def ref_object(ref: Mapping[str, str], namespace: str) -> dict[str, Any]:
    """An owner known only by its reference, as an object with just that metadata."""
    return {"apiVersion": ref.get("apiVersion", ""), "kind": ref.get("kind", ""),
            "metadata": {"name": ref.get("name", ""), "uid": ref.get("uid", ""), "namespace": namespace}}


def _skipped(obj: Obj) -> bool:
    return _strmap(obj, "annotations").get(SKIP_ANNOTATION) == "true"


def _dig(obj: Obj, *path: str) -> Any:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _pytorch_min_member(job: Obj) -> int:
    specs = _dig(job, "spec", "pytorchReplicaSpecs")
    if not isinstance(specs, Mapping) or not specs:
        raise IngestError("spec.pytorchReplicaSpecs", "a PyTorchJob needs its replica specs")
    total = 0
    for name in sorted(specs):
        path = f"spec.pytorchReplicaSpecs.{name}.replicas"
        replicas = int_field(_dig(specs, name, "replicas"), path, minimum=0) \
            if _dig(specs, name, "replicas") is not None else 0
        if replicas == 0:
            raise IngestError(path, f"a PyTorchJob needs at least one {name} replica")
        total += replicas
    minimum = total
    elastic = _dig(job, "spec", "elasticPolicy", "minReplicas")
    if elastic is not None:
        minimum = int_field(elastic, "spec.elasticPolicy.minReplicas", minimum=0)
    available = _dig(job, "spec", "runPolicy", "schedulingPolicy", "minAvailable")
    if available is not None:
        minimum = int_field(available, "spec.runPolicy.schedulingPolicy.minAvailable", minimum=0)
    return minimum


def needs_group(pod: Obj) -> bool:
    """Whether `pod` is one the podgrouper groups (before its owners are looked at)."""
    spec = pod.get("spec")
    scheduler = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return scheduler == SCHEDULER_NAME and PODGROUP_ANNOTATION not in _strmap(pod, "annotations") \
        and not _skipped(pod)


def group_pod(pod: Obj, owners: Sequence[Obj]) -> Grouping | None:
    """The PodGroup of `pod` given its owner chain (nearest first; empty for a bare pod), or
    None when the pod names its group or asks not to be grouped (contract: module docstring)."""
    pod_annotations = _strmap(pod, "annotations")
    if not needs_group(pod) or any(_skipped(o) for o in owners):
        return None
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    pod_name, pod_uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    if not pod_name:
        raise IngestError("metadata.name", "is required")
    top = owners[-1] if owners else pod
    top_meta = _meta(top)
    top_kind = (api_group(str(top.get("apiVersion", "") or "")), str(top.get("kind", "") or "")) \
        if owners else ("", "Pod")
    top_name, top_uid = str(top_meta.get("name") or ""), str(top_meta.get("uid") or "")
    pod_labels = _strmap(pod, "labels")
    top_labels, top_annotations = _strmap(top, "labels"), _strmap(top, "annotations")

    deployment = top_kind == ("apps", "Deployment")
    name = f"pg-{pod_name}-{pod_uid}" if deployment else f"pg-{top_name}-{top_uid}"
    min_member = 1
    if top_kind == ("batch", "Job") and MIN_MEMBER_OVERRIDE in top_annotations:
        min_member = int_field(top_annotations[MIN_MEMBER_OVERRIDE],
                                f"metadata.annotations[{MIN_MEMBER_OVERRIDE}]", minimum=0)
    elif top_kind == ("kubeflow.org", "PyTorchJob"):
        min_member = _pytorch_min_member(top)

    queue = top_labels.get(QUEUE_LABEL) or pod_labels.get(QUEUE_LABEL) or ""
    if not queue:
        project = top_labels.get(PROJECT_LABEL) or pod_labels.get(PROJECT_LABEL) or ""
        pool = pod_labels.get(NODE_POOL_LABEL, "")
        queue = (f"{project}-{pool}" if pool else project) if project else DEFAULT_QUEUE

    priority = next((_strmap(o, "labels")[PRIORITY_LABEL] for o in owners
                     if _strmap(o, "labels").get(PRIORITY_LABEL)), "") \
        or pod_labels.get(PRIORITY_LABEL, "") or str(_dig(pod, "spec", "priorityClassName") or "") \
        or ("inference" if deployment else "train")
    preempt = next((_strmap(o, "labels")[PREEMPTIBILITY_LABEL] for o in owners
                    if PREEMPTIBILITY_LABEL in _strmap(o, "labels")), pod_labels.get(PREEMPTIBILITY_LABEL, ""))

    spec: dict[str, Any] = {"minMember": min_member, "queue": queue, "priorityClassName": priority}
    if preempt:
        spec["preemptibility"] = preempt
    topology = {field: top_annotations[key] for field, key in TOPOLOGY_ANNOTATIONS.items()
                if top_annotations.get(key)}
    if topology:
        spec["topologyConstraint"] = topology
    for annotation, field in ((STALENESS_ANNOTATION, "stalenessGracePeriod"),
                              (PREEMPTION_DELAY_ANNOTATION, "preemptionDelay")):
        value = next((_strmap(o, "annotations")[annotation] for o in owners
                      if annotation in _strmap(o, "annotations")), pod_annotations.get(annotation))
        if value is not None:
            spec[field] = value
    owner_ref = {"apiVersion": str(pod.get("apiVersion") or "v1") if deployment or not owners
                 else str(top.get("apiVersion", "")),
                 "kind": "Pod" if deployment or not owners else str(top.get("kind", "")),
                 "name": pod_name if deployment else top_name, "uid": pod_uid if deployment else top_uid}
    created = (meta if deployment or not owners else top_meta).get("creationTimestamp")
    group_meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(top_labels),
                                  "ownerReferences": [owner_ref]}
    if created:
        group_meta["creationTimestamp"] = created
    podgroup = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": group_meta,
                "spec": spec}
    raw_annotations = meta.get("annotations") or {}
    if not isinstance(raw_annotations, Mapping):
        raise IngestError("metadata.annotations", "must be a map")
    annotated = dict(pod)
    annotated["metadata"] = {**meta, "annotations": {**raw_annotations, PODGROUP_ANNOTATION: name}}
    return Grouping(podgroup=podgroup, pod=annotated)
