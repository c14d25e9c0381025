"""Kubeflow's training jobs and notebooks (kubeflow.org), as KAI's podgrouper groups them. Pure.

One PodGroup per job, `pg-<job>-<uid>`, priority class `train`:
- minimum: `spec.runPolicy.schedulingPolicy.minAvailable`, else every replica of every replica
  type (each type must state a non-zero `replicas`; MPIJob needs `Launcher` and `Worker`,
  XGBoostJob `Master` and `Worker`, JAXJob `Worker`).
- PyTorchJob: `spec.elasticPolicy.minReplicas`, then `minAvailable`, override it; sub-groups
  `master` (its replicas) and `worker` (the rest of the minimum), pods by their
  `training.kubeflow.org/replica-type` label. A `kai.scheduler/segment-size` annotation on the
  Worker template (or pod) splits `worker` into segments `worker-<i>` of that many pods by
  `training.kubeflow.org/replica-index`, each under the segment topology annotations; segments
  beyond the minimum get minimum 0 (elastic).
- MPIJob with `launcherCreationPolicy: WaitForWorkersReady`: while no launcher pod exists the
  minimum leaves the launcher out (the operator creates it once the workers are ready).
- Notebook (v1beta1): one group at priority class `build`.
"""

from __future__ import annotations

from kai_es.ingest.groupers.base import (
    BUILD,
    MAX_SEGMENTS,
    SEGMENT_SIZE,
    Decision,
    Obj,
    Rule,
    Source,
    SubGroup,
    annotations_of,
    checked_sum,
    count,
    default,
    describe,
    dig,
    fail,
    labels,
    mapping,
    meta,
    name_of,
    segment_topology,
    template_annotation,
    top_priority,
)

REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
MIN_AVAILABLE_PATH = ("spec", "runPolicy", "schedulingPolicy", "minAvailable")


def replica_specs(top: Obj, field: str) -> dict[str, object]:
    specs = mapping(top, dig(top, "spec", field), f"spec.{field}")
    if not specs:
        raise fail(top, f"spec.{field}", f"a {top.get('kind')} needs its replica specs")
    return dict(specs)


def replicas_of(top: Obj, field: str, rtype: str, *, default_: int | None = None, minimum: int = 0) -> int:
    return count(top, dig(top, "spec", field, rtype, "replicas"), f"spec.{field}.{rtype}.replicas",
                 minimum=minimum, default=default_)


def distributed_minimum(top: Obj, field: str, mandatory: tuple[str, ...] = ()) -> int:
    """KAI's Kubeflow minimum: minAvailable, else the sum of every replica type's replicas."""
    available = dig(top, *MIN_AVAILABLE_PATH)
    if available is not None:
        return count(top, available, ".".join(MIN_AVAILABLE_PATH))
    specs = replica_specs(top, field)
    for name in mandatory:
        if name not in specs:
            raise fail(top, f"spec.{field}.{name}", f"a {top.get('kind')} needs a {name} replica spec")
    total = [replicas_of(top, field, rtype, minimum=1) for rtype in sorted(specs)]
    return checked_sum(top, total, f"spec.{field}")


def distributed(field: str, mandatory: tuple[str, ...] = ()) -> Rule:
    def rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
        return default(top, src.pod, (top,)).with_(min_member=distributed_minimum(top, field, mandatory))
    return rule


tfjob_rule = distributed("tfReplicaSpecs")
xgboostjob_rule = distributed("xgbReplicaSpecs", ("Master", "Worker"))
jaxjob_rule = distributed("jaxReplicaSpecs", ("Worker",))


# -- PyTorchJob -------------------------------------------------------------------------------

PYTORCH = "pytorchReplicaSpecs"


