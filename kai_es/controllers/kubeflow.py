"""Kubeflow's controllers, as a scenario expands their workloads. Pure.

- The training operator's jobs (PyTorchJob, TFJob, XGBoostJob, JAXJob, PaddleJob, and the v1
  MPIJob): per replica type, `replicas` pods (default 1) named `<job>-<type>-<index>` (lower
  case), the master-like type (Master, Chief, Launcher) first, labelled
  `training.kubeflow.org/{job-name,replica-type,replica-index}` (and `job-role: master`), owned
  by the job.
- MPIJob v2beta1 (mpi-operator): the launcher is a Job `<job>-launcher` (its pod
  `<job>-launcher-0`), the workers pods `<job>-worker-<index>` owned by the MPIJob, labelled
  `training.kubeflow.org/job-role` launcher / worker. The launcher is created with the workers,
  even with `launcherCreationPolicy: WaitForWorkersReady` (the simulation has no readiness).
- Notebook: a StatefulSet `<notebook>` and its pod `<notebook>-0`.
- TrainJob (Kubeflow Trainer v2): the JobSet its runtime (a TrainingRuntime or
  ClusterTrainingRuntime document of the scenario, `spec.runtimeRef`) describes, named after the
  TrainJob: the runtime's `spec.template`, with `spec.trainer.numNodes` as the parallelism and
  completions of its `node` replicated job, `resourcesPerNode` and `image` on that job's `node`
  container, and `spec.labels` / `spec.annotations` on the JobSet; then that JobSet's Jobs and pods.
"""

from __future__ import annotations

import copy
from typing import Any

from kai_es.controllers.base import Budget, Context, ExpandedPod, Expansion, made, pod_from_template, pods_count
from kai_es.controllers.core import job_pods
from kai_es.controllers.jobset import jobset_pods
from kai_es.ingest.groupers.base import OwnerError, describe, dig, fail, mapping, name_of, text
from kai_es.ingest.groupers.kubeflow import JOB_NAME_LABEL, JOB_ROLE_LABEL, REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL

OPERATOR_LABEL = "training.kubeflow.org/operator-name"
REPLICA_FIELDS = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "XGBoostJob": "xgbReplicaSpecs",
                  "JAXJob": "jaxReplicaSpecs", "PaddleJob": "paddleReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}
MASTER_TYPES = ("Master", "Chief", "Launcher")


def expand_training_job(top: dict[str, Any], ctx: Context) -> Expansion:
    kind = str(top.get("kind"))
    if kind == "MPIJob" and str(top.get("apiVersion", "")).endswith("/v2beta1"):
        return _expand_mpi_v2(top, ctx)
    field = REPLICA_FIELDS[kind]
    specs = mapping(top, dig(top, "spec", field), f"spec.{field}")
    if not specs:
        raise fail(top, f"spec.{field}", "is required")
    budget = Budget(ctx, top)
    pods = []
    for rtype in sorted(specs, key=lambda t: (t not in MASTER_TYPES, t)):
        path = f"spec.{field}.{rtype}"
        mapping(top, specs[rtype], path)
        n = budget.take(pods_count(ctx, top, dig(specs, rtype, "replicas"), f"{path}.replicas", default=1),
                        f"{path}.replicas")
        role = str(rtype).lower()
        for i in range(n):
            extra = {JOB_NAME_LABEL: name_of(top), REPLICA_TYPE_LABEL: role, REPLICA_INDEX_LABEL: str(i),
                     OPERATOR_LABEL: f"{kind.lower()}-controller"}
            if rtype in MASTER_TYPES:
                extra[JOB_ROLE_LABEL] = "master"
            pod = pod_from_template(ctx, top, dig(specs, rtype, "template"), f"{path}.template",
                                    f"{name_of(top)}-{role}-{i}", top, labels=extra)
            pods.append(ExpandedPod(pod, (top,)))
    return Expansion([top], pods)


