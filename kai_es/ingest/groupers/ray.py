"""KubeRay's RayCluster, RayJob and RayService (ray.io/v1 and v1alpha1), as KAI's podgrouper
groups them. Pure.

One PodGroup per top owner, `pg-<owner>-<uid>`, from the RayCluster: the RayCluster itself, the
one a RayJob's `status.rayClusterName` names, or a RayService's
`status.activeServiceStatus.rayClusterName` (else `pendingServiceStatus`). Minimum: the head plus,
per worker group that is not suspended, `minReplicas` (else `replicas`) times `numOfHosts`.
Sub-groups: `headgroup` (1) and one per worker group (its `groupName`, else
`worker-group-<index>`) with that group's minimum, each under its template's topology
annotations; a pod goes to the one its `ray.io/group` label names (a pod without one, such as a
RayJob's submitter, is in the group but in no sub-group). The owner's `ray.io/priority-class-name`
label names the priority class, before any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kai_es.ingest.groupers.base import (
    Decision,
    Obj,
    OwnerError,
    Source,
    SubGroup,
    checked_sum,
    count,
    default,
    describe,
    dig,
    fail,
    items,
    labels,
    mapping,
    meta,
    template_topology,
    text,
)

GROUP_LABEL = "ray.io/group"
NODE_TYPE_LABEL = "ray.io/node-type"
CLUSTER_LABEL = "ray.io/cluster"
HEAD_GROUP = "headgroup"
PRIORITY_LABEL = "ray.io/priority-class-name"
RAYJOB_CLUSTER = (("status", "rayClusterName"),)
RAYSERVICE_CLUSTER = (("status", "activeServiceStatus", "rayClusterName"),
                      ("status", "pendingServiceStatus", "rayClusterName"))


def cluster_name(top: Obj, paths: tuple[tuple[str, ...], ...]) -> str:
    """The RayCluster a RayJob or RayService names in its status ("" when none yet)."""
    for path in paths:
        value = dig(top, *path)
        if value:
            return text(top, value, ".".join(path))
    return ""


def _worker_group(cluster: Obj, index: int, spec: Any) -> tuple[str, int, Mapping[str, str] | None] | None:
    """(name, minimum, topology) of a worker group, or None when it has no pods to wait for."""
    path = f"spec.workerGroupSpecs[{index}]"
    spec = mapping(cluster, spec, path)
    if spec.get("suspended") is True:
        return None
    replicas = count(cluster, spec.get("replicas"), f"{path}.replicas", default=0)
    min_replicas = count(cluster, spec.get("minReplicas"), f"{path}.minReplicas", default=0)
    if min_replicas > replicas:
        raise fail(cluster, f"{path}.minReplicas", f"{min_replicas} is more than the group's {replicas} replicas")
    if replicas == 0 and min_replicas == 0:
        return None
    hosts = count(cluster, spec.get("numOfHosts"), f"{path}.numOfHosts", default=1)
    minimum = checked_sum(cluster, [(min_replicas or replicas) * hosts], f"{path}.replicas")
    name = text(cluster, spec.get("groupName"), f"{path}.groupName") or f"worker-group-{index}"
    return name, minimum, _topology(cluster, spec.get("template"), f"{path}.template")


def _topology(cluster: Obj, template: Any, path: str) -> Mapping[str, str] | None:
    found = template_topology(cluster, template, path)
    if found is None:
        levels = [dig(template, "metadata", "annotations", k) for k in
                  ("kai.scheduler/topology-required-placement", "kai.scheduler/topology-preferred-placement")]
        if any(levels):
            raise fail(cluster, f"{path}.metadata.annotations[kai.scheduler/topology]",
                       "is required with the topology placement annotations")
    return found


def ray_decision(src: Source, top: Obj, cluster: Obj) -> Decision:
    head_topology = _topology(cluster, dig(cluster, "spec", "headGroupSpec", "template"), "spec.headGroupSpec.template")
    subgroups = [SubGroup(HEAD_GROUP, min_member=1, topology=head_topology)]
    for i, spec in enumerate(items(cluster, dig(cluster, "spec", "workerGroupSpecs"), "spec.workerGroupSpecs")):
        group = _worker_group(cluster, i, spec)
        if group is not None:
            name, minimum, topology = group
            subgroups.append(SubGroup(name, min_member=minimum, topology=topology))
    minimum = checked_sum(cluster, [sg.min_member or 0 for sg in subgroups], "spec.workerGroupSpecs")
    decision = default(top, src.pod, (top,)).with_(min_member=minimum, subgroups=tuple(subgroups))
    priority = labels(top).get(PRIORITY_LABEL)
    if priority is not None:
        decision = decision.with_(priority_class=priority)
    pod_group = labels(src.pod).get(GROUP_LABEL, "")
    if any(sg.name == pod_group for sg in subgroups):
        decision = decision.with_(pod_subgroup=pod_group)
    return decision


def raycluster_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    return ray_decision(src, top, top)


def _named_cluster(src: Source, top: Obj, paths: tuple[tuple[str, ...], ...]) -> Decision:
    name = cluster_name(top, paths)
    if not name:
        raise fail(top, ".".join(paths[0]), "names no RayCluster yet (the operator sets it when it creates one)")
    cluster = src.related.get(("RayCluster", name))
    if cluster is None:
        raise OwnerError(describe(top), ".".join(paths[0]), f"RayCluster {meta(top).get('namespace')}/{name} "
                                                            "was not found")
    return ray_decision(src, top, cluster)


def rayjob_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    return _named_cluster(src, top, RAYJOB_CLUSTER)


def rayservice_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    return _named_cluster(src, top, RAYSERVICE_CLUSTER)


def rayjob_related(top: Obj) -> list[tuple[str, str]]:
    name = cluster_name(top, RAYJOB_CLUSTER)
    return [("RayCluster", name)] if name else []


def rayservice_related(top: Obj) -> list[tuple[str, str]]:
    name = cluster_name(top, RAYSERVICE_CLUSTER)
    return [("RayCluster", name)] if name else []