def pytorchjob_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    pod = src.pod
    minimum = distributed_minimum(top, PYTORCH)
    elastic = dig(top, "spec", "elasticPolicy", "minReplicas")
    if elastic is not None:
        minimum = count(top, elastic, "spec.elasticPolicy.minReplicas")
    available = dig(top, *MIN_AVAILABLE_PATH)
    if available is not None:
        minimum = count(top, available, ".".join(MIN_AVAILABLE_PATH))
    specs = replica_specs(top, PYTORCH)
    role = labels(pod).get(REPLICA_TYPE_LABEL, "")
    subgroups: list[SubGroup] = []
    pod_subgroup = ""
    masters = replicas_of(top, PYTORCH, "Master", default_=0) if "Master" in specs else 0
    if masters:
        subgroups.append(SubGroup("master", min_member=masters))
        pod_subgroup = "master" if role == "master" else ""
    if "Worker" in specs:
        workers = replicas_of(top, PYTORCH, "Worker", default_=1)
        worker_min = max(0, minimum - masters)
        segments, segment = _worker_segments(src, top, workers, worker_min)
        subgroups += segments
        if role == "worker":
            pod_subgroup = segment
    return default(top, pod, (top,)).with_(min_member=minimum, subgroups=tuple(subgroups),
                                          pod_subgroup=pod_subgroup)


def _worker_segments(src: Source, top: Obj, workers: int, worker_min: int) -> tuple[list[SubGroup], str]:
    """The worker sub-group(s), and which one the pod is in (if it is a worker)."""
    pod = src.pod
    template = dig(top, "spec", PYTORCH, "Worker", "template")
    template_path = f"spec.{PYTORCH}.Worker.template"
    raw = annotations_of(pod).get(SEGMENT_SIZE) or None
    where, obj = f"metadata.annotations[{SEGMENT_SIZE}]", pod
    if raw is None:
        raw = template_annotation(top, template, SEGMENT_SIZE, template_path) or None
        where, obj = f"{template_path}.metadata.annotations[{SEGMENT_SIZE}]", top
    if raw is None:
        return [SubGroup("worker", min_member=worker_min)], "worker"
    size = count(obj, raw, where, minimum=1)
    n = -(-workers // size)
    if n > MAX_SEGMENTS:
        raise fail(obj, where, f"{n} segments of {size} workers: more than KAI's {MAX_SEGMENTS}")
    if n == 0:
        return [SubGroup("worker", min_member=worker_min)], "worker"
    topology = segment_topology(top, pod, template, template_path)
    mandatory = -(-worker_min // size)
    partial = workers % size
    out = [SubGroup("worker", min_subgroup=n)]
    for i in range(n):
        need = size if i < mandatory else 0
        if i < mandatory and partial and i == n - 1:
            need = partial
        out.append(SubGroup(f"worker-{i}", min_member=need, parent="worker", topology=topology))
    if labels(pod).get(REPLICA_TYPE_LABEL) != "worker":
        return out, ""
    index = count(pod, labels(pod).get(REPLICA_INDEX_LABEL), f"metadata.labels[{REPLICA_INDEX_LABEL}]")
    segment = index // size
    return out, f"worker-{segment}" if segment < n else ""


# -- MPIJob -------------------------------------------------------------------------------

MPI = "mpiReplicaSpecs"


def mpijob_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    minimum = distributed_minimum(top, MPI, ("Launcher", "Worker"))
    if dig(top, "spec", "launcherCreationPolicy") == "WaitForWorkersReady" and not _launcher_exists(src, top):
        launchers = replicas_of(top, MPI, "Launcher", minimum=1)
        minimum = max(0, minimum - launchers)
    return default(top, src.pod, (top,)).with_(min_member=minimum)


def _launcher_exists(src: Source, top: Obj) -> bool:
    selector = {JOB_NAME_LABEL: name_of(top), JOB_ROLE_LABEL: "launcher"}
    pod_labels = labels(src.pod)
    if all(pod_labels.get(k) == v for k, v in selector.items()) and meta(src.pod).get("deletionTimestamp") is None:
        return True
    return src.pods.has_pod(str(meta(src.pod).get("namespace") or "default"), selector)


# -- Notebook ---------------------------------------------------------------------------------

def notebook_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    return default(top, src.pod, (top,)).with_(priority_class=top_priority(top, src.pod, BUILD))


__all__ = ["JOB_NAME_LABEL", "JOB_ROLE_LABEL", "REPLICA_INDEX_LABEL", "REPLICA_TYPE_LABEL", "describe",
           "jaxjob_rule", "mpijob_rule", "notebook_rule", "pytorchjob_rule", "tfjob_rule", "xgboostjob_rule"]
