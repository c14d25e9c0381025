"""What every grouping rule shares: the input it reads, the decision it returns, KAI's default
grouper (queue, priority class, preemptibility, time annotations, topology, name) and the field
readers that turn a malformed owner into an `IngestError` naming the field. Pure.

A rule is a function `(Source, top, lookup) -> Decision`:
- `Source`: the pod, its owner chain (nearest first, as fetched), objects the rule asked for
  besides the chain (`related`, e.g. a RayJob's RayCluster), and an index of the live pods
  (`pods`, e.g. whether an MPIJob's launcher exists);
- `top`: the object the rule groups by (the top owner, or the pod itself for a bare pod, or the
  owner below a skipped one);
- `lookup`: the objects KAI's default grouper reads for priority class, preemptibility and the
  time annotations, nearest first (the whole chain for kinds KAI groups with its default grouper
  directly; only `top` for kinds whose grouper calls it with the top owner alone).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kai_es.events.timefmt import parse_duration, parse_signed_duration
from kai_es.ingest.translate import NODE_POOL_LABEL, PREEMPTIBILITY_LABEL, PREEMPTIBILITY_MODES, QUEUE_LABEL, IngestError

Obj = Mapping[str, Any]

PRIORITY_LABEL = "priorityClassName"
PROJECT_LABEL = "project"
DEFAULT_QUEUE = "default-queue"
MIN_MEMBER_OVERRIDE = "kai.scheduler/batch-min-member"
TOPOLOGY = "kai.scheduler/topology"
TOPOLOGY_REQUIRED = "kai.scheduler/topology-required-placement"
TOPOLOGY_PREFERRED = "kai.scheduler/topology-preferred-placement"
TOPOLOGY_ANNOTATIONS = {"topology": TOPOLOGY, "requiredTopologyLevel": TOPOLOGY_REQUIRED,
                        "preferredTopologyLevel": TOPOLOGY_PREFERRED}
SEGMENT_SIZE = "kai.scheduler/segment-size"
SEGMENT_REQUIRED = "kai.scheduler/segment-topology-required-placement"
SEGMENT_PREFERRED = "kai.scheduler/segment-topology-preferred-placement"
STALENESS_ANNOTATION = "kai.scheduler/staleness-grace-period"
PREEMPTION_DELAY_ANNOTATION = "kai.scheduler/preemption-delay"
TRAIN, BUILD, INFERENCE = "train", "build", "inference"
#: KAI's PodGroup counts are int32: a count above this is malformed
MAX_COUNT = 2**31 - 1
#: KAI caps the sub-groups one segmentation may create
MAX_SEGMENTS = 10_000


class OwnerError(IngestError):
    """An owner (or the pod) the grouping cannot read: `path` is the field in `owner`
    ("<Kind> <namespace>/<name>"), which `str()` names first."""

    def __init__(self, owner: str, path: str, message: str) -> None:
        super().__init__(path, message)
        self.owner = owner
        self.args = (f"{owner}: {path}: {message}" if owner else f"{path}: {message}",)


class PodIndex(Protocol):
    """The live pods the caller knows of, by label (only the keys in `INDEXED_LABELS`)."""

    def has_pod(self, namespace: str, labels: Mapping[str, str]) -> bool: ...


class NoPods:
    """A PodIndex that knows of no pod."""

    def has_pod(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return False


@dataclass(frozen=True)
class Source:
    pod: Obj
    owners: tuple[Obj, ...] = ()
    related: Mapping[tuple[str, str], Obj] = field(default_factory=dict)
    pods: PodIndex = field(default_factory=NoPods)


@dataclass(frozen=True)
class SubGroup:
    name: str
    min_member: int | None = None  # a leaf's
    min_subgroup: int | None = None  # an inner sub-group's
    parent: str = ""
    topology: Mapping[str, str] | None = None

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.parent:
            out["parent"] = self.parent
        if self.min_subgroup is not None:
            out["minSubGroup"] = self.min_subgroup
        else:
            out["minMember"] = self.min_member if self.min_member is not None else 0
        if self.topology:
            out["topologyConstraint"] = dict(self.topology)
        return out


@dataclass(frozen=True)
class Decision:
    """A PodGroup as a rule decides it, and the grouped pod's place in it."""

    name: str
    owner: Obj  # whose reference the PodGroup carries (and whose creationTimestamp it takes)
    labels: Mapping[str, str]
    queue: str
    priority_class: str
    min_member: int | None = 1
    min_subgroup: int | None = None
    preemptibility: str = ""
    preemption_delay: str | None = None
    staleness_grace: str | None = None
    topology: Mapping[str, str] = field(default_factory=dict)
    subgroups: tuple[SubGroup, ...] = ()
    pod_subgroup: str = ""

    def with_(self, **changes: Any) -> Decision:
        return replace(self, **changes)


