"""What every emulated controller shares: the context it creates objects in, the objects and
pods it returns, and how it builds them (names, uids, ownerReferences, pod templates). Pure.

A controller is a function `(owner, Context) -> Expansion`: the objects a workload's controllers
create below it (a Deployment's ReplicaSet, a JobSet's Jobs, a RayJob's RayCluster), each owned
by its parent as in Kubernetes, and the pods, each with its owner chain nearest first — what the
apiserver would return to the informer's owner GETs. Malformed input raises `IngestError` (an
`OwnerError` naming the object and the field).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kai_es.ingest.groupers.base import (
    MAX_COUNT,
    Obj,
    OwnerError,
    count,
    describe,
    dig,
    fail,
    mapping,
    meta,
    name_of,
)
from kai_es.ingest.groupers.rules import GroupingRule

#: simulation-only annotations: the only metadata an owner passes to its pods in a scenario
#: (as a scenario's directive; a real controller copies no owner annotation to its pods)
SIMULATION_PREFIX = "kai-es.io/"


@dataclass(frozen=True)
class Context:
    #: a stable uid for the object `<Kind>/<namespace>/<name>`
    uid: Callable[[str], str]
    #: the scenario's start (ns since the epoch)
    start_ns: int = 0
    #: the most pods one owner may expand into
    max_pods: int = MAX_COUNT
    rules: Mapping[tuple[str, str], GroupingRule] = field(default_factory=dict)
    #: the scenario's objects that controllers read but do not own: (kind, namespace, name) ->
    #: object (Kubeflow Trainer's runtimes; a ClusterTrainingRuntime has namespace "")
    references: Mapping[tuple[str, str, str], Obj] = field(default_factory=dict)
    #: the simulation annotations of the document being expanded, which its pods take
    simulation: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExpandedPod:
    obj: dict[str, Any]
    owners: tuple[dict[str, Any], ...]  # nearest first


@dataclass
class Expansion:
    objects: list[dict[str, Any]] = field(default_factory=list)  # every owner made, the top's copy first
    pods: list[ExpandedPod] = field(default_factory=list)


#: a controller: the owner (uid and creationTimestamp set) -> what it creates
Controller = Callable[[dict[str, Any], Context], Expansion]


def namespace_of(obj: Obj) -> str:
    return str(meta(obj).get("namespace") or "default")


def owner_ref(obj: Obj) -> dict[str, Any]:
    m = meta(obj)
    return {"apiVersion": str(obj.get("apiVersion") or ""), "kind": str(obj.get("kind") or ""),
            "name": str(m.get("name") or ""), "uid": str(m.get("uid") or ""), "controller": True,
            "blockOwnerDeletion": True}


def made(ctx: Context, api_version: str, kind: str, name: str, owner: Obj, *,
         labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
         spec: Mapping[str, Any] | None = None, status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An object `owner`'s controller creates: in its namespace, owned by it, as old as it."""
    ns = namespace_of(owner)
    m: dict[str, Any] = {"name": name, "namespace": ns, "uid": ctx.uid(f"{kind}/{ns}/{name}"),
                         "labels": dict(labels or {}), "annotations": dict(annotations or {}),
                         "ownerReferences": [owner_ref(owner)]}
    created = meta(owner).get("creationTimestamp")
    if created:
        m["creationTimestamp"] = created
    out: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": m}
    if spec is not None:
        out["spec"] = copy.deepcopy(dict(spec))
    if status is not None:
        out["status"] = copy.deepcopy(dict(status))
    return out


def simulation_annotations(obj: Obj) -> dict[str, str]:
    raw = meta(obj).get("annotations")
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items() if str(k).startswith(SIMULATION_PREFIX)}


def pod_from_template(ctx: Context, top: Obj, template: Any, path: str, name: str, owner: Obj, *,
                      labels: Mapping[str, str] | None = None,
                      annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The pod a controller creates from the pod template at `path` of `top` (errors name its
    fields): the template's metadata and spec, the controller's own `labels` and `annotations`
    (which win), the expanded document's simulation annotations (`ctx.simulation`; the
    template's win), owned by `owner`."""
    template = mapping(top, template, path)
    if not isinstance(template.get("spec"), Mapping):
        raise fail(top, f"{path}.spec", "a pod template with a spec is required")
    tmeta = mapping(top, template.get("metadata"), f"{path}.metadata")
    pod_labels = dict(mapping(top, tmeta.get("labels"), f"{path}.metadata.labels"))
    pod_labels.update(labels or {})
    pod_annotations = dict(ctx.simulation)
    pod_annotations.update(mapping(top, tmeta.get("annotations"), f"{path}.metadata.annotations"))
    pod_annotations.update(annotations or {})
    pod = made(ctx, "v1", "Pod", name, owner, labels=pod_labels, annotations=pod_annotations,
               spec=template["spec"])
    pod["metadata"].pop("creationTimestamp", None)  # a pod is created when the scenario says (loader)
    return pod


def pods_count(ctx: Context, top: Obj, value: Any, path: str, *, default: int | None = None,
               minimum: int = 0) -> int:
    """A replica count a controller creates that many pods from (bounded by `ctx.max_pods`)."""
    n = count(top, value, path, minimum=minimum, default=default)
    if n > ctx.max_pods:
        raise OwnerError(describe(top), path, f"{n} pods is more than a scenario may expand one owner "
                                              f"into ({ctx.max_pods})")
    return n


class Budget:
    """Counts the pods one top owner expands into, against `ctx.max_pods`."""

    def __init__(self, ctx: Context, top: Obj) -> None:
        self.ctx, self.top, self.used = ctx, top, 0

    def take(self, n: int, path: str) -> int:
        self.used += n
        if self.used > self.ctx.max_pods:
            raise OwnerError(describe(self.top), path, f"{self.used} pods is more than a scenario may expand "
                                                       f"one owner into ({self.ctx.max_pods})")
        return n


def template_at(top: Obj, *path: str | int) -> Any:
    return dig(top, *path)


__all__ = ["Budget", "Context", "Controller", "ExpandedPod", "Expansion", "made", "name_of", "namespace_of", "owner_ref",
           "pod_from_template", "pods_count", "simulation_annotations", "template_at"]
