"""Pods that name a Kubernetes PodGroup: the Workload API (KEP-4671; Kubernetes 1.36 serves it
as `scheduling.k8s.io/v1alpha2` behind the GenericWorkload feature gate). Pure.

In Kubernetes 1.36 a pod joins a gang by `spec.schedulingGroup.podGroupName`, the name of a
`PodGroup` (scheduling.k8s.io/v1alpha2) in its namespace; the PodGroup carries the policy
(`spec.schedulingPolicy.gang.minCount`, or `basic`), usually copied from a `Workload`'s
`podGroupTemplates` by the controller that made it (the Job controller does so under the
WorkloadWithJob feature gate, for an Indexed Job whose completions equal its parallelism > 1).

KAI's design for the API (docs/developer/designs/k8s-workload-api, written for 1.35's
`workloadRef`; KAI's podgrouper has no code for it yet) is followed where it carries over: the
owner rule decides first, then the Workload API's group overrides it, field by field:
- one KAI PodGroup per Kubernetes PodGroup (KAI's design: one per Workload pod group and replica
  key, which is what a 1.36 PodGroup object is), named `pg-<podgroup>-<uid>`, owned by that
  PodGroup (its creationTimestamp is the gang's age), without sub-groups (the API has none);
- minMember: `gang.minCount`; a `basic` policy is one group of minimum 1 (KAI's design);
- queue: the PodGroup's `kai.scheduler/queue` label, else the owner rule's; priority class: the
  PodGroup's `spec.priorityClassName`, else its `priorityClassName` label, else the owner
  rule's; preemptibility, preemption delay, staleness grace and the three topology annotations:
  the PodGroup's, else the owner rule's; labels: merged, the PodGroup's winning;
- `spec.schedulingConstraints.topology[].key` (a node label) is the required topology level of
  the Topology that `kai.scheduler/topology` names (on the PodGroup, else the workload): kai-es
  places a gang within one domain of a named Topology, so a key without one is refused with the
  field named, never dropped silently; at most one key.
Not followed from KAI's design: a missing PodGroup is not a pod of its own (the pod waits,
rejected with the reason, until the PodGroup appears: `missing`), as KAI's design says too.

Opt-outs: `kai.scheduler/ignore-workload-api: "true"` on the pod or any owner (KAI's design)
keeps the owner rule's group. kai-es also keeps the owner rule's group where the PodGroup is the
Job controller's (its controller reference a batch Job) and the Job belongs to a workload whose
rule gangs several Jobs as one (a JobSet, a TrainJob): the Job controller makes one PodGroup per
Job, which would split the JobSet's gang into independent ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kai_es.ingest.groupers.base import (
    PREEMPTION_DELAY_ANNOTATION,
    PRIORITY_LABEL,
    STALENESS_ANNOTATION,
    TOPOLOGY,
    Decision,
    Obj,
    OwnerError,
    annotations_of,
    api_group,
    count,
    describe,
    dig,
    duration_of,
    fail,
    group_name,
    items,
    labels,
    mapping,
    meta,
    text,
    topology_of,
)
from kai_es.ingest.translate import PREEMPTIBILITY_LABEL, PREEMPTIBILITY_MODES, QUEUE_LABEL

API_GROUP = "scheduling.k8s.io"
API_VERSION = "scheduling.k8s.io/v1alpha2"
KIND = "PodGroup"
#: the `related` key a pod's Kubernetes PodGroup is passed under: ("PodGroup", name)
RELATED_KIND = "scheduling.k8s.io/PodGroup"
IGNORE_ANNOTATION = "kai.scheduler/ignore-workload-api"
#: top owners whose rule gangs several batch Jobs as one group
MULTI_JOB_KINDS = frozenset({("jobset.x-k8s.io", "JobSet"), ("trainer.kubeflow.org", "TrainJob")})


def podgroup_name(pod: Obj) -> str | None:
    """The PodGroup `pod` names in `spec.schedulingGroup.podGroupName`, or None; a malformed
    field raises OwnerError naming it."""
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    if group is None:
        return None
    if not isinstance(group, Mapping):
        raise fail(pod, "spec.schedulingGroup", f"must be a map, got {type(group).__name__}")
    name = group.get("podGroupName")
    if not isinstance(name, str) or not name:
        raise fail(pod, "spec.schedulingGroup.podGroupName", f"must be a PodGroup's name, got {name!r}"[:200])
    return name


def wanted(pod: Obj, owners: Sequence[Obj]) -> str | None:
    """The Kubernetes PodGroup whose group `pod` joins (None: the owner rule decides alone)."""
    name = podgroup_name(pod)
    if name is None or any(annotations_of(o).get(IGNORE_ANNOTATION) == "true" for o in (pod, *owners)):
        return None
    return name


def _made_for_a_job(k8s_group: Obj) -> bool:
    refs = meta(k8s_group).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(r, Mapping) and r.get("controller") is True and r.get("kind") == "Job"
        and str(r.get("apiVersion", "")).startswith("batch/") for r in refs)


def _gangs_jobs(owners: Sequence[Obj]) -> bool:
    return any((api_group(o), str(o.get("kind") or "")) in MULTI_JOB_KINDS for o in owners)


def _min_member(k8s_group: Obj) -> int:
    policy = mapping(k8s_group, dig(k8s_group, "spec", "schedulingPolicy"), "spec.schedulingPolicy")
    gang, basic = policy.get("gang"), policy.get("basic")
    if (gang is None) == (basic is None):
        raise fail(k8s_group, "spec.schedulingPolicy", "needs exactly one of basic and gang")
    if basic is not None:
        mapping(k8s_group, basic, "spec.schedulingPolicy.basic")
        return 1
    gang = mapping(k8s_group, gang, "spec.schedulingPolicy.gang")
    return count(k8s_group, gang.get("minCount"), "spec.schedulingPolicy.gang.minCount", minimum=1)


def _topology(k8s_group: Obj, base: Mapping[str, str]) -> dict[str, str]:
    out = dict(base)
    out.update(topology_of(k8s_group))
    constraints = mapping(k8s_group, dig(k8s_group, "spec", "schedulingConstraints"), "spec.schedulingConstraints")
    keys = items(k8s_group, constraints.get("topology"), "spec.schedulingConstraints.topology")
    if not keys:
        return out
    path = "spec.schedulingConstraints.topology"
    if len(keys) > 1:
        raise fail(k8s_group, path, f"kai-es honours one topology key, got {len(keys)}")
    key = text(k8s_group, mapping(k8s_group, keys[0], f"{path}[0]").get("key"), f"{path}[0].key")
    if not key:
        raise fail(k8s_group, f"{path}[0].key", "is required")
    if not out.get("topology"):
        raise fail(k8s_group, path, f"the key {key!r} is a level of a Topology: name it with the "
                                    f"{TOPOLOGY} annotation (on the PodGroup or its workload)")
    out["requiredTopologyLevel"] = key
    return out


def override(decision: Decision, k8s_group: Obj, pod: Obj, owners: Sequence[Obj]) -> Decision:
    """`decision` (the owner rule's) with the Kubernetes PodGroup's fields (module docstring);
    unchanged where the PodGroup is the Job controller's for a Job of a multi-Job workload."""
    if _made_for_a_job(k8s_group) and _gangs_jobs(owners):
        return decision
    ns_pod, ns_group = str(meta(pod).get("namespace") or "default"), str(meta(k8s_group).get("namespace") or "default")
    if ns_pod != ns_group:
        raise OwnerError(describe(pod), "spec.schedulingGroup.podGroupName",
                         f"names {describe(k8s_group)}, of another namespace")
    group_labels = labels(k8s_group)
    priority = text(k8s_group, dig(k8s_group, "spec", "priorityClassName"), "spec.priorityClassName") \
        or group_labels.get(PRIORITY_LABEL, "") or decision.priority_class
    preemptibility = group_labels.get(PREEMPTIBILITY_LABEL)
    return decision.with_(
        name=group_name(k8s_group), owner=k8s_group, labels={**decision.labels, **group_labels},
        queue=group_labels.get(QUEUE_LABEL) or decision.queue, priority_class=priority,
        min_member=_min_member(k8s_group), min_subgroup=None, subgroups=(), pod_subgroup="",
        preemptibility=preemptibility if preemptibility in PREEMPTIBILITY_MODES else decision.preemptibility,
        preemption_delay=_group_duration(k8s_group, PREEMPTION_DELAY_ANNOTATION, decision.preemption_delay),
        staleness_grace=_group_duration(k8s_group, STALENESS_ANNOTATION, decision.staleness_grace),
        topology=_topology(k8s_group, decision.topology))


def _group_duration(k8s_group: Obj, key: str, base: str | None) -> str | None:
    if key not in annotations_of(k8s_group):
        return base
    return duration_of((k8s_group,), {}, key, signed=key == STALENESS_ANNOTATION)


def missing(pod: Obj, name: str) -> OwnerError:
    """The error of a pod whose PodGroup does not exist (yet): it is not scheduled alone."""
    return OwnerError(describe(pod), "spec.schedulingGroup.podGroupName",
                      f"PodGroup {name!r} ({API_VERSION}) does not exist (yet): the pod waits for it")


__all__ = ["API_GROUP", "API_VERSION", "IGNORE_ANNOTATION", "KIND", "RELATED_KIND", "missing", "override",
           "podgroup_name", "wanted"]
