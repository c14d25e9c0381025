"""The Job controller's part of the Workload API, as a scenario emulates it when the cluster has
the WorkloadWithJob feature gate (Kubernetes 1.36, alpha; the scenario's
`spec.cluster.featureGates`). Pure.

What kube-controller-manager's Job controller does (pkg/controller/job, read for behaviour): a
Job whose `completionMode` is Indexed, whose `completions` equal its `parallelism` > 1 and whose
pod template names no `schedulingGroup` gets a `Workload` (one PodGroupTemplate, a gang of
`parallelism`) and a `PodGroup` made from it, both controlled by the Job, and each of its pods
names that PodGroup in `spec.schedulingGroup`. Here the two objects are named `<job>` and
`<job>-pgt-0` (the real controller adds hashes: names are not compared across the two paths).
"""

from __future__ import annotations

from typing import Any

from kai_es.controllers.base import Context, Expansion, made
from kai_es.ingest.groupers import workload_api as wa
from kai_es.ingest.groupers.base import dig, name_of, uid_of

GATE = "WorkloadWithJob"


def qualifies(job: dict[str, Any]) -> bool:
    """The Job controller's condition for a gang (IsGangSchedulingCandidate)."""
    parallelism, completions = dig(job, "spec", "parallelism"), dig(job, "spec", "completions")
    return (isinstance(parallelism, int) and not isinstance(parallelism, bool) and parallelism > 1
            and completions == parallelism and dig(job, "spec", "completionMode") == "Indexed"
            and dig(job, "spec", "template", "spec", "schedulingGroup") is None)


def apply(expansion: Expansion, ctx: Context) -> list[dict[str, Any]]:
    """Give every qualifying Job of `expansion` its Workload and PodGroup and point its pods at
    the PodGroup (the pods are changed in place); returns the Workloads and PodGroups made."""
    made_objects: list[dict[str, Any]] = []
    for job in expansion.objects:
        if (job.get("apiVersion"), job.get("kind")) != ("batch/v1", "Job") or not qualifies(job):
            continue
        template = f"{name_of(job)}-pgt-0"
        gang = {"gang": {"minCount": dig(job, "spec", "parallelism")}}
        workload = made(ctx, f"{wa.API_GROUP}/v1alpha2", "Workload", name_of(job), job, spec={
            "controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name_of(job)},
            "podGroupTemplates": [{"name": template, "schedulingPolicy": gang}]})
        group = made(ctx, wa.API_VERSION, wa.KIND, template, job, spec={
            "podGroupTemplateRef": {"workload": {"workloadName": name_of(job), "podGroupTemplateName": template}},
            "schedulingPolicy": gang})
        made_objects += [workload, group]
        for pod in expansion.pods:
            if pod.owners and uid_of(pod.owners[0]) == uid_of(job):
                pod.obj.setdefault("spec", {})["schedulingGroup"] = {"podGroupName": template}
    return made_objects