#: a grouping rule: (the source, the object grouped by, the objects KAI's default grouper reads)
Rule = Callable[[Source, Obj, tuple[Obj, ...]], Decision]


# -- reading objects ---------------------------------------------------------------------------

def meta(obj: Obj) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if type(m) is dict or isinstance(m, Mapping) else {}  # (a dict nearly always: fast)


def strmap(obj: Obj, name: str) -> dict[str, str]:
    """`metadata.<name>` (labels or annotations) as strings; other values are left out."""
    raw = meta(obj).get(name)
    if type(raw) is not dict and not isinstance(raw, Mapping):
        return {}
    return {k if type(k) is str else str(k): v for k, v in raw.items() if type(v) is str or isinstance(v, str)}


def labels(obj: Obj) -> dict[str, str]:
    return strmap(obj, "labels")


def annotations_of(obj: Obj) -> dict[str, str]:
    return strmap(obj, "annotations")


def name_of(obj: Obj) -> str:
    return str(meta(obj).get("name") or "")


def uid_of(obj: Obj) -> str:
    return str(meta(obj).get("uid") or "")


def api_group(obj: Obj) -> str:
    version = str(obj.get("apiVersion") or "")
    return version.rsplit("/", 1)[0] if "/" in version else ""


def api_version(obj: Obj) -> str:
    version = str(obj.get("apiVersion") or "")
    return version.rsplit("/", 1)[1] if "/" in version else version


def describe(obj: Obj) -> str:
    """`<Kind> <namespace>/<name>`, how errors name an object."""
    ns = meta(obj).get("namespace")
    return f"{obj.get('kind') or '?'} {str(ns) + '/' if ns else ''}{name_of(obj) or '?'}"


def dig(obj: Any, *path: str | int) -> Any:
    cur = obj
    for part in path:
        if isinstance(part, int):
            if not isinstance(cur, list) or not -len(cur) <= part < len(cur):
                return None
            cur = cur[part]
        elif isinstance(cur, Mapping):
            cur = cur.get(part)
        else:
            return None
    return cur


def fail(obj: Obj, path: str, message: str) -> OwnerError:
    return OwnerError(describe(obj), path, message)


_INTEGER = re.compile(r"[+-]?[0-9]+")


def count(obj: Obj, value: Any, path: str, *, minimum: int = 0, default: int | None = None) -> int:
    """An integer count of `obj` at `path` (an int, or the decimal text of an annotation), at
    least `minimum` and at most KAI's int32; None gives `default` (a missing count without one
    is malformed)."""
    if value is None:
        if default is None:
            raise fail(obj, path, "is required")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise fail(obj, path, f"must be an integer, got {value!r}"[:200])
    if isinstance(value, str):
        digits = value.strip()
        if not _INTEGER.fullmatch(digits):
            raise fail(obj, path, f"must be an integer, got {value!r}"[:200])
        if len(digits) > 40:
            raise fail(obj, path, f"{digits[:20]}... is more than KAI's largest count ({MAX_COUNT})")
        value = int(digits)
    number: int = value
    if number < minimum:
        raise fail(obj, path, f"must be >= {minimum}, got {number}")
    if number > MAX_COUNT:
        raise fail(obj, path, f"{number} is more than KAI's largest count ({MAX_COUNT})")
    return number


def checked_sum(obj: Obj, values: Sequence[int], path: str) -> int:
    total = sum(values)
    if total > MAX_COUNT:
        raise fail(obj, path, f"the pods add up to {total}, more than KAI's largest count ({MAX_COUNT})")
    return total


