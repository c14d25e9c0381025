"""The remaining controllers a scenario emulates: Argo Workflows, the Spark operator, and the
config's no-code rules. Pure.

- Workflow (argoproj.io/v1alpha1): one pod per template with a `container` or `script`, named
  `<workflow>-<template>`, owned by the Workflow, labelled `workflows.argoproj.io/workflow`; the
  template's (else the workflow's) `schedulerName`, `priorityClassName` (`spec.podPriorityClassName`),
  `nodeSelector`, `tolerations` and `affinity`, `spec.podMetadata` and the template's `metadata`.
  Steps and DAG order are not simulated: every such pod is created at once.
- SparkApplication (sparkoperator.k8s.io/v1beta2): the driver pod `<app>-driver` owned by the
  application, `spec.executor.instances` (default 1) executors `<app>-exec-<n>` owned by the
  driver, labelled `spark-role`, `spark-app-name` and `spark-app-selector`; requests from
  `cores` (or `coreRequest`), `memory` plus `memoryOverhead` (default: max(384 MiB, 10%)), and
  `gpu: {name, quantity}`; the scheduler from `schedulerName`, else the sparkConf
  `spark.kubernetes.scheduler.name`.
- A no-code rule's kind: `replicasPath` pods (default 1) from `templatePath`, named
  `<owner>-<index>`; or per component its `replicasPath` pods from its `templatePath`, named
  `<owner>-<component>-<index>`, carrying the component's `podSelector` labels.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from kai_es.controllers.base import Budget, Context, Controller, ExpandedPod, Expansion, pod_from_template, pods_count
from kai_es.ingest.groupers.base import dig, fail, items, mapping, name_of, text, uid_of
from kai_es.ingest.groupers.core import SPARK_APP_NAME, SPARK_APP_SELECTOR
from kai_es.ingest.groupers.rules import GroupingRule, value_at

WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


def expand_workflow(top: dict[str, Any], ctx: Context) -> Expansion:
    spec = mapping(top, top.get("spec"), "spec")
    pod_meta = mapping(top, spec.get("podMetadata"), "spec.podMetadata")
    budget = Budget(ctx, top)
    pods = []
    for i, template in enumerate(items(top, spec.get("templates"), "spec.templates")):
        path = f"spec.templates[{i}]"
        template = mapping(top, template, path)
        container = template.get("container") or template.get("script")
        if container is None:
            continue
        tname = text(top, template.get("name"), f"{path}.name")
        if not tname:
            raise fail(top, f"{path}.name", "is required")
        container = dict(mapping(top, container, f"{path}.container"))
        container.pop("source", None)
        container.setdefault("name", "main")
        pod_spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
        for field, fallback in (("schedulerName", "schedulerName"), ("priorityClassName", "podPriorityClassName"),
                                ("nodeSelector", "nodeSelector"), ("tolerations", "tolerations"),
                                ("affinity", "affinity")):
            value = template.get(field, spec.get(fallback))
            if value is not None:
                pod_spec[field] = value
        tmeta = mapping(top, template.get("metadata"), f"{path}.metadata")
        pod_template = {"metadata": {
            "labels": {**mapping(top, pod_meta.get("labels"), "spec.podMetadata.labels"),
                       **mapping(top, tmeta.get("labels"), f"{path}.metadata.labels")},
            "annotations": {**mapping(top, pod_meta.get("annotations"), "spec.podMetadata.annotations"),
                            **mapping(top, tmeta.get("annotations"), f"{path}.metadata.annotations")}},
            "spec": pod_spec}
        budget.take(1, path)
        pod = pod_from_template(ctx, top, pod_template, path, f"{name_of(top)}-{tname}", top,
                                labels={WORKFLOW_LABEL: name_of(top)})
        pods.append(ExpandedPod(pod, (top,)))
    return Expansion([top], pods)


# -- Spark -----------------------------------------------------------------------------------

_JAVA_SIZE = re.compile(r"([0-9]+)([kmgtp]?)b?", re.IGNORECASE)
_SCALE = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
MIN_OVERHEAD = 384 * 2**20


def java_bytes(obj: Any, value: Any, path: str, *, unit: str = "") -> int:
    """A Spark memory amount (`512m`, `2g`, or a number in `unit`) in bytes."""
    raw = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    m = _JAVA_SIZE.fullmatch(raw)
    if m is None or len(raw) > 30:
        raise fail(obj, path, f"not a Spark memory amount (like 512m or 2g): {value!r}"[:200])
    return int(m.group(1)) * _SCALE[(m.group(2) or unit).lower()]


def _spark_pod(ctx: Context, top: dict[str, Any], role: str, name: str, owner: dict[str, Any],
               extra_labels: dict[str, str]) -> dict[str, Any]:
    path = f"spec.{role}"
    spec = mapping(top, dig(top, "spec", role), path)
    cpu = spec.get("coreRequest") or spec.get("cores") or 1
    memory = java_bytes(top, spec.get("memory") or "1g", f"{path}.memory")
    if spec.get("memoryOverhead") is not None:
        overhead = java_bytes(top, spec["memoryOverhead"], f"{path}.memoryOverhead", unit="m")
    else:
        factor_text = text(top, dig(top, "spec", "memoryOverheadFactor"), "spec.memoryOverheadFactor") or "0.1"
        try:
            factor = Fraction(factor_text)
        except ValueError:
            raise fail(top, "spec.memoryOverheadFactor", f"not a number: {factor_text!r}") from None
        overhead = max(MIN_OVERHEAD, int(factor * memory))
    requests: dict[str, Any] = {"cpu": str(cpu), "memory": str(memory + overhead)}
    gpu = mapping(top, spec.get("gpu"), f"{path}.gpu")
    if gpu:
        requests[text(top, gpu.get("name"), f"{path}.gpu.name") or "nvidia.com/gpu"] = str(gpu.get("quantity", 1))
    conf = mapping(top, dig(top, "spec", "sparkConf"), "spec.sparkConf")
    pod_spec: dict[str, Any] = {"containers": [{"name": f"spark-kubernetes-{role}",
                                                "image": spec.get("image") or dig(top, "spec", "image") or "spark",
                                                "resources": {"requests": requests}}]}
    scheduler = spec.get("schedulerName") or conf.get("spark.kubernetes.scheduler.name")
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    for field in ("priorityClassName", "tolerations", "affinity"):
        if spec.get(field) is not None:
            pod_spec[field] = spec[field]
    selector = {**mapping(top, dig(top, "spec", "nodeSelector"), "spec.nodeSelector"),
                **mapping(top, spec.get("nodeSelector"), f"{path}.nodeSelector")}
    if selector:
        pod_spec["nodeSelector"] = selector
    template = {"metadata": {"labels": mapping(top, spec.get("labels"), f"{path}.labels"),
                             "annotations": mapping(top, spec.get("annotations"), f"{path}.annotations")},
                "spec": pod_spec}
    return pod_from_template(ctx, top, template, path, name, owner, labels=extra_labels)


def expand_sparkapplication(top: dict[str, Any], ctx: Context) -> Expansion:
    name = name_of(top)
    base = {SPARK_APP_NAME: name, SPARK_APP_SELECTOR: f"spark-{uid_of(top).replace('-', '')[:32]}",
            "sparkoperator.k8s.io/app-name": name, "sparkoperator.k8s.io/launched-by-spark-operator": "true"}
    driver = _spark_pod(ctx, top, "driver", f"{name}-driver", top, {**base, "spark-role": "driver"})
    instances = pods_count(ctx, top, dig(top, "spec", "executor", "instances"), "spec.executor.instances", default=1)
    Budget(ctx, top).take(instances + 1, "spec.executor.instances")
    pods = [ExpandedPod(driver, (top,))]
    pods += [ExpandedPod(_spark_pod(ctx, top, "executor", f"{name}-exec-{n}", driver,
                                    {**base, "spark-role": "executor", "spark-exec-id": str(n)}), (driver, top))
             for n in range(1, instances + 1)]
    return Expansion([top, driver], pods)


# -- no-code rules ---------------------------------------------------------------------------

def rule_expander(rule: GroupingRule) -> Controller:
    def expand(top: dict[str, Any], ctx: Context) -> Expansion:
        budget = Budget(ctx, top)
        pods = []
        parts = [(c.name, c.replicas_path, c.template_path, dict(c.pod_selector)) for c in rule.components] or \
            [("", rule.replicas_path, rule.template_path, {})]
        for component, replicas_path, template_path, selector in parts:
            if not template_path:
                raise fail(top, "kind", f"the grouping rule for {rule.kind} names no templatePath"
                                        f"{' for ' + component if component else ''}: a scenario cannot expand it")
            n = budget.take(pods_count(ctx, top, value_at(top, replicas_path), replicas_path or "replicasPath",
                                       default=1), replicas_path)
            prefix = f"{name_of(top)}-{component}" if component else name_of(top)
            pods += [ExpandedPod(pod_from_template(ctx, top, value_at(top, template_path), template_path,
                                                   f"{prefix}-{i}", top, labels=selector), (top,))
                     for i in range(n)]
        return Expansion([top], pods)

    return expand
