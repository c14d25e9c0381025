"""JobSet (jobset.x-k8s.io/v1alpha2), as KAI's podgrouper groups it (since KAI v0.16). Pure.

One PodGroup per JobSet, `pg-<jobset>-<uid>`, with two levels of sub-groups:
- one per replicated job, named after it, needing all its replicas (`minSubGroup: replicas`);
- under it one leaf per replica, `<replicated job>-replica-<index>`, needing the job's
  `template.spec.parallelism` pods (default 1), or the replicated job template's
  `kai.scheduler/batch-min-member`; the template's topology annotations constrain each leaf.
The PodGroup needs `minSubGroup` replicated jobs: all of them, 1 with `startupPolicyOrder:
InOrder` (the controller starts them one after another), or the JobSet's
`kai.scheduler/batch-min-member` (at most their number). A pod goes to its leaf by the labels
`jobset.sigs.k8s.io/replicatedjob-name` and `jobset.sigs.k8s.io/job-index`, which it must carry.
"""

from __future__ import annotations

from kai_es.ingest.groupers.base import (
    MAX_SEGMENTS,
    MIN_MEMBER_OVERRIDE,
    Decision,
    Obj,
    Source,
    SubGroup,
    annotations_of,
    count,
    default,
    dig,
    fail,
    items,
    labels,
    mapping,
    name_of,
    template_annotation,
    template_topology,
    text,
    uid_of,
)

REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def leaf_name(replicated_job: str, index: int | str) -> str:
    return f"{replicated_job}-replica-{index}"


def jobset_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    if not name_of(top) or not uid_of(top):
        raise fail(top, "metadata", "a JobSet needs a name and a uid")
    jobs = items(top, dig(top, "spec", "replicatedJobs"), "spec.replicatedJobs")
    if not jobs:
        raise fail(top, "spec.replicatedJobs", "a JobSet needs replicated jobs")
    subgroups: list[SubGroup] = []
    for i, job in enumerate(jobs):
        path = f"spec.replicatedJobs[{i}]"
        mapping(top, job, path)
        name = text(top, dig(job, "name"), f"{path}.name")
        if not name:
            raise fail(top, f"{path}.name", "is required")
        replicas = count(top, dig(job, "replicas"), f"{path}.replicas", minimum=1, default=1)
        if len(subgroups) + replicas > MAX_SEGMENTS:
            raise fail(top, f"{path}.replicas", f"more than {MAX_SEGMENTS} sub-groups in one JobSet")
        leaf_override = template_annotation(top, dig(job, "template"), MIN_MEMBER_OVERRIDE, f"{path}.template")
        if leaf_override:
            leaf_min = count(top, leaf_override, f"{path}.template.metadata.annotations[{MIN_MEMBER_OVERRIDE}]",
                             minimum=1)
        else:
            leaf_min = count(top, dig(job, "template", "spec", "parallelism"),
                             f"{path}.template.spec.parallelism", default=1)
        topology = template_topology(top, dig(job, "template"), f"{path}.template")
        subgroups.append(SubGroup(name, min_subgroup=replicas))
        subgroups += [SubGroup(leaf_name(name, r), min_member=leaf_min, parent=name, topology=topology)
                      for r in range(replicas)]
    override = annotations_of(top).get(MIN_MEMBER_OVERRIDE)
    if override is not None:
        wanted = min(count(top, override, f"metadata.annotations[{MIN_MEMBER_OVERRIDE}]", minimum=1), len(jobs))
    elif dig(top, "spec", "startupPolicy", "startupPolicyOrder") == "InOrder":
        wanted = 1
    else:
        wanted = len(jobs)
    pod_labels = labels(src.pod)
    for label in (REPLICATED_JOB_LABEL, JOB_INDEX_LABEL):
        if not pod_labels.get(label):
            raise fail(src.pod, f"metadata.labels[{label}]", "a JobSet's pod carries it (set by the JobSet controller)")
    leaf = leaf_name(pod_labels[REPLICATED_JOB_LABEL], pod_labels[JOB_INDEX_LABEL])
    if not any(sg.name == leaf for sg in subgroups):
        raise fail(src.pod, f"metadata.labels[{JOB_INDEX_LABEL}]", f"no sub-group {leaf!r} in the JobSet")
    return default(top, src.pod, (top,)).with_(min_member=None, min_subgroup=wanted,
                                              subgroups=tuple(subgroups), pod_subgroup=leaf)
