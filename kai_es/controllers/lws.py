"""The LeaderWorkerSet controller, as a scenario expands a LeaderWorkerSet. Pure.

A leader StatefulSet `<lws>` owned by the LeaderWorkerSet; per replica group `g` (`spec.replicas`,
default 1) its leader pod `<lws>-<g>` (the leader template, else the worker template) and a worker
StatefulSet `<lws>-<g>` owned by that leader pod, with workers `<lws>-<g>-<w>` for w = 1 … size-1.
Pods carry `leaderworkerset.sigs.k8s.io/{name,group-index,worker-index}` and the `size`
annotation, as the controller sets them. The workers are created with the leader, even with
`startupPolicy: LeaderReady` (the simulation has no readiness).
"""

from __future__ import annotations

from typing import Any

from kai_es.controllers.base import Budget, Context, ExpandedPod, Expansion, made, pod_from_template, pods_count
from kai_es.ingest.groupers.base import dig, name_of
from kai_es.ingest.groupers.lws import GROUP_INDEX_LABEL, NAME_LABEL, SIZE_ANNOTATION, WORKER_INDEX_LABEL


def expand_lws(top: dict[str, Any], ctx: Context) -> Expansion:
    name = name_of(top)
    groups = pods_count(ctx, top, dig(top, "spec", "replicas"), "spec.replicas", default=1)
    size = pods_count(ctx, top, dig(top, "spec", "leaderWorkerTemplate", "size"), "spec.leaderWorkerTemplate.size",
                      default=1, minimum=1)
    budget = Budget(ctx, top)
    worker_template = dig(top, "spec", "leaderWorkerTemplate", "workerTemplate")
    leader_template = dig(top, "spec", "leaderWorkerTemplate", "leaderTemplate")
    leader_path = "spec.leaderWorkerTemplate.leaderTemplate"
    if leader_template is None:
        leader_template, leader_path = worker_template, "spec.leaderWorkerTemplate.workerTemplate"
    leaders = made(ctx, "apps/v1", "StatefulSet", name, top, labels={NAME_LABEL: name},
                   spec={"replicas": groups})
    objects: list[dict[str, Any]] = [top, leaders]
    pods = []
    for g in range(groups):
        budget.take(size, "spec.leaderWorkerTemplate.size")
        base = {NAME_LABEL: name, GROUP_INDEX_LABEL: str(g)}
        annotations = {SIZE_ANNOTATION: str(size)}
        leader = pod_from_template(ctx, top, leader_template, leader_path, f"{name}-{g}", leaders,
                                   labels={**base, WORKER_INDEX_LABEL: "0"}, annotations=annotations)
        pods.append(ExpandedPod(leader, (leaders, top)))
        if size == 1:
            continue
        workers = made(ctx, "apps/v1", "StatefulSet", f"{name}-{g}", leader, labels=base,
                       spec={"replicas": size - 1})
        objects += [leader, workers]
        for w in range(1, size):
            pod = pod_from_template(ctx, top, worker_template, "spec.leaderWorkerTemplate.workerTemplate",
                                    f"{name}-{g}-{w}", workers, labels={**base, WORKER_INDEX_LABEL: str(w)},
                                    annotations=annotations)
            pods.append(ExpandedPod(pod, (workers, leader, leaders, top)))
    return Expansion(objects, pods)
