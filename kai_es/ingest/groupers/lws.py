"""LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), as KAI's podgrouper groups it. Pure.

One PodGroup per replica group (a leader and its workers): `pg-<lws>-<uid>-group-<i>` by the
pod's `leaderworkerset.sigs.k8s.io/group-index` label. Minimum: `spec.leaderWorkerTemplate.size`
(`startupPolicy: LeaderCreated`, the default); with `LeaderReady`, 1 while the leader is not yet
bound (the controller creates the workers once it runs), else the size. Sub-groups `leader`
(1) and `workers` (the rest); with a segment size (`subGroupPolicy.subGroupSize`, else the
`kai.scheduler/segment-size` annotation of the LeaderWorkerSet, else of its worker template; more
than 1 and at most the size) the group is split into `segment-<i>` sub-groups by
`leaderworkerset.sigs.k8s.io/worker-index` (the leader is index 0): `LeaderWorker` (default) puts
the leader in the first segment, itself split into `leader` and `workers`; `LeaderExcluded`
(size - 1 divisible by the segment size) gives the leader a sub-group of its own. Segments take
the segment topology annotations.

One deviation from KAI: when the first segment is the only one and size - 1 is divisible by the
segment size, KAI counts the leader twice in that segment's minimum (a gang that can never be
complete); kai-es counts it once.
"""

from __future__ import annotations

from kai_es.ingest.groupers.base import (
    MAX_SEGMENTS,
    SEGMENT_SIZE,
    Decision,
    Obj,
    Source,
    SubGroup,
    annotations_of,
    count,
    default,
    dig,
    fail,
    labels,
    segment_topology,
    template_annotation,
    text,
)

GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
TEMPLATE = ("spec", "leaderWorkerTemplate")


def _worker_index(pod: Obj, *, required: bool) -> int | None:
    raw = labels(pod).get(WORKER_INDEX_LABEL)
    if raw is None and not required:
        return None
    return count(pod, raw, f"metadata.labels[{WORKER_INDEX_LABEL}]")


def _is_leader(pod: Obj) -> bool:
    return labels(pod).get(WORKER_INDEX_LABEL) == "0"


def lws_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    pod = src.pod
    size = count(top, dig(top, *TEMPLATE, "size"), "spec.leaderWorkerTemplate.size", minimum=1)
    policy = text(top, dig(top, "spec", "startupPolicy"), "spec.startupPolicy") or "LeaderCreated"
    _worker_index(pod, required=False)
    if policy == "LeaderReady":
        minimum = size
        raw = annotations_of(pod).get(SIZE_ANNOTATION)
        if raw is not None:
            minimum = count(pod, raw, f"metadata.annotations[{SIZE_ANNOTATION}]", minimum=1)
        if _is_leader(pod) and not dig(pod, "spec", "nodeName"):
            minimum = 1  # the workers come once the leader runs
    elif policy == "LeaderCreated":
        minimum = size
    else:
        raise fail(top, "spec.startupPolicy", f"unknown startup policy {policy!r} (LeaderCreated or LeaderReady)")
    subgroups, pod_subgroup = _subgroups(src, top, minimum)
    decision = default(top, pod, (top,))
    name = decision.name
    raw_group = labels(pod).get(GROUP_INDEX_LABEL)
    if raw_group is not None:
        name = f"{name}-group-{count(pod, raw_group, f'metadata.labels[{GROUP_INDEX_LABEL}]')}"
    return decision.with_(name=name, min_member=minimum, subgroups=tuple(subgroups), pod_subgroup=pod_subgroup)


def _segment_size(top: Obj, replicas: int) -> int | None:
    raw = dig(top, *TEMPLATE, "subGroupPolicy", "subGroupSize")
    where = "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize"
    if raw is None:
        raw = annotations_of(top).get(SEGMENT_SIZE)
        where = f"metadata.annotations[{SEGMENT_SIZE}]"
    if raw is None:
        template_path = "spec.leaderWorkerTemplate.workerTemplate"
        raw = template_annotation(top, dig(top, *TEMPLATE, "workerTemplate"), SEGMENT_SIZE, template_path) or None
        where = f"{template_path}.metadata.annotations[{SEGMENT_SIZE}]"
    if raw is None:
        return None
    size = count(top, raw, where)
    if size <= 1:
        raise fail(top, where, f"a segment size must be more than 1, got {size}")
    if size > replicas:
        raise fail(top, where, f"the segment size {size} is more than the group's {replicas} pods")
    return size


def _subgroups(src: Source, top: Obj, replicas: int) -> tuple[list[SubGroup], str]:
    pod = src.pod
    leader = _is_leader(pod)
    size = _segment_size(top, replicas)
    if size is None:
        out = [SubGroup("leader", min_member=1)]
        if replicas > 1:
            out.append(SubGroup("workers", min_member=replicas - 1))
        return out, "leader" if leader else ("workers" if replicas > 1 else "")
    policy = text(top, dig(top, *TEMPLATE, "subGroupPolicy", "subGroupPolicyType"),
                  "spec.leaderWorkerTemplate.subGroupPolicy.subGroupPolicyType") or "LeaderWorker"
    if policy not in ("LeaderWorker", "LeaderExcluded"):
        raise fail(top, "spec.leaderWorkerTemplate.subGroupPolicy.subGroupPolicyType",
                   f"unknown policy {policy!r} (LeaderWorker or LeaderExcluded)")
    divisible = (replicas - 1) % size == 0

    def segment_of(worker: int) -> int:
        if worker == 0:
            return 0  # the leader is in the first segment
        return (worker - 1) // size if divisible else worker // size

    n = segment_of(replicas - 1) + 1
    if n > MAX_SEGMENTS:
        raise fail(top, "spec.leaderWorkerTemplate", f"{n} segments: more than KAI's {MAX_SEGMENTS}")
    last = n - 1
    # the workers (and, unless the leader is counted apart below, the leader) of the last segment
    last_size = replicas - 1 - last * size if divisible else replicas - last * size
    topology = segment_topology(top, pod, dig(top, *TEMPLATE, "workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate")
    mins = [size] * n
    mins[last] = last_size
    worker = _worker_index(pod, required=True)
    assert worker is not None
    segment = segment_of(worker)
    segment_name = f"segment-{segment}" if segment < n else ""
    if policy == "LeaderExcluded":
        if not divisible:
            raise fail(top, "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize",
                       f"LeaderExcluded needs size - 1 ({replicas - 1}) divisible by the segment size ({size})")
        out = [SubGroup("leader", min_member=1)]
        out += [SubGroup(f"segment-{i}", min_member=mins[i], topology=topology) for i in range(n)]
        return out, "leader" if leader else segment_name
    if divisible:
        mins[0] += 1  # the leader joins the first segment
    out = [SubGroup("segment-0", min_subgroup=2, topology=topology)]
    out += [SubGroup(f"segment-{i}", min_member=mins[i], topology=topology) for i in range(1, n)]
    out += [SubGroup("leader", min_member=1, parent="segment-0"),
            SubGroup("workers", min_member=mins[0] - 1, parent="segment-0")]
    if leader:
        return out, "leader"
    return out, "workers" if segment == 0 else segment_name