def text(obj: Obj, value: Any, path: str) -> str:
    """A string field ("" when absent)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise fail(obj, path, f"must be a string, got {value!r}"[:200])
    return value


def mapping(obj: Obj, value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(obj, path, f"must be a map, got {type(value).__name__}")
    return value


def items(obj: Obj, value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise fail(obj, path, f"must be a list, got {type(value).__name__}")
    return value


def template_annotation(obj: Obj, template: Any, key: str, path: str) -> str:
    """The annotation `key` of a pod template (`path` is the template's), "" when absent."""
    return text(obj, dig(template, "metadata", "annotations", key), f"{path}.metadata.annotations[{key}]")


# -- KAI's default grouper -------------------------------------------------------------------

def queue_of(top: Obj, pod: Obj) -> str:
    """The top owner's queue label, else the pod's, else `<project>[-<node pool>]` from a
    `project` label, else `default-queue`."""
    top_labels, pod_labels = labels(top), labels(pod)
    if QUEUE_LABEL in top_labels:
        return top_labels[QUEUE_LABEL]
    if QUEUE_LABEL in pod_labels:
        return pod_labels[QUEUE_LABEL]
    project = top_labels.get(PROJECT_LABEL, pod_labels.get(PROJECT_LABEL, ""))
    if project:
        pool = pod_labels.get(NODE_POOL_LABEL)
        return f"{project}-{pool}" if pool is not None else project
    return DEFAULT_QUEUE


def priority_class_of(lookup: Sequence[Obj], pod: Obj, default: str) -> str:
    """KAI's order: for each object of `lookup` (nearest first), its `priorityClassName` label,
    else the pod's label, else the pod's `spec.priorityClassName`; the first name found wins,
    else `default`. (KAI also skips a name that no PriorityClass has; kai-es does not look it
    up: an unknown name gets the reducer's default priority.)"""
    pod_label = labels(pod).get(PRIORITY_LABEL, "")
    spec_class = dig(pod, "spec", "priorityClassName")
    spec_class = spec_class if isinstance(spec_class, str) else ""
    for obj in lookup:
        name = labels(obj).get(PRIORITY_LABEL, "") or pod_label or spec_class
        if name:
            return name
    return pod_label or spec_class or default


def preemptibility_of(lookup: Sequence[Obj], pod: Obj) -> str:
    """The first valid `kai.scheduler/preemptibility` label of `lookup` (nearest first), else the
    pod's; an invalid value is skipped, as KAI skips it."""
    for obj in (*lookup, pod):
        value = labels(obj).get(PREEMPTIBILITY_LABEL)
        if value in PREEMPTIBILITY_MODES:
            return value  # (KAI reads "" as valid: the priority decides)
    return ""


def duration_of(lookup: Sequence[Obj], pod: Obj, key: str, *, signed: bool) -> str | None:
    for obj in (*lookup, pod):
        value = annotations_of(obj).get(key)
        if value is None:
            continue
        try:
            ns = (parse_signed_duration if signed else parse_duration)(value)
        except ValueError:
            raise fail(obj, f"metadata.annotations[{key}]", f"not a duration: {value!r}"[:200]) from None
        if ns < 0 and not signed:
            raise fail(obj, f"metadata.annotations[{key}]", f"must not be negative, got {value!r}")
        return value
    return None


def topology_of(obj: Obj) -> dict[str, str]:
    ann = annotations_of(obj)
    return {name: ann[key] for name, key in TOPOLOGY_ANNOTATIONS.items() if ann.get(key)}


def group_name(obj: Obj) -> str:
    return f"pg-{name_of(obj)}-{uid_of(obj)}"


def default(top: Obj, pod: Obj, lookup: Sequence[Obj], priority: str = TRAIN) -> Decision:
    """KAI's default grouper: one PodGroup `pg-<top>-<uid>` of minimum 1, owned by `top`."""
    return Decision(
        name=group_name(top), owner=top, labels=labels(top), queue=queue_of(top, pod),
        priority_class=priority_class_of(lookup, pod, priority),
        preemptibility=preemptibility_of(lookup, pod),
        preemption_delay=duration_of(lookup, pod, PREEMPTION_DELAY_ANNOTATION, signed=False),
        staleness_grace=duration_of(lookup, pod, STALENESS_ANNOTATION, signed=True),
        topology=topology_of(top))


def top_priority(top: Obj, pod: Obj, default_class: str) -> str:
    """KAI's `CalcPodGroupPriorityClass`: the top owner's label, the pod's, its spec, else the
    kind's default."""
    return priority_class_of([top], pod, default_class)


def segment_topology(obj: Obj, pod: Obj, template: Any, template_path: str) -> dict[str, str] | None:
    """The topology constraint of a segment sub-group: `kai.scheduler/topology` from the pod,
    the template, else the workload; the segment levels from the pod or the template. None
    without a topology or without a level."""
    pod_ann = annotations_of(pod)
    topology = pod_ann.get(TOPOLOGY) or template_annotation(obj, template, TOPOLOGY, template_path) \
        or annotations_of(obj).get(TOPOLOGY, "")

    def level(key: str) -> str:
        return pod_ann.get(key) or template_annotation(obj, template, key, template_path)

    required, preferred = level(SEGMENT_REQUIRED), level(SEGMENT_PREFERRED)
    if not topology or not (required or preferred):
        return None
    out = {"topology": topology}
    if required:
        out["requiredTopologyLevel"] = required
    if preferred:
        out["preferredTopologyLevel"] = preferred
    return out


def template_topology(obj: Obj, template: Any, path: str) -> dict[str, str] | None:
    """A sub-group's topology constraint from a pod template's three topology annotations; None
    unless a topology and a level are set."""
    values = {name: template_annotation(obj, template, key, path) for name, key in TOPOLOGY_ANNOTATIONS.items()}
    if not values["topology"] or not (values["requiredTopologyLevel"] or values["preferredTopologyLevel"]):
        return None
    return {k: v for k, v in values.items() if v}
