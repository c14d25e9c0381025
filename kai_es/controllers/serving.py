"""Knative Serving's controllers, as a scenario expands a Knative Service. Pure.

Service `<svc>` → Configuration `<svc>` → Revision `<svc>-00001` (the template's labels and
annotations, and Knative's `serving.knative.dev/*` labels) → Deployment
`<svc>-00001-deployment` → its ReplicaSet → `autoscaling.knative.dev/min-scale` pods (at least 1,
Knative's initial scale) named `<svc>-00001-deployment-<index>`, labelled with their Revision.
"""

from __future__ import annotations

from typing import Any

from kai_es.controllers.base import Context, ExpandedPod, Expansion, made, pod_from_template, pods_count
from kai_es.controllers.core import template_hash
from kai_es.ingest.groupers.base import dig, mapping, name_of
from kai_es.ingest.groupers.serving import CONFIGURATION_LABEL, MIN_SCALE, REVISION_LABEL, SERVICE_LABEL


def expand_knative_service(top: dict[str, Any], ctx: Context) -> Expansion:
    name = name_of(top)
    template = mapping(top, dig(top, "spec", "template"), "spec.template")
    tmeta = mapping(top, template.get("metadata"), "spec.template.metadata")
    template_labels = dict(mapping(top, tmeta.get("labels"), "spec.template.metadata.labels"))
    template_annotations = dict(mapping(top, tmeta.get("annotations"), "spec.template.metadata.annotations"))
    revision_name = f"{name}-00001"
    knative = {SERVICE_LABEL: name, CONFIGURATION_LABEL: name}
    config = made(ctx, "serving.knative.dev/v1", "Configuration", name, top, labels={SERVICE_LABEL: name},
                  spec={"template": template})
    revision = made(ctx, "serving.knative.dev/v1", "Revision", revision_name, config,
                    labels={**template_labels, **knative}, annotations=template_annotations,
                    spec=mapping(top, template.get("spec"), "spec.template.spec"))
    pod_labels = {**knative, REVISION_LABEL: revision_name, "app": revision_name}
    deployment = made(ctx, "apps/v1", "Deployment", f"{revision_name}-deployment", revision, labels=pod_labels)
    hash_ = template_hash(deployment)
    rs = made(ctx, "apps/v1", "ReplicaSet", f"{revision_name}-deployment-{hash_}", deployment,
              labels={**pod_labels, "pod-template-hash": hash_})
    raw = template_annotations.get(MIN_SCALE)
    n = max(1, pods_count(ctx, top, raw, f"spec.template.metadata.annotations[{MIN_SCALE}]", default=1))
    pods = [ExpandedPod(pod_from_template(ctx, top, template, "spec.template", f"{revision_name}-deployment-{i}",
                                          rs, labels={**pod_labels, "pod-template-hash": hash_}),
                        (rs, deployment, revision, config, top)) for i in range(n)]
    return Expansion([top, config, revision, deployment, rs], pods)