def _expand_mpi_v2(top: dict[str, Any], ctx: Context) -> Expansion:
    field = "mpiReplicaSpecs"
    budget = Budget(ctx, top)
    base = {JOB_NAME_LABEL: name_of(top), OPERATOR_LABEL: "mpi-operator"}
    launcher_spec = mapping(top, dig(top, "spec", field, "Launcher"), f"spec.{field}.Launcher")
    if not launcher_spec:
        raise fail(top, f"spec.{field}.Launcher", "is required")
    launcher = made(ctx, "batch/v1", "Job", f"{name_of(top)}-launcher", top,
                    labels={**base, JOB_ROLE_LABEL: "launcher"},
                    spec={"parallelism": 1, "completions": 1, "template": launcher_spec.get("template")})
    pods = job_pods(ctx, top, launcher, f"spec.{field}.Launcher", budget, (top,),
                    labels={**base, JOB_ROLE_LABEL: "launcher"})
    path = f"spec.{field}.Worker"
    n = budget.take(pods_count(ctx, top, dig(top, "spec", field, "Worker", "replicas"), f"{path}.replicas",
                               default=0), f"{path}.replicas")
    for i in range(n):
        extra = {**base, JOB_ROLE_LABEL: "worker", REPLICA_INDEX_LABEL: str(i)}
        pod = pod_from_template(ctx, top, dig(top, "spec", field, "Worker", "template"), f"{path}.template",
                                f"{name_of(top)}-worker-{i}", top, labels=extra)
        pods.append(ExpandedPod(pod, (top,)))
    return Expansion([top, launcher], pods)


def expand_notebook(top: dict[str, Any], ctx: Context) -> Expansion:
    template = dig(top, "spec", "template")
    sts = made(ctx, "apps/v1", "StatefulSet", name_of(top), top, labels={"notebook-name": name_of(top)},
               spec={"replicas": 1, "template": template})
    name = f"{name_of(top)}-0"
    pod = pod_from_template(ctx, top, template, "spec.template", name, sts,
                            labels={"notebook-name": name_of(top), "statefulset": name_of(top),
                                    "statefulset.kubernetes.io/pod-name": name})
    return Expansion([top, sts], [ExpandedPod(pod, (sts, top))])


def expand_trainjob(top: dict[str, Any], ctx: Context) -> Expansion:
    ref = mapping(top, dig(top, "spec", "runtimeRef"), "spec.runtimeRef")
    runtime_name = text(top, ref.get("name"), "spec.runtimeRef.name")
    runtime_kind = text(top, ref.get("kind"), "spec.runtimeRef.kind") or "ClusterTrainingRuntime"
    if not runtime_name:
        raise fail(top, "spec.runtimeRef.name", "is required")
    ns = "" if runtime_kind == "ClusterTrainingRuntime" else str(dig(top, "metadata", "namespace") or "default")
    runtime = ctx.references.get((runtime_kind, ns, runtime_name))
    if runtime is None:
        raise OwnerError(describe(top), "spec.runtimeRef",
                         f"{runtime_kind} {runtime_name!r} is not in the scenario (a TrainJob's pods come from its runtime)")
    template = mapping(runtime, dig(runtime, "spec", "template"), "spec.template")
    spec = copy.deepcopy(dict(mapping(runtime, template.get("spec"), "spec.template.spec")))
    trainer = mapping(top, dig(top, "spec", "trainer"), "spec.trainer")
    nodes = trainer.get("numNodes", dig(runtime, "spec", "mlPolicy", "numNodes"))
    for job in spec.get("replicatedJobs") or []:
        if not isinstance(job, dict) or job.get("name") != "node":
            continue
        job_spec = job.setdefault("template", {}).setdefault("spec", {})
        if nodes is not None:
            n = pods_count(ctx, top, nodes, "spec.trainer.numNodes", minimum=1)
            job_spec["parallelism"] = job_spec["completions"] = n
        for container in dig(job_spec, "template", "spec", "containers") or []:
            if isinstance(container, dict) and container.get("name") == "node":
                if trainer.get("resourcesPerNode") is not None:
                    container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
                if trainer.get("image") is not None:
                    container["image"] = trainer["image"]
    tmeta = mapping(runtime, template.get("metadata"), "spec.template.metadata")
    labels = {**mapping(runtime, tmeta.get("labels"), "spec.template.metadata.labels"),
              **mapping(top, dig(top, "spec", "labels"), "spec.labels")}
    annotations = {**mapping(runtime, tmeta.get("annotations"), "spec.template.metadata.annotations"),
                   **mapping(top, dig(top, "spec", "annotations"), "spec.annotations")}
    jobset = made(ctx, "jobset.x-k8s.io/v1alpha2", "JobSet", name_of(top), top, labels=labels,
                  annotations=annotations, spec=spec)
    jobs, pods = jobset_pods(ctx, top, jobset, (top,))
    return Expansion([top, jobset, *jobs], pods)


__all__ = ["expand_notebook", "expand_trainjob", "expand_training_job", "pod_from_template"]
