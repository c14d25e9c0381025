"""KubeRay's controllers, as a scenario expands a RayCluster, RayJob or RayService. Pure.

A RayCluster's head pod `<cluster>-head` (labels `ray.io/node-type: head`, `ray.io/group:
headgroup`) and, per worker group that is not suspended, `replicas` (default: `minReplicas`)
times `numOfHosts` pods `<cluster>-<group>-worker-<index>` (`ray.io/group: <groupName>`), all
owned by the RayCluster. A RayJob's `spec.rayClusterSpec` becomes the RayCluster
`<rayjob>-raycluster`, a RayService's `spec.rayClusterConfig` the RayCluster
`<rayservice>-raycluster`, owned by it and named in its status (`rayClusterName`,
`activeServiceStatus.rayClusterName`), as KubeRay does. A RayJob's submitter Job is not
simulated, nor a RayJob's `clusterSelector` (an existing cluster).
"""

from __future__ import annotations

import copy
from typing import Any

from kai_es.controllers.base import Budget, Context, ExpandedPod, Expansion, made, pod_from_template, pods_count
from kai_es.ingest.groupers.base import dig, fail, items, mapping, name_of, text
from kai_es.ingest.groupers.ray import CLUSTER_LABEL, GROUP_LABEL, HEAD_GROUP, NODE_TYPE_LABEL


def cluster_pods(ctx: Context, top: dict[str, Any], cluster: dict[str, Any],
                 chain: tuple[dict[str, Any], ...]) -> list[ExpandedPod]:
    name = name_of(cluster)
    budget = Budget(ctx, top)
    base = {CLUSTER_LABEL: name, "ray.io/is-ray-node": "yes"}
    head = pod_from_template(ctx, cluster, dig(cluster, "spec", "headGroupSpec", "template"),
                             "spec.headGroupSpec.template", f"{name}-head", cluster,
                             labels={**base, NODE_TYPE_LABEL: "head", GROUP_LABEL: HEAD_GROUP})
    budget.take(1, "spec.headGroupSpec")
    pods = [ExpandedPod(head, (cluster, *chain))]
    for i, group in enumerate(items(cluster, dig(cluster, "spec", "workerGroupSpecs"), "spec.workerGroupSpecs")):
        path = f"spec.workerGroupSpecs[{i}]"
        group = mapping(cluster, group, path)
        if group.get("suspended") is True:
            continue
        minimum = pods_count(ctx, cluster, group.get("minReplicas"), f"{path}.minReplicas", default=0)
        replicas = pods_count(ctx, cluster, group.get("replicas"), f"{path}.replicas", default=minimum)
        hosts = pods_count(ctx, cluster, group.get("numOfHosts"), f"{path}.numOfHosts", default=1, minimum=1)
        gname = text(cluster, group.get("groupName"), f"{path}.groupName") or f"worker-group-{i}"
        budget.take(replicas * hosts, f"{path}.replicas")
        for k in range(replicas * hosts):
            pod = pod_from_template(ctx, cluster, group.get("template"), f"{path}.template",
                                    f"{name}-{gname}-worker-{k}", cluster,
                                    labels={**base, NODE_TYPE_LABEL: "worker", GROUP_LABEL: gname})
            pods.append(ExpandedPod(pod, (cluster, *chain)))
    return pods


def expand_raycluster(top: dict[str, Any], ctx: Context) -> Expansion:
    return Expansion([top], cluster_pods(ctx, top, top, ()))


def _owned_cluster(top: dict[str, Any], ctx: Context, field: str, status: dict[str, Any]) -> Expansion:
    """The RayCluster `top` makes from `spec.<field>`, and `top` with `status` (naming it) set."""
    spec = mapping(top, dig(top, "spec", field), f"spec.{field}")
    if not spec:
        if dig(top, "spec", "clusterSelector"):
            raise fail(top, "spec.clusterSelector", "a scenario expands only a RayJob's own rayClusterSpec")
        raise fail(top, f"spec.{field}", "is required")
    cluster = made(ctx, str(top.get("apiVersion")), "RayCluster", cluster_name(top), top, spec=spec)
    old = top.get("status")
    top = {**top, "status": {**(copy.deepcopy(old) if isinstance(old, dict) else {}), **status}}
    return Expansion([top, cluster], cluster_pods(ctx, top, cluster, (top,)))


def cluster_name(top: dict[str, Any]) -> str:
    return f"{name_of(top)}-raycluster"


def expand_rayjob(top: dict[str, Any], ctx: Context) -> Expansion:
    return _owned_cluster(top, ctx, "rayClusterSpec", {"rayClusterName": cluster_name(top)})


def expand_rayservice(top: dict[str, Any], ctx: Context) -> Expansion:
    return _owned_cluster(top, ctx, "rayClusterConfig",
                          {"activeServiceStatus": {"rayClusterName": cluster_name(top)}})
