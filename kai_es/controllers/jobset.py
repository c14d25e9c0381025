"""The JobSet controller, as a scenario expands a JobSet (jobset.x-k8s.io/v1alpha2). Pure.

Per replicated job, `replicas` Jobs (default 1) named `<jobset>-<replicated job>-<index>`, owned
by the JobSet, each with the replicated job's template; per Job its pods (`parallelism`, default
1) named `<job>-<index>`, labelled `jobset.sigs.k8s.io/{jobset-name,replicatedjob-name,job-index}`
as the controller labels them (the podgrouper routes a pod to its sub-group by those).
"""

from __future__ import annotations

from typing import Any

from kai_es.controllers.base import Budget, Context, ExpandedPod, Expansion, made, pods_count
from kai_es.controllers.core import job_pods
from kai_es.ingest.groupers.base import dig, fail, items, mapping, name_of, text
from kai_es.ingest.groupers.jobset import JOB_INDEX_LABEL, JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL


def jobset_pods(ctx: Context, top: dict[str, Any], jobset: dict[str, Any], chain: tuple[dict[str, Any], ...],
                ) -> tuple[list[dict[str, Any]], list[ExpandedPod]]:
    """The Jobs and pods of `jobset` (errors name its fields); `chain`: the owners above it;
    pods count against `top`'s budget."""
    budget = Budget(ctx, top)
    jobs, pods = [], []
    for i, rjob in enumerate(items(jobset, dig(jobset, "spec", "replicatedJobs"), "spec.replicatedJobs")):
        path = f"spec.replicatedJobs[{i}]"
        mapping(jobset, rjob, path)
        rname = text(jobset, dig(rjob, "name"), f"{path}.name")
        if not rname:
            raise fail(jobset, f"{path}.name", "is required")
        template = mapping(jobset, dig(rjob, "template"), f"{path}.template")
        tmeta = mapping(jobset, template.get("metadata"), f"{path}.template.metadata")
        replicas = pods_count(ctx, jobset, dig(rjob, "replicas"), f"{path}.replicas", default=1)
        for j in range(replicas):
            labels = {JOBSET_NAME_LABEL: name_of(jobset), REPLICATED_JOB_LABEL: rname, JOB_INDEX_LABEL: str(j)}
            job = made(ctx, "batch/v1", "Job", f"{name_of(jobset)}-{rname}-{j}", jobset,
                       labels={**mapping(jobset, tmeta.get("labels"), f"{path}.template.metadata.labels"), **labels},
                       annotations={**mapping(jobset, tmeta.get("annotations"),
                                              f"{path}.template.metadata.annotations"), **labels},
                       spec=mapping(jobset, template.get("spec"), f"{path}.template.spec"))
            jobs.append(job)
            pods += job_pods(ctx, jobset, job, f"{path}.template.spec", budget, (jobset, *chain), labels=labels)
    return jobs, pods


def expand_jobset(top: dict[str, Any], ctx: Context) -> Expansion:
    jobs, pods = jobset_pods(ctx, top, top, ())
    return Expansion([top, *jobs], pods)
