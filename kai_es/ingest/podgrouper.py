"""The PodGroup of a pod that names none, as KAI's podgrouper makes it. Pure functions; the one
grouper of kai-es: the informer (`kai_es/adapters/kubernetes/grouping.py`, owners fetched from the
apiserver) and the scenario loader (`kai_es/scenario.py`, owners expanded from the file) both call
`group_pod`.

Input: the pod (Kubernetes JSON) and its owner chain — the objects reached by following
`metadata.ownerReferences[0]` from the pod up, nearest first, as the caller fetched them (an
owner of a kind not in `fetched_kinds` ends the chain as its bare reference, `ref_object`) — plus,
for the kinds that read more than the chain (`related_refs`: a RayJob's RayCluster), those objects,
and the live pods by label (`kai_es.ingest.groupers.INDEXED_LABELS`: an MPIJob's launcher).
Output: a `Grouping` — the PodGroup (KAI's `scheduling.run.ai/v2alpha2` JSON, which the ordinary
PodGroup translation reads) and the pod annotated `pod-group-name` (and labelled
`kai.scheduler/subgroup-name` when it belongs to a sub-group), as KAI's podgrouper patches pods.
The same input always gives the same result.

Contract (KAI's podgrouper read for its behaviour; the rules per kind are in
`kai_es/ingest/groupers/`, the README's "Workloads" table lists them):
- Only pods of kai-es's scheduler (`schedulerName: kai-scheduler`) are grouped. A pod with
  `pod-group-name` joins that PodGroup (kai-es keeps the name even when the pod has owners, where
  KAI re-groups it); `kai.scheduler/skip-podgrouper: "true"` on the pod or any owner leaves the pod
  ungrouped (`group_pod` returns None).
- Every kind: queue from the top owner's `kai.scheduler/queue` label, else the pod's, else
  `<project>[-<node pool>]`, else `default-queue`; priority class from the labels
  `priorityClassName` / `spec.priorityClassName` (KAI's order), else the kind's default (`train`;
  `inference` for Deployments and Knative, `build` for Notebooks; unlike KAI the name is not
  checked against the cluster's PriorityClasses); `kai.scheduler/preemptibility`,
  `kai.scheduler/preemption-delay` and `kai.scheduler/staleness-grace-period` from the owners,
  then the pod; topology from the top owner's `kai.scheduler/topology*` annotations;
  creationTimestamp of the PodGroup's owner (the group is as old as its workload); the
  PodGroup's labels are the top owner's, plus the pod's `kai.scheduler/node-pool` when the top
  owner has none (KAI's addNodePoolLabel: the label picks the scheduling shard).
- `rules`: the config's no-code rules by (group, kind) (`kai_es/ingest/groupers/rules.py`), for
  kinds the table does not know.
- A pod naming a Kubernetes PodGroup (`spec.schedulingGroup.podGroupName`, the Workload API of
  Kubernetes 1.36) joins that gang: the caller passes the PodGroup in `related` under
  (`workload_api.RELATED_KIND`, its name) (`kai_es/ingest/groupers/workload_api.py`); without
  it the pod is not grouped (an `OwnerError`: it waits for the PodGroup).
Malformed input (a count that is not an integer, negative, or above KAI's int32; a missing
replica spec; a pod without the labels its controller sets) raises `IngestError` (an
`OwnerError` naming the object and the field); nothing else is raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kai_es.ingest.groupers import CHAIN_ONLY, TABLE, GroupingRule, decide, kind_of, workload_of
from kai_es.ingest.groupers import workload_api
from kai_es.ingest.groupers.base import (
    MIN_MEMBER_OVERRIDE,
    PRIORITY_LABEL,
    TOPOLOGY_ANNOTATIONS,
    Decision,
    NoPods,
    OwnerError,
    PodIndex,
    Source,
    annotations_of,
    describe,
    meta,
)
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.translate import NODE_POOL_LABEL, PODGROUP_ANNOTATION, SUBGROUP_LABEL, IngestError, created_ns

SKIP_ANNOTATION = "kai.scheduler/skip-podgrouper"

Obj = Mapping[str, Any]

__all__ = ["MIN_MEMBER_OVERRIDE", "PRIORITY_LABEL", "SKIP_ANNOTATION", "TOPOLOGY_ANNOTATIONS", "Grouping",
           "GroupingRule", "annotate", "api_group", "fetched_kinds", "first_owner", "group_pod", "is_fetched",
           "needs_group", "plural_of", "ref_object", "related_refs", "rules_by_kind"]


@dataclass(frozen=True)
class Grouping:
    """A PodGroup object and the pod annotated to belong to it."""

    podgroup: dict[str, Any]
    pod: dict[str, Any]
    #: the sub-group the pod is labelled with ("" when none): `annotate(pod, name, subgroup)`
    #: gives `pod` again from the pod as it was given
    subgroup: str = ""


def api_group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def rules_by_kind(rules: Iterable[GroupingRule]) -> dict[tuple[str, str], GroupingRule]:
    return {(r.group, r.kind): r for r in rules}


def fetched_kinds(rules: Mapping[tuple[str, str], GroupingRule] | None = None) -> frozenset[tuple[str, str]]:
    """(group, kind) of the owners a caller fetches: the table's, the chain links the table's
    rules read (Knative's Revision), and the no-code rules'."""
    return frozenset(TABLE) | frozenset(CHAIN_ONLY) | frozenset(rules or {})


def plural_of(group: str, kind: str, rules: Mapping[tuple[str, str], GroupingRule] | None = None) -> str:
    """The resource name of a fetched kind (KeyError for any other)."""
    if (group, kind) in TABLE:
        return TABLE[(group, kind)].plural
    if (group, kind) in CHAIN_ONLY:
        return CHAIN_ONLY[(group, kind)]
    return (rules or {})[(group, kind)].plural


def _refs(obj: Obj) -> list[Any]:
    refs = meta(obj).get("ownerReferences")
    return refs if isinstance(refs, list) else []


def first_owner(obj: Obj, *, is_pod: bool = True) -> dict[str, str] | None:
    """The ownerReference KAI follows, as {apiVersion, kind, name, uid}, or None. A pod's first
    reference; an owner with more than one is malformed (KAI refuses it too)."""
    refs = _refs(obj)
    if not refs:
        return None
    if not is_pod and len(refs) > 1:
        raise OwnerError(describe(obj), "metadata.ownerReferences", f"an owner with {len(refs)} owners")
    ref = refs[0]
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str) or not ref.get("name"):
        raise IngestError("metadata.ownerReferences[0]", "needs a name")
    return {k: str(ref.get(k, "") or "") for k in ("apiVersion", "kind", "name", "uid")}


def is_fetched(ref: Mapping[str, str], rules: Mapping[tuple[str, str], GroupingRule] | None = None) -> bool:
    return (api_group(ref.get("apiVersion", "")), ref.get("kind", "")) in fetched_kinds(rules)


def ref_object(ref: Mapping[str, str], namespace: str) -> dict[str, Any]:
    """An owner known only by its reference, as an object with just that metadata."""
    return {"apiVersion": ref.get("apiVersion", ""), "kind": ref.get("kind", ""),
            "metadata": {"name": ref.get("name", ""), "uid": ref.get("uid", ""), "namespace": namespace}}


def related_refs(owners: Sequence[Obj]) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of the objects the top owner's rule reads besides the chain."""
    if not owners:
        return []
    top = owners[-1]
    entry = workload_of(top)
    if entry is None or entry.related is None:
        return []
    version = str(top.get("apiVersion") or "")
    return [(version, kind, name) for kind, name in entry.related(top)]


def _skipped(obj: Obj) -> bool:
    return annotations_of(obj).get(SKIP_ANNOTATION) == "true"


def needs_group(pod: Obj, *, ours: str = SCHEDULER_NAME) -> bool:
    """Whether `pod` is one the podgrouper groups (before its owners are looked at): a pod of
    `ours`, the scheduler name kai-es answers to."""
    spec = pod.get("spec")
    scheduler = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return scheduler == ours and PODGROUP_ANNOTATION not in annotations_of(pod) and not _skipped(pod)


def group_pod(pod: Obj, owners: Sequence[Obj], *, related: Mapping[tuple[str, str], Obj] | None = None,
              pods: PodIndex | None = None,
              rules: Mapping[tuple[str, str], GroupingRule] | None = None,
              ours: str = SCHEDULER_NAME) -> Grouping | None:
    """The PodGroup of `pod` given its owner chain (nearest first; empty for a bare pod), or
    None when the pod names its group, asks not to be grouped or is not of `ours` (the scheduler
    name kai-es answers to) (contract: module docstring)."""
    if not needs_group(pod, ours=ours) or any(_skipped(o) for o in owners):
        return None
    m = meta(pod)
    if not isinstance(m.get("name"), str) or not m.get("name"):
        raise IngestError("metadata.name", "is required")
    raw_annotations = m.get("annotations") or {}
    raw_labels = m.get("labels") or {}
    if not isinstance(raw_annotations, Mapping):
        raise IngestError("metadata.annotations", "must be a map")
    if not isinstance(raw_labels, Mapping):
        raise IngestError("metadata.labels", "must be a map")
    decision = decide(Source(pod, tuple(owners), related or {}, pods or NoPods()), rules or {})
    k8s_group_name = workload_api.wanted(pod, owners)
    if k8s_group_name is not None:
        k8s_group = (related or {}).get((workload_api.RELATED_KIND, k8s_group_name))
        if k8s_group is None:
            raise workload_api.missing(pod, k8s_group_name)
        decision = workload_api.override(decision, k8s_group, pod, owners)
    pool = raw_labels.get(NODE_POOL_LABEL)
    if NODE_POOL_LABEL not in decision.labels and isinstance(pool, str):
        decision = replace(decision, labels={**decision.labels, NODE_POOL_LABEL: pool})
    podgroup = render(decision, str(m.get("namespace") or "default"))
    subgroup = decision.pod_subgroup or ""
    return Grouping(podgroup=podgroup, pod=annotate(pod, decision.name, subgroup), subgroup=subgroup)


def annotate(pod: Obj, name: str, subgroup: str = "") -> dict[str, Any]:
    """`pod` as KAI's podgrouper patches it: annotated `pod-group-name: name`, and labelled
    `kai.scheduler/subgroup-name: subgroup` when `subgroup` is not empty. `pod` must be one
    `group_pod` accepted (its annotations and labels are maps); it is not modified."""
    m = meta(pod)
    annotated = dict(pod)
    new_meta = {**m, "annotations": {**(m.get("annotations") or {}), PODGROUP_ANNOTATION: name}}
    if subgroup:
        new_meta["labels"] = {**(m.get("labels") or {}), SUBGROUP_LABEL: subgroup}
    annotated["metadata"] = new_meta
    return annotated


def render(d: Decision, namespace: str) -> dict[str, Any]:
    """The PodGroup JSON of a decision (what KAI's podgrouper would create)."""
    owner = d.owner
    owner_meta = meta(owner)
    kind = kind_of(owner)[1]
    version = str(owner.get("apiVersion") or ("v1" if kind in ("", "Pod") else ""))
    owner_ref = {"apiVersion": version, "kind": kind or "Pod", "name": str(owner_meta.get("name") or ""),
                 "uid": str(owner_meta.get("uid") or "")}
    spec: dict[str, Any] = {}
    if d.min_subgroup is not None:
        spec["minSubGroup"] = d.min_subgroup
    else:
        spec["minMember"] = d.min_member if d.min_member is not None else 0
    spec["queue"] = d.queue
    spec["priorityClassName"] = d.priority_class
    if d.preemptibility:
        spec["preemptibility"] = d.preemptibility
    if d.topology:
        spec["topologyConstraint"] = dict(d.topology)
    if d.staleness_grace is not None:
        spec["stalenessGracePeriod"] = d.staleness_grace
    if d.preemption_delay is not None:
        spec["preemptionDelay"] = d.preemption_delay
    if d.subgroups:
        spec["subGroups"] = [sg.spec() for sg in d.subgroups]
    group_meta: dict[str, Any] = {"name": d.name, "namespace": namespace, "labels": dict(d.labels),
                                  "ownerReferences": [owner_ref]}
    created = owner_meta.get("creationTimestamp")
    if created:
        try:
            created_ns({"metadata": {"creationTimestamp": created}})
        except IngestError as exc:
            raise OwnerError(describe(owner), exc.path, exc.message) from None
        group_meta["creationTimestamp"] = created
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": group_meta, "spec": spec}
