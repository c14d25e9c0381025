"""Knative Service (serving.knative.dev/v1), as KAI's podgrouper groups it with its default
`--knative-gang-schedule=true`. Pure.

The group is the pod's Revision (named by its `serving.knative.dev/revision` label, an owner in
its chain): `pg-<revision>-<uid>`, owned by the Revision, minimum the Revision's
`autoscaling.knative.dev/min-scale` annotation (1 when absent or not a number), priority class
`inference` unless the Revision or the pod names one, queue from the Revision's labels, else the
pod's. No preemptibility, time or topology annotations are read (KAI's Knative grouper sets none).
KAI keeps one group per pod for a Revision whose pods already have groups of their own
(upgraded from an older KAI); kai-es, which keeps no such history, always gangs the Revision.
"""

from __future__ import annotations

from kai_es.ingest.groupers.base import (
    INFERENCE,
    Decision,
    Obj,
    OwnerError,
    Source,
    annotations_of,
    describe,
    fail,
    group_name,
    labels,
    name_of,
    queue_of,
    top_priority,
)

REVISION_LABEL = "serving.knative.dev/revision"
SERVICE_LABEL = "serving.knative.dev/service"
CONFIGURATION_LABEL = "serving.knative.dev/configuration"
MIN_SCALE = "autoscaling.knative.dev/min-scale"


def knative_rule(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    pod = src.pod
    revision_name = labels(pod).get(REVISION_LABEL)
    if not revision_name:
        raise fail(pod, f"metadata.labels[{REVISION_LABEL}]", f"a pod of {describe(top)} carries it")
    revision = next((o for o in src.owners if o.get("kind") == "Revision" and name_of(o) == revision_name), None)
    if revision is None:
        raise OwnerError(describe(pod), "metadata.ownerReferences", f"Revision {revision_name} is not in its owners")
    raw = annotations_of(revision).get(MIN_SCALE, "1").strip()
    minimum = int(raw) if raw.isdigit() and len(raw) < 10 else 1
    return Decision(name=group_name(revision), owner=revision, labels=labels(revision),
                    queue=queue_of(revision, pod), priority_class=top_priority(revision, pod, INFERENCE),
                    min_member=minimum)
