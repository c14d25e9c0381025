"""Kubernetes objects (plain JSON dicts) to observed-event payloads. Pure functions.

The same functions serve the informer (live objects) and the scenario loader (YAML files).

Contract: `translate(obj)` returns the payload for a supported kind or raises `IngestError`
with the field path and a readable message; it never raises anything else on any JSON input.
Quantities come out as integers: milli-CPU, bytes, milli-GPU, MiB. Queue quotas follow KAI's
units (CPU millicores, memory MB, GPU devices, possibly fractional) and are stored as milli-CPU,
bytes and milli-GPU; -1 (unlimited) stays -1.
"""

from __future__ import annotations

import functools

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import msgspec

from kai_es.events import payloads as p
from kai_es.events.timefmt import parse_duration, parse_rfc3339, parse_signed_duration
from kai_es.ingest.quantity import QuantityError, parse_quantity, to_milli, to_units

from kai_es.ingest import bounds
from kai_es.ingest.names import SCHEDULER_NAME
GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_LABEL = "kai.scheduler/queue"
PODGROUP_ANNOTATION = "pod-group-name"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
#: the values of `kai.scheduler/preemptibility` and `spec.preemptibility` ("": the priority decides)
PREEMPTIBILITY_MODES = ("", "preemptible", "non-preemptible", "semi-preemptible")
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
TASK_PRIORITY_LABEL = "kai.scheduler/task-priority"
GPU_GROUP_LABEL = "runai-gpu-group"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_MODEL_LABEL = "nvidia.com/gpu.product"
PREEMPTION_DELAY_ANNOTATION = "kai.scheduler/preemption-delay"
STALENESS_GRACE_ANNOTATION = "kai.scheduler/staleness-grace-period"
#: the times KAI's status updater keeps on a PodGroup (and kai-es's from kai-es/v7)
STALE_TIMESTAMP_ANNOTATION = "kai.scheduler/stale-podgroup-timestamp"
LAST_EVICTION_TIMESTAMP_ANNOTATION = "kai.scheduler/last-eviction-timestamp"
LAST_START_TIMESTAMP_ANNOTATION = "kai.scheduler/last-start-timestamp"
#: set by the informer's pod grouping on a pod whose PodGroup it could not work out (the owner
#: is malformed or cannot be read): the pod is rejected with this message, not scheduled alone
GROUPING_ERROR_ANNOTATION = "kai-es.io/grouping-error"
#: kai-es's GPU device facts on a pod it bound (see kai_es/adapters/kubernetes/gpushare.py)
GPU_DEVICES_ANNOTATION = "kai-es.io/gpu-devices"


class IngestError(ValueError):
    """An object that cannot be translated; `path` is the offending field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


Obj = Mapping[str, Any]


def _get(obj: Obj, path: str, default: Any = None) -> Any:
    cur: Any = obj
    for part in _parts(path):
        if type(cur) is not dict and not isinstance(cur, Mapping):  # (a dict, nearly always: fast)
            return default
        cur = cur.get(part)
        if cur is None:
            return default
    return cur


@functools.lru_cache(maxsize=1024)
def _parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def _map(obj: Obj, path: str) -> dict[str, str]:
    value = _get(obj, path, {})
    if not isinstance(value, Mapping):
        raise IngestError(path, f"must be a map, got {type(value).__name__}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, (str, int, float, bool)):
            raise IngestError(f"{path}.{k}", "must be a string")
        out[str(k)] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _list(obj: Obj, path: str) -> list[Any]:
    value = _get(obj, path, [])
    if not isinstance(value, list):
        raise IngestError(path, f"must be a list, got {type(value).__name__}")
    return value


def _name(obj: Obj) -> str:
    name = _get(obj, "metadata.name")
    if not isinstance(name, str) or not name:
        raise IngestError("metadata.name", "is required")
    return name


def _namespace(obj: Obj) -> str:
    ns = _get(obj, "metadata.namespace", "default")
    if not isinstance(ns, str) or not ns:
        raise IngestError("metadata.namespace", "must be a non-empty string")
    return ns


def _uid(obj: Obj, fallback: str) -> str:
    uid = _get(obj, "metadata.uid")
    return str(uid) if uid else fallback


def _int(value: Any, path: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise IngestError(path, f"must be an integer, got {value!r}")
    try:
        out = int(value)
    except ValueError:
        raise IngestError(path, f"must be an integer, got {value!r}") from None
    if minimum is not None and out < minimum:
        raise IngestError(path, f"must be >= {minimum}, got {out}")
    if abs(out) > bounds.MAX_QUANTITY:
        raise IngestError(path, f"{out} is beyond the largest accepted magnitude ({bounds.MAX_QUANTITY})")
    return out


#: the integer field parser, for the other ingest modules
int_field = _int


def _milli(value: Any, path: str) -> int:
    try:
        return to_milli(value)
    except QuantityError as exc:
        raise IngestError(path, str(exc)) from None


def _units(value: Any, path: str) -> int:
    try:
        return to_units(value)
    except QuantityError as exc:
        raise IngestError(path, str(exc)) from None


def _timestamp(obj: Obj, path: str) -> int:
    """The RFC 3339 timestamp at `path` as int ns, or 0 when absent."""
    ts = _get(obj, path)
    if ts is None:
        return 0
    try:
        return parse_rfc3339(str(ts))
    except ValueError as exc:
        raise IngestError(path, str(exc)) from None


def created_ns(obj: Obj) -> int:
    """metadata.creationTimestamp as int ns, or 0 when absent."""
    return _timestamp(obj, "metadata.creationTimestamp")


def _duration(value: Any, path: str, *, signed: bool = False) -> int:
    """A Go/Kubernetes duration (`90s`, `5m`) in ns, within `bounds.MAX_DURATION_NS`; negative only
    when `signed` (KAI's "negative: never"). A unit-less number is refused, as KAI ignores it."""
    try:
        ns = parse_signed_duration(str(value)) if signed else parse_duration(str(value))
    except ValueError as exc:
        raise IngestError(path, str(exc)) from None
    problem = bounds.duration_problem(path, ns, signed=signed)
    if problem is not None:
        raise IngestError(path, problem)
    return ns


def _optional_duration(value: Any, path: str, *, signed: bool = False) -> int | None:
    return None if value is None else _duration(value, path, signed=signed)


def _handover_time(annotations: Mapping[str, str], key: str) -> int | None:
    """A handover time annotation (`kai.scheduler/stale-podgroup-timestamp`,
    `.../last-eviction-timestamp`) in ns; None when absent or not an RFC 3339 time, as KAI's
    scheduler ignores one it cannot parse (the PodGroup is not rejected for it: a scheduler
    wrote it, and the gang runs)."""
    raw = annotations.get(key)
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return parse_rfc3339(raw)
    except ValueError:
        return None


def _time_annotations(annotations: Mapping[str, str]) -> tuple[int | None, int | None]:
    """KAI's `kai.scheduler/preemption-delay` (non-negative) and
    `kai.scheduler/staleness-grace-period` (negative: never evicted stale) annotations, ns."""
    return (_optional_duration(annotations.get(PREEMPTION_DELAY_ANNOTATION),
                               f"metadata.annotations[{PREEMPTION_DELAY_ANNOTATION}]"),
            _optional_duration(annotations.get(STALENESS_GRACE_ANNOTATION),
                               f"metadata.annotations[{STALENESS_GRACE_ANNOTATION}]", signed=True))


# --- Node ---------------------------------------------------------------------------------


def node(obj: Obj) -> p.NodeObserved:
    name = _name(obj)
    res = _get(obj, "status.allocatable") or _get(obj, "status.capacity") or {}
    base = "status.allocatable" if _get(obj, "status.allocatable") else "status.capacity"
    if not isinstance(res, Mapping):
        raise IngestError(base, "must be a map")
    labels = _map(obj, "metadata.labels")
    taints = []
    for i, t in enumerate(_list(obj, "spec.taints")):
        path = f"spec.taints[{i}]"
        if not isinstance(t, Mapping) or "key" not in t or "effect" not in t:
            raise IngestError(path, "needs key and effect")
        if t["effect"] not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise IngestError(f"{path}.effect", f"unknown effect {t['effect']!r}")
        taints.append(p.Taint(key=str(t["key"]), value=str(t.get("value", "")), effect=t["effect"]))
    gpu_mem = 0
    if GPU_MEMORY_LABEL in labels:
        gpu_mem = _int(labels[GPU_MEMORY_LABEL], f"metadata.labels[{GPU_MEMORY_LABEL}]", minimum=0)
    cpu = _milli(res.get("cpu", 0), f"{base}.cpu")
    memory = _units(res.get("memory", 0), f"{base}.memory")
    gpus = _units(res.get(GPU_RESOURCE, 0), f"{base}[{GPU_RESOURCE}]")
    pods = _units(res.get("pods", 110), f"{base}.pods")
    for field, value, bound in (("cpu", cpu, bounds.MAX_QUANTITY), ("memory", memory, bounds.MAX_QUANTITY),
                                (GPU_RESOURCE, gpus, bounds.MAX_NODE_GPUS), ("pods", pods, bounds.MAX_NODE_PODS)):
        problem = bounds.quantity_problem(field, value, bound)
        if problem:
            raise IngestError(f"{base}.{field}" if "/" not in field else f"{base}[{field}]", problem)
    if gpu_mem > bounds.MAX_GPU_MEMORY_MIB:
        raise IngestError(f"metadata.labels[{GPU_MEMORY_LABEL}]",
                          f"{gpu_mem} MiB is above the largest accepted ({bounds.MAX_GPU_MEMORY_MIB})")
    scalar = {}
    for resource in sorted(str(k) for k in res):
        if resource in _CORE_RESOURCES:
            continue
        amount = _units(res[resource], f"{base}[{resource}]")
        problem = bounds.quantity_problem(resource, amount)
        if problem:
            raise IngestError(f"{base}[{resource}]", problem)
        scalar[resource] = amount
    return p.NodeObserved(
        name=name, uid=_uid(obj, name), labels=labels, taints=tuple(taints),
        unschedulable=bool(_get(obj, "spec.unschedulable", False)), milli_cpu=cpu,
        memory_bytes=memory, gpus=gpus, max_pods=pods, gpu_memory_mib=gpu_mem,
        gpu_model=labels.get(GPU_MODEL_LABEL, ""), scalar_resources=scalar,
    )


# --- Pod ----------------------------------------------------------------------------------


#: resources with a field of their own; every other resource name is a scalar resource
_CORE_RESOURCES = frozenset({"cpu", "memory", GPU_RESOURCE, "pods"})


def _container_requests(c: Obj, path: str) -> dict[str, int]:
    """Requests of one container by resource name (a resource with only a limit requests its
    limit, as the API server defaults it): cpu in milli-CPU, everything else in base units."""
    req = _get(c, "resources.requests") or {}
    lim = _get(c, "resources.limits") or {}
    if not isinstance(req, Mapping) or not isinstance(lim, Mapping):
        raise IngestError(f"{path}.resources", "requests and limits must be maps")
    merged = {str(k): v for k, v in lim.items()}
    merged.update({str(k): v for k, v in req.items()})
    return _amounts(merged, f"{path}.resources.requests")


def _amounts(raw: Mapping[str, Any], where: str) -> dict[str, int]:
    """A resource list (`where` names it) by resource name, in the units of `_container_requests`."""
    if not all(type(v) in _SCALARS for v in raw.values()):  # a map, a list: the errors below
        return _amounts_of(raw, where)
    # each value's type in the key: True == 1, yet `true` is no quantity
    return dict(_cached_amounts((tuple(sorted((k, type(v), v) for k, v in raw.items())), where)))


_SCALARS = (str, int, float, bool, type(None))
#: every watch event of a pod carries its containers' resource lists again: each distinct list
#: is converted once (an error is not cached: it is raised every time)
@functools.lru_cache(maxsize=4096)
def _cached_amounts(key: tuple[tuple[tuple[str, type, Any], ...], str]) -> tuple[tuple[str, int], ...]:
    return tuple(_amounts_of({k: v for k, _, v in key[0]}, key[1]).items())


def _amounts_of(raw: Mapping[str, Any], where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for resource in sorted(raw):
        if resource == "pods":
            continue
        at = f"{where}[{resource}]" if "/" in resource else f"{where}.{resource}"
        value = raw[resource]
        if _whole_only(resource):
            amount = _whole(value, resource, at)
        else:
            amount = _milli(value, at) if resource == "cpu" else _units(value, at)
        problem = bounds.quantity_problem(resource, amount,
                                          bounds.MAX_POD_GPUS if resource == GPU_RESOURCE else bounds.MAX_QUANTITY)
        if problem:
            raise IngestError(at, problem)
        out[resource] = amount
    return out


def _whole_only(resource: str) -> bool:
    """Kubernetes takes extended resources (a name with a domain, `nvidia.com/gpu`, outside
    `kubernetes.io`) in whole units only: the API server refuses `0.5` (fractions of a GPU are
    KAI's `gpu-fraction` annotation)."""
    domain, slash, _ = resource.partition("/")
    return bool(slash) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def _whole(raw: Any, resource: str, where: str) -> int:
    """The amount of an extended resource: a whole number of units (`_whole_only`)."""
    try:
        value = parse_quantity(raw)
    except QuantityError as exc:
        raise IngestError(where, str(exc)) from None
    if value.denominator != 1:
        hint = " (for a share of a GPU, use the gpu-fraction or gpu-memory annotation)" \
            if resource == GPU_RESOURCE else ""
        raise IngestError(where, f"{resource} must be a whole number, as Kubernetes requires of an "
                                 f"extended resource, got {raw!r}{hint}")
    return value.numerator


def _status_requests(raw: Any, path: str) -> dict[str, int]:
    """A container status's resource list (`resources.requests` or `allocatedResources`)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise IngestError(path, "must be a map")
    return _amounts({str(k): v for k, v in raw.items()}, path)


def _resize_infeasible(obj: Obj) -> bool:
    """The pod's `PodResizePending` condition says `Infeasible` (the kubelet will not resize it)."""
    for c in _list(obj, "status.conditions"):
        if isinstance(c, Mapping) and c.get("type") == "PodResizePending":
            return c.get("reason") == "Infeasible"
    return False


def _effective_requests(obj: Obj, c: Obj, path: str, statuses: Mapping[str, tuple[Obj, str]]) -> dict[str, int]:
    """A container's requests as the node accounts them during an in-place resize (Kubernetes'
    effective requests): once its status reports `resources`, per resource the largest of the
    spec, the actuated (`status…resources.requests`) and the allocated (`allocatedResources`)
    amounts — and, when the resize is infeasible, of the last two only. Without a status: the spec."""
    spec = _container_requests(c, path)
    found = statuses.get(str(c.get("name", "")))
    if found is None:
        return spec
    status, where = found
    resources = status.get("resources")
    if resources is None:
        return spec
    if not isinstance(resources, Mapping):
        raise IngestError(f"{where}.resources", "must be a map")
    actuated = _status_requests(resources.get("requests"), f"{where}.resources.requests")
    allocated = _status_requests(status.get("allocatedResources"), f"{where}.allocatedResources")
    lists = (actuated, allocated) if _resize_infeasible(obj) else (spec, actuated, allocated)
    out: dict[str, int] = {}
    for each in lists:
        for k, v in each.items():
            out[k] = max(out.get(k, 0), v)
    return out


def _container_statuses(obj: Obj) -> dict[str, tuple[Obj, str]]:
    """Container name -> (its status, where it is), of `status.containerStatuses` and
    `status.initContainerStatuses`."""
    out: dict[str, tuple[Obj, str]] = {}
    for field in ("containerStatuses", "initContainerStatuses"):
        for i, cs in enumerate(_list(obj, f"status.{field}")):
            if isinstance(cs, Mapping) and isinstance(cs.get("name"), str):
                out.setdefault(cs["name"], (cs, f"status.{field}[{i}]"))
    return out


def _pod_requests(obj: Obj) -> tuple[int, int, int, dict[str, int]]:
    """(milli-CPU, memory bytes, whole GPUs, other resources) a pod needs on its node, as
    Kubernetes computes it: the sum over containers and sidecars (init containers with
    `restartPolicy: Always`), at least what each other init container needs beside the
    sidecars started before it, plus `spec.overhead`. A container (or sidecar) being resized in
    place counts its effective requests (`_effective_requests`)."""
    statuses = _container_statuses(obj)
    total: dict[str, int] = {}
    for i, c in enumerate(_list(obj, "spec.containers")):
        if not isinstance(c, Mapping):
            raise IngestError(f"spec.containers[{i}]", "must be a map")
        for k, v in _effective_requests(obj, c, f"spec.containers[{i}]", statuses).items():
            total[k] = total.get(k, 0) + v
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for i, c in enumerate(_list(obj, "spec.initContainers")):
        if not isinstance(c, Mapping):
            raise IngestError(f"spec.initContainers[{i}]", "must be a map")
        path = f"spec.initContainers[{i}]"
        if c.get("restartPolicy") == "Always":  # a sidecar: runs beside the containers
            requests = _effective_requests(obj, c, path, statuses)
            for k, v in requests.items():
                total[k] = total.get(k, 0) + v
                sidecars[k] = sidecars.get(k, 0) + v
            running = dict(sidecars)
        else:
            running = dict(sidecars)
            for k, v in _container_requests(c, path).items():
                running[k] = running.get(k, 0) + v
        for k, v in running.items():
            init_max[k] = max(init_max.get(k, 0), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, 0), v)
    overhead = _get(obj, "spec.overhead", {}) or {}
    if not isinstance(overhead, Mapping):
        raise IngestError("spec.overhead", "must be a map")
    for resource in sorted(str(k) for k in overhead):
        where = f"spec.overhead.{resource}"
        amount = _milli(overhead[resource], where) if resource == "cpu" else _units(overhead[resource], where)
        problem = bounds.quantity_problem(resource, amount)
        if problem:
            raise IngestError(where, problem)
        total[resource] = total.get(resource, 0) + amount
    for resource, amount in sorted(total.items()):
        problem = bounds.quantity_problem(
            resource, amount, bounds.MAX_POD_GPUS if resource == GPU_RESOURCE else bounds.MAX_QUANTITY)
        if problem:
            raise IngestError("spec.containers", f"the pod's total {problem}")
    scalar = {k: v for k, v in sorted(total.items()) if k not in _CORE_RESOURCES and v > 0}
    return total.get("cpu", 0), total.get("memory", 0), total.get(GPU_RESOURCE, 0), scalar


def gpu_request(annotations: Mapping[str, str], whole: int) -> p.GpuRequest:
    """GPU request from `nvidia.com/gpu` and KAI's sharing annotations."""
    fraction_text = annotations.get("gpu-fraction")
    memory_text = annotations.get("gpu-memory")
    devices_text = annotations.get("gpu-fraction-num-devices")
    if whole and (fraction_text or memory_text):
        raise IngestError("metadata.annotations", f"{GPU_RESOURCE} and gpu-fraction/gpu-memory are exclusive")
    if fraction_text and memory_text:
        raise IngestError("metadata.annotations", "gpu-fraction and gpu-memory are exclusive")
    devices = 1
    if devices_text is not None:
        devices = _int(devices_text, "metadata.annotations[gpu-fraction-num-devices]", minimum=1)
        if devices > bounds.MAX_POD_GPUS:
            raise IngestError("metadata.annotations[gpu-fraction-num-devices]",
                              f"{devices} is above the largest accepted ({bounds.MAX_POD_GPUS})")
    fraction = 0
    if fraction_text is not None:
        path = "metadata.annotations[gpu-fraction]"
        try:
            value = parse_quantity(fraction_text)
        except QuantityError:
            raise IngestError(path, f"must be a number between 0 and 1, got {fraction_text!r}") from None
        if not Fraction(0) < value < Fraction(1):
            raise IngestError(path, f"must be strictly between 0 and 1, got {fraction_text!r}")
        fraction = int(value * 1000)  # floor: n pods of 1/n always fit one device
        if fraction < 1:
            raise IngestError(path, f"is below one milli-GPU: {fraction_text!r}")
    gpu_memory = 0
    if memory_text is not None:
        gpu_memory = _int(memory_text, "metadata.annotations[gpu-memory]", minimum=1)
        if gpu_memory > bounds.MAX_GPU_MEMORY_MIB:
            raise IngestError("metadata.annotations[gpu-memory]",
                              f"{gpu_memory} MiB is above the largest accepted ({bounds.MAX_GPU_MEMORY_MIB})")
    return p.GpuRequest(whole=whole, fraction_milli=fraction, gpu_memory_mib=gpu_memory,
                        fraction_devices=devices if (fraction or gpu_memory) else 1)


def _requirement(e: Any, path: str, cls: type[Any]) -> Any:
    if not isinstance(e, Mapping):
        raise IngestError(path, "must be a map")
    values = e.get("values") or []
    if not isinstance(values, list):
        raise IngestError(f"{path}.values", "must be a list")
    try:
        return msgspec.convert({"key": e.get("key"), "operator": e.get("operator"),
                                "values": [str(v) for v in values]}, cls)
    except msgspec.ValidationError as exc:
        raise IngestError(path, str(exc)) from None


def node_selector_terms(raw: Any, base: str) -> list[p.NodeSelectorTerm]:
    """`nodeSelectorTerms` (a list of terms, ORed) as payload terms."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise IngestError(base, "must be a list")
    return [_node_selector_term(term, f"{base}[{i}]") for i, term in enumerate(raw)]


def _node_selector_term(term: Any, path: str) -> p.NodeSelectorTerm:
    if not isinstance(term, Mapping):
        raise IngestError(path, "must be a map")
    parts: dict[str, list[p.NodeSelectorRequirement]] = {}
    for field, name in (("matchExpressions", "match_expressions"), ("matchFields", "match_fields")):
        raw = term.get(field) or []
        if not isinstance(raw, list):
            raise IngestError(f"{path}.{field}", "must be a list")
        parts[name] = [_requirement(e, f"{path}.{field}[{j}]", p.NodeSelectorRequirement)
                       for j, e in enumerate(raw)]
        for j, req in enumerate(parts[name]):
            if req.operator in ("In", "NotIn") and not req.values:
                raise IngestError(f"{path}.{field}[{j}].values", f"must not be empty for operator {req.operator}")
            if req.operator in ("Exists", "DoesNotExist") and req.values:
                raise IngestError(f"{path}.{field}[{j}].values", f"must be empty for operator {req.operator}")
            if req.operator in ("Gt", "Lt"):
                if len(req.values) != 1 or not _is_int(req.values[0]):
                    raise IngestError(f"{path}.{field}[{j}].values", f"operator {req.operator} takes exactly one integer")
            if field == "matchFields" and req.key != "metadata.name":
                raise IngestError(f"{path}.{field}[{j}].key", f"only metadata.name is supported, got {req.key!r}")
    return p.NodeSelectorTerm(match_expressions=tuple(parts.get("match_expressions", ())),
                              match_fields=tuple(parts.get("match_fields", ())))


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _weight(raw: Any, path: str) -> int:
    weight = _int(raw, path, minimum=1)
    if weight > 100:
        raise IngestError(path, f"must be between 1 and 100, got {weight}")
    return weight


def _affinity_terms(obj: Obj) -> list[p.NodeSelectorTerm]:
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _get(obj, base)
    if required is None:
        return []
    if not isinstance(required, Mapping):
        raise IngestError(base, "must be a map")
    return node_selector_terms(required.get("nodeSelectorTerms") or [], f"{base}.nodeSelectorTerms")


def _preferred_affinity(obj: Obj) -> list[p.PreferredSchedulingTerm]:
    base = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    out = []
    for i, item in enumerate(_list(obj, base)):
        path = f"{base}[{i}]"
        if not isinstance(item, Mapping):
            raise IngestError(path, "must be a map")
        out.append(p.PreferredSchedulingTerm(
            weight=_weight(item.get("weight"), f"{path}.weight"),
            term=_node_selector_term(item.get("preference") or {}, f"{path}.preference")))
    return out


def label_selector(raw: Any, path: str) -> p.LabelSelector | None:
    """A Kubernetes LabelSelector (None stays None: it selects nothing)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise IngestError(path, "must be a map")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise IngestError(f"{path}.matchLabels", "must be a map")
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise IngestError(f"{path}.matchExpressions", "must be a list")
    reqs = [_requirement(e, f"{path}.matchExpressions[{j}]", p.LabelSelectorRequirement)
            for j, e in enumerate(exprs)]
    for j, req in enumerate(reqs):
        if req.operator in ("In", "NotIn") and not req.values:
            raise IngestError(f"{path}.matchExpressions[{j}].values", f"must not be empty for operator {req.operator}")
        if req.operator in ("Exists", "DoesNotExist") and req.values:
            raise IngestError(f"{path}.matchExpressions[{j}].values", f"must be empty for operator {req.operator}")
    return p.LabelSelector(match_labels={str(k): str(v) for k, v in sorted(labels.items())},
                           match_expressions=tuple(reqs))


def _pod_affinity_term(raw: Any, path: str) -> p.PodAffinityTerm:
    if not isinstance(raw, Mapping):
        raise IngestError(path, "must be a map")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise IngestError(f"{path}.topologyKey", "is required")
    namespaces = raw.get("namespaces") or []
    if not isinstance(namespaces, list):
        raise IngestError(f"{path}.namespaces", "must be a list")
    for field in ("matchLabelKeys", "mismatchLabelKeys"):
        if raw.get(field):
            raise IngestError(f"{path}.{field}", "is not supported yet")
    return p.PodAffinityTerm(
        selector=label_selector(raw.get("labelSelector"), f"{path}.labelSelector"),
        namespaces=tuple(sorted({str(n) for n in namespaces})),
        namespace_selector=label_selector(raw.get("namespaceSelector"), f"{path}.namespaceSelector"),
        topology_key=key)


def _pod_affinities(obj: Obj, kind: str) -> tuple[list[p.PodAffinityTerm], list[p.WeightedPodAffinityTerm]]:
    base = f"spec.affinity.{kind}"
    required = [_pod_affinity_term(t, f"{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]")
                for i, t in enumerate(_list(obj, f"{base}.requiredDuringSchedulingIgnoredDuringExecution"))]
    preferred = []
    for i, item in enumerate(_list(obj, f"{base}.preferredDuringSchedulingIgnoredDuringExecution")):
        path = f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        if not isinstance(item, Mapping):
            raise IngestError(path, "must be a map")
        preferred.append(p.WeightedPodAffinityTerm(
            weight=_weight(item.get("weight"), f"{path}.weight"),
            term=_pod_affinity_term(item.get("podAffinityTerm"), f"{path}.podAffinityTerm")))
    return required, preferred


def _scheduling_gates(obj: Obj) -> list[str]:
    """The names of `spec.schedulingGates`, in order (the API server keeps them unique and
    non-empty; anything else is refused, naming the gate)."""
    names: list[str] = []
    for i, gate in enumerate(_list(obj, "spec.schedulingGates")):
        name = gate.get("name") if isinstance(gate, Mapping) else None
        if not isinstance(name, str) or not name:
            raise IngestError(f"spec.schedulingGates[{i}].name",
                              f"must be a non-empty string, got {type(name).__name__ if name else repr(name)}")
        names.append(name)
    return names


def _host_ports(obj: Obj) -> list[p.HostPort]:
    ports: set[tuple[int, str, str]] = set()
    for i, c in enumerate(_list(obj, "spec.containers")):
        if not isinstance(c, Mapping):
            continue
        raw_ports = c.get("ports") or []
        if not isinstance(raw_ports, list):
            raise IngestError(f"spec.containers[{i}].ports", "must be a list")
        for j, port in enumerate(raw_ports):
            path = f"spec.containers[{i}].ports[{j}]"
            if not isinstance(port, Mapping):
                raise IngestError(path, "must be a map")
            if not port.get("hostPort"):
                continue
            number = _int(port["hostPort"], f"{path}.hostPort", minimum=1)
            if number > 65535:
                raise IngestError(f"{path}.hostPort", f"must be at most 65535, got {number}")
            protocol = str(port.get("protocol") or "TCP")
            if protocol not in ("TCP", "UDP", "SCTP"):
                raise IngestError(f"{path}.protocol", f"must be TCP, UDP or SCTP, got {protocol!r}")
            host_ip = str(port.get("hostIP") or "")
            ports.add((number, protocol, "" if host_ip in ("0.0.0.0", "::") else host_ip))
    return [p.HostPort(port=n, protocol=proto, host_ip=ip)  # type: ignore[arg-type]
            for n, proto, ip in sorted(ports)]


def _volumes(obj: Obj) -> tuple[list[str], list[str]]:
    """(claims, config maps) the pod cannot start without."""
    claims: set[str] = set()
    maps: set[str] = set()
    for i, v in enumerate(_list(obj, "spec.volumes")):
        path = f"spec.volumes[{i}]"
        if not isinstance(v, Mapping):
            raise IngestError(path, "must be a map")
        claim = v.get("persistentVolumeClaim")
        if isinstance(claim, Mapping):
            if not claim.get("claimName"):
                raise IngestError(f"{path}.persistentVolumeClaim.claimName", "is required")
            claims.add(str(claim["claimName"]))
        sources = [v.get("configMap")]
        projected = v.get("projected")
        if isinstance(projected, Mapping):
            sources += [s.get("configMap") for s in projected.get("sources") or [] if isinstance(s, Mapping)]
        for source in sources:
            if isinstance(source, Mapping) and source.get("name") and not source.get("optional"):
                maps.add(str(source["name"]))
    return sorted(claims), sorted(maps)


def _tolerations(obj: Obj) -> list[p.Toleration]:
    out = []
    for i, t in enumerate(_list(obj, "spec.tolerations")):
        if not isinstance(t, Mapping):
            raise IngestError(f"spec.tolerations[{i}]", "must be a map")
        op = t.get("operator", "Equal")
        if op not in ("Equal", "Exists"):
            raise IngestError(f"spec.tolerations[{i}].operator", f"unknown operator {op!r}")
        out.append(p.Toleration(key=str(t.get("key", "")), operator=op, value=str(t.get("value", "")),
                                effect=str(t.get("effect", ""))))
    return out


def implicit_podgroup_name(obj: Obj) -> str:
    """KAI podgrouper's default group for a pod without `pod-group-name`: one per owner, else
    one per pod."""
    owners = _list(obj, "metadata.ownerReferences")
    controller = next((o for o in owners if isinstance(o, Mapping) and o.get("controller")), None)
    owner = controller or (owners[0] if owners and isinstance(owners[0], Mapping) else None)
    if owner is not None and owner.get("name"):
        return f"pg-{owner['name']}-{owner.get('uid', '')}".rstrip("-")
    return f"pg-{_name(obj)}-{_uid(obj, _name(obj))}"


def unknown_devices(scheduler: str, node_name: str, gpu: p.GpuRequest, group: str,
                    devices: Sequence[int], *, ours: str = SCHEDULER_NAME) -> str:
    """Why a bound GPU pod's devices are not facts ("" when they are, or when they need not be).

    kai-es writes the GPU group and device indices on every shared-GPU pod it binds (KAI writes
    the group); for a whole-GPU pod the number of GPUs is the fact accounting needs. A bound pod
    of another scheduler states neither: its whole GPUs are counted by number (which devices is
    unknown), and a share of a GPU is counted as whole device(s) — it may sit on any device, so
    none of them can be trusted to have room left (conservative). A GPU share of `ours` (the
    scheduler name kai-es answers to) without either fact (bound by an older binder) gets devices
    the reducer infers."""
    if not node_name or devices:
        return ""
    shared = bool(gpu.fraction_milli or gpu.gpu_memory_mib)
    if shared and group:
        return ""
    if shared and scheduler != ours:
        return (f"bound by {scheduler} with a GPU share and no GPU group: counted as "
                f"{gpu.fraction_devices} whole GPU(s)")
    if shared:
        return "bound without GPU facts (no runai-gpu-group, no kai-es.io/gpu-devices): devices inferred"
    if gpu.whole and scheduler != ours:
        return f"bound by {scheduler}: which {gpu.whole} GPU(s) is unknown; counted by number"
    return ""


_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def pod_phase(obj: Obj) -> p.Phase:
    """A Pod's `status.phase` (Pending when absent); IngestError for an unknown one."""
    phase = _get(obj, "status.phase", "Pending")
    if phase not in _PHASES:
        raise IngestError("status.phase", f"unknown phase {phase!r}")
    return phase  # type: ignore[no-any-return]  # one of _PHASES


def pod_node_name(obj: Obj) -> str:
    """A Pod's `spec.nodeName` ("" when unbound)."""
    return str(_get(obj, "spec.nodeName", "") or "")


def pod_started_ns(obj: Obj) -> int:
    """A Pod's `status.startTime` as int ns (0 when absent); IngestError for a bad one."""
    return _timestamp(obj, "status.startTime")


def pod(obj: Obj, *, ours: str = SCHEDULER_NAME) -> p.PodObserved:
    """A Pod (`ours`: the scheduler name kai-es answers to, for `unknown_devices`)."""
    name = _name(obj)
    namespace = _namespace(obj)
    labels = _map(obj, "metadata.labels")
    annotations = _map(obj, "metadata.annotations")
    if annotations.get(GROUPING_ERROR_ANNOTATION):
        raise IngestError("metadata.ownerReferences", f"no PodGroup for this pod: {annotations[GROUPING_ERROR_ANNOTATION]}")
    cpu, memory, whole, scalar = _pod_requests(obj)
    gpu = gpu_request(annotations, whole)
    group = annotations.get(PODGROUP_ANNOTATION, "")
    implicit = not group
    if implicit:
        group = implicit_podgroup_name(obj)
    phase = pod_phase(obj)
    preempt = labels.get(PREEMPTIBILITY_LABEL, "")
    if preempt not in PREEMPTIBILITY_MODES:
        raise IngestError(f"metadata.labels[{PREEMPTIBILITY_LABEL}]",
                          f"must be preemptible, non-preemptible or semi-preemptible, got {preempt!r}")
    priority = _get(obj, "spec.priority")
    owners = _list(obj, "metadata.ownerReferences")
    owner = None
    if owners and isinstance(owners[0], Mapping) and owners[0].get("name"):
        o = owners[0]
        owner = p.OwnerRef(kind=str(o.get("kind", "")), name=str(o["name"]), uid=str(o.get("uid", "")))
    devices_text = annotations.get(GPU_DEVICES_ANNOTATION, "")
    devices = []
    if devices_text:
        devices = [_int(d.strip(), f"metadata.annotations[{GPU_DEVICES_ANNOTATION}]", minimum=0)
                   for d in devices_text.split(",")]
        if len(devices) > bounds.MAX_POD_GPUS or len(set(devices)) != len(devices):
            raise IngestError(f"metadata.annotations[{GPU_DEVICES_ANNOTATION}]",
                              f"must list distinct device indices (at most {bounds.MAX_POD_GPUS}), got {devices_text[:100]!r}")
    affinity, preferred = _pod_affinities(obj, "podAffinity")
    anti, preferred_anti = _pod_affinities(obj, "podAntiAffinity")
    claims, config_maps = _volumes(obj)
    delay, grace = _time_annotations(annotations)
    scheduler = str(_get(obj, "spec.schedulerName", "default-scheduler"))
    node_name = pod_node_name(obj)
    if (gpu.fraction_milli or gpu.gpu_memory_mib) and scheduler != ours and \
            unknown_devices(scheduler, node_name, gpu, labels.get(GPU_GROUP_LABEL, ""), devices, ours=ours):
        gpu = p.GpuRequest(whole=gpu.fraction_devices)  # conservative: see unknown_devices
    return p.PodObserved(
        namespace=namespace, name=name, uid=_uid(obj, f"{namespace}/{name}"),
        scheduler_name=scheduler,
        phase=phase, node_name=node_name,
        terminating=_get(obj, "metadata.deletionTimestamp") is not None,
        deletion_ns=_timestamp(obj, "metadata.deletionTimestamp"),
        queue=labels.get(QUEUE_LABEL, ""), podgroup=group, implicit_podgroup=implicit,
        priority_class=str(_get(obj, "spec.priorityClassName", "") or ""),
        priority=_int(priority, "spec.priority") if priority is not None else None,
        preemptibility=preempt,  # type: ignore[arg-type]
        requests=p.PodResources(milli_cpu=cpu, memory_bytes=memory), gpu=gpu,
        gpu_group=labels.get(GPU_GROUP_LABEL, ""), gpu_devices=tuple(devices),
        node_selector=_map(obj, "spec.nodeSelector"), affinity_terms=tuple(_affinity_terms(obj)),
        tolerations=tuple(_tolerations(obj)), subgroup=labels.get(SUBGROUP_LABEL, ""),
        node_pool=labels.get(NODE_POOL_LABEL, ""),
        task_priority=_int(labels.get(TASK_PRIORITY_LABEL, 0), f"metadata.labels[{TASK_PRIORITY_LABEL}]"),
        owner=owner, created_ns=created_ns(obj),
        labels=labels, preferred_affinity=tuple(_preferred_affinity(obj)),
        pod_affinity=tuple(affinity), pod_anti_affinity=tuple(anti), preferred_pod_affinity=tuple(preferred),
        preferred_pod_anti_affinity=tuple(preferred_anti), host_ports=tuple(_host_ports(obj)),
        scalar_requests=scalar, claims=tuple(claims), config_maps=tuple(config_maps),
        started_ns=pod_started_ns(obj), preemption_delay_ns=delay, staleness_grace_ns=grace,
        scheduling_gates=tuple(_scheduling_gates(obj)),
    )


# --- Queue, PodGroup, Topology, PriorityClass -----------------------------------------------

_QUEUE_UNIT = {"gpu": Fraction(1000), "cpu": Fraction(1), "memory": Fraction(10**6)}


_PLAIN_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_QUEUE_UNIT_NAME = {"gpu": "GPUs", "cpu": "millicores", "memory": "MB"}


def _queue_number(raw: Any, path: str, resource: str) -> Fraction:
    """A Queue amount: KAI's CRD types it as a number (in GPUs, millicores or MB), so the API
    server refuses a Kubernetes quantity such as `8Gi`; so does this (a string holding a plain
    number is taken, as YAML may quote one)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise IngestError(path, f"must be a number, got {raw!r}")
    if isinstance(raw, str) and not _PLAIN_NUMBER.match(raw.strip()):
        raise IngestError(path, f"must be a plain number of {_QUEUE_UNIT_NAME[resource]} (a Queue's "
                                f"quota and limit are numbers in KAI's units, not Kubernetes quantities), "
                                f"got {raw!r}")
    try:
        return parse_quantity(raw)
    except QuantityError as exc:
        raise IngestError(path, f"must be a number: {exc}") from None


def _queue_resource(obj: Obj, resource: str) -> p.QueueResource:
    """One resource of a Queue. A resource the Queue does not mention is not managed by it
    (quota -1: deserves whatever it requests, no limit); a mentioned one defaults to quota 0,
    limit -1 and weight 1 like KAI's CRD."""
    base = f"spec.resources.{resource}"
    spec = _get(obj, base, None)
    if spec is None:
        return p.QueueResource(quota=-1, over_quota_weight=1, limit=-1)
    if not isinstance(spec, Mapping):
        raise IngestError(base, "must be a map")

    def amount(field: str, default: int) -> int:
        raw = spec.get(field)
        if raw is None:
            return default
        value = _queue_number(raw, f"{base}.{field}", resource)
        if value == -1:
            return -1
        if value < 0:
            raise IngestError(f"{base}.{field}", f"must be -1 (unlimited) or >= 0, got {raw!r}")
        scaled = value * _QUANTITY_SCALE(resource)
        return -((-scaled.numerator) // scaled.denominator)

    weight_raw = spec.get("overQuotaWeight", 1)
    weight = _int(weight_raw, f"{base}.overQuotaWeight", minimum=0)
    return p.QueueResource(quota=amount("quota", 0), over_quota_weight=weight,
                           limit=amount("limit", -1))


def _QUANTITY_SCALE(resource: str) -> Fraction:  # noqa: N802 - table lookup
    return _QUEUE_UNIT[resource]


def check_queue(q: p.QueueObserved) -> None:
    """The rules a Queue must keep across its fields (raises IngestError naming the field): a
    limit is not below its quota. Shared by `queue` and what-if edits of a Queue. (A Queue that
    is its own parent is a loop of one: the cycle holds its jobs with QueueLoop naming the chain,
    as it does for longer loops no single object shows.)"""
    for r in ("gpu", "cpu", "memory"):
        res: p.QueueResource = getattr(q, r)
        if res.limit != -1 and res.quota != -1 and res.limit < res.quota:
            raise IngestError(f"spec.resources.{r}.limit",
                              f"limit ({res.limit}) is below quota ({res.quota}) in "
                              f"{'milli-GPU' if r == 'gpu' else 'milli-CPU' if r == 'cpu' else 'bytes'}")


def queue(obj: Obj) -> p.QueueObserved:
    name = _name(obj)
    priority = _get(obj, "spec.priority", 100)
    resources = _get(obj, "spec.resources")
    if resources is not None and not isinstance(resources, Mapping):
        raise IngestError("spec.resources", f"must be a map of gpu, cpu and memory, got {type(resources).__name__}")
    res = {r: _queue_resource(obj, r) for r in ("gpu", "cpu", "memory")}
    out = p.QueueObserved(
        name=name, uid=_uid(obj, name), parent=str(_get(obj, "spec.parentQueue", "") or ""),
        priority=_int(priority, "spec.priority"), gpu=res["gpu"], cpu=res["cpu"], memory=res["memory"],
        preempt_min_runtime_ns=_optional_duration(_get(obj, "spec.preemptMinRuntime"), "spec.preemptMinRuntime"),
        reclaim_min_runtime_ns=_optional_duration(_get(obj, "spec.reclaimMinRuntime"), "spec.reclaimMinRuntime"),
        created_ns=created_ns(obj),
    )
    check_queue(out)
    return out


def podgroup(obj: Obj) -> p.PodGroupObserved:
    name = _name(obj)
    namespace = _namespace(obj)
    subgroups = []
    for i, sg in enumerate(_list(obj, "spec.subGroups")):
        path = f"spec.subGroups[{i}]"
        if not isinstance(sg, Mapping) or not sg.get("name"):
            raise IngestError(path, "needs a name")
        min_sub = sg.get("minSubGroup")
        topology, required, preferred = _topology_constraint(sg.get("topologyConstraint"),
                                                             f"{path}.topologyConstraint")
        subgroups.append(p.SubGroup(
            name=str(sg["name"]), min_member=_int(sg.get("minMember", 1), f"{path}.minMember", minimum=0),
            parent=str(sg.get("parent", "") or ""),
            min_subgroup=_int(min_sub, f"{path}.minSubGroup", minimum=0) if min_sub is not None else None,
            topology=topology, required_topology_level=required, preferred_topology_level=preferred))
    names = [sg.name for sg in subgroups]
    for i, sg in enumerate(subgroups):
        if names.count(sg.name) > 1:
            raise IngestError(f"spec.subGroups[{i}].name", f"sub-group {sg.name!r} is defined twice")
        if sg.parent and sg.parent not in names:
            raise IngestError(f"spec.subGroups[{i}].parent", f"no sub-group named {sg.parent!r}")
    _check_subgroup_tree(subgroups)
    _check_subgroup_minimums(_list(obj, "spec.subGroups"), subgroups)
    top_min_member = _get(obj, "spec.minMember")
    top_min_subgroup = _get(obj, "spec.minSubGroup")
    if top_min_member is not None and top_min_subgroup is not None:
        raise IngestError("spec.minSubGroup", "minMember and minSubGroup are mutually exclusive: set minMember "
                          "for a number of pods, or minSubGroup for a number of child sub-groups, not both")
    min_subgroup = None
    if top_min_subgroup is not None:
        min_subgroup = _int(top_min_subgroup, "spec.minSubGroup", minimum=0)
        roots = sum(1 for sg in subgroups if not sg.parent)
        if min_subgroup > roots:
            raise IngestError("spec.minSubGroup", f"minSubGroup ({min_subgroup}) exceeds the number of "
                                                  f"direct child sub-groups ({roots})")
    preempt = _get(obj, "spec.preemptibility", "")
    if preempt not in PREEMPTIBILITY_MODES:
        raise IngestError("spec.preemptibility",
                          f"must be preemptible, non-preemptible or semi-preemptible, got {preempt!r}")
    grace = _get(obj, "spec.stalenessGracePeriod")
    delay = _get(obj, "spec.preemptionDelay")
    annotations = _map(obj, "metadata.annotations")
    annotated_delay, annotated_grace = _time_annotations(annotations)
    topology, required, preferred = _topology_constraint(_get(obj, "spec.topologyConstraint"),
                                                         "spec.topologyConstraint")
    return p.PodGroupObserved(
        namespace=namespace, name=name, uid=_uid(obj, f"{namespace}/{name}"),
        queue=str(_get(obj, "spec.queue", "") or ""),
        min_member=_int(_get(obj, "spec.minMember", 0 if min_subgroup is not None else 1), "spec.minMember",
                        minimum=0),
        min_subgroup=min_subgroup,
        priority_class=str(_get(obj, "spec.priorityClassName", "") or ""),
        preemptibility=preempt, subgroups=tuple(subgroups),
        topology=topology, required_topology_level=required, preferred_topology_level=preferred,
        staleness_grace_ns=(_duration(grace, "spec.stalenessGracePeriod", signed=True) if grace is not None
                            else annotated_grace),
        preemption_delay_ns=(_duration(delay, "spec.preemptionDelay") if delay is not None
                             else annotated_delay),
        created_ns=created_ns(obj),
        stale_timestamp_ns=_handover_time(annotations, STALE_TIMESTAMP_ANNOTATION),
        last_eviction_timestamp_ns=_handover_time(annotations, LAST_EVICTION_TIMESTAMP_ANNOTATION),
    )


def _topology_constraint(raw: object, path: str) -> tuple[str, str, str]:
    """(topology, requiredTopologyLevel, preferredTopologyLevel) of a `topologyConstraint` map
    (absent: all empty). A level without a topology name is rejected: a level is a node label of
    a named Topology's levels, and which Topology is meant must be said (KAI requires the name).
    Whether the levels exist, and their order, depend on the Topology object, which may arrive
    later: the scheduler checks them (`kai_es.scheduling.topology`)."""
    if raw is None:
        return "", "", ""
    if not isinstance(raw, Mapping):
        raise IngestError(path, "must be a map")
    values = []
    for field in ("topology", "requiredTopologyLevel", "preferredTopologyLevel"):
        value = raw.get(field)
        if value is not None and not isinstance(value, str):
            raise IngestError(f"{path}.{field}", f"must be a string, got {value!r}")
        values.append(value or "")
    topology, required, preferred = values
    if (required or preferred) and not topology:
        raise IngestError(f"{path}.topology", "is required with requiredTopologyLevel or preferredTopologyLevel: "
                                              "name the Topology whose levels they are")
    return topology, required, preferred


def _check_subgroup_tree(subgroups: list[p.SubGroup]) -> None:
    """Sub-groups form a tree under the PodGroup: a parent chain that comes back to where it
    started is refused, naming the loop (it has no root for the gang's minimum to count from)."""
    parent = {sg.name: sg.parent for sg in subgroups}
    for i, sg in enumerate(subgroups):
        chain = [sg.name]
        cur = sg.parent
        while cur:
            if cur in chain:
                loop = chain[chain.index(cur):] + [cur]
                raise IngestError(f"spec.subGroups[{i}].parent",
                                  f"sub-group parents loop: {' -> '.join(loop)} (sub-groups must form a tree)")
            chain.append(cur)
            cur = parent.get(cur, "")


def _check_subgroup_minimums(raw: list[Any], subgroups: list[p.SubGroup]) -> None:
    """KAI's PodGroup validation of each sub-group: minMember and minSubGroup are mutually
    exclusive; a leaf needs minMember and cannot have minSubGroup; a sub-group with children
    cannot have minMember, and its minSubGroup may not exceed its number of children."""
    children: dict[str, int] = {}
    for sg in subgroups:
        if sg.parent:
            children[sg.parent] = children.get(sg.parent, 0) + 1
    for i, (item, sg) in enumerate(zip(raw, subgroups)):
        path = f"spec.subGroups[{i}]"
        has_member = isinstance(item, Mapping) and item.get("minMember") is not None
        has_subgroup = sg.min_subgroup is not None
        if has_member and has_subgroup:
            raise IngestError(f"{path}.minSubGroup", f"sub-group {sg.name!r}: minMember and minSubGroup are mutually exclusive")
        kids = children.get(sg.name, 0)
        if kids == 0 and has_subgroup:
            raise IngestError(f"{path}.minSubGroup",
                              f"sub-group {sg.name!r} has no child sub-groups: minSubGroup cannot be set on a leaf")
        if kids == 0 and not has_member:
            raise IngestError(f"{path}.minMember", f"sub-group {sg.name!r} is a leaf: minMember is required")
        if kids and has_member:
            raise IngestError(f"{path}.minMember", f"sub-group {sg.name!r} has child sub-groups: "
                                                   f"use minSubGroup instead of minMember")
        if kids and has_subgroup and sg.min_subgroup is not None and sg.min_subgroup > kids:
            raise IngestError(f"{path}.minSubGroup", f"sub-group {sg.name!r}: minSubGroup ({sg.min_subgroup}) "
                                                     f"exceeds its number of direct child sub-groups ({kids})")


def topology(obj: Obj) -> p.TopologyObserved:
    """A Topology's levels, widest first. As KAI's CRD: at least one level, each a node label
    that no other level of the same Topology uses."""
    levels: list[str] = []
    for i, level in enumerate(_list(obj, "spec.levels")):
        key = level.get("nodeLabel") if isinstance(level, Mapping) else None
        if not key or not isinstance(key, str):
            raise IngestError(f"spec.levels[{i}].nodeLabel", "is required (a node label key)")
        if key in levels:
            raise IngestError(f"spec.levels[{i}].nodeLabel",
                              f"{key!r} is already level {levels.index(key)}: each level needs its own node label")
        levels.append(key)
    if not levels:
        raise IngestError("spec.levels", "needs at least one level (a nodeLabel), widest domain first")
    return p.TopologyObserved(name=_name(obj), levels=tuple(levels))


def priority_class(obj: Obj) -> p.PriorityClassObserved:
    value = obj.get("value")
    if value is None:
        raise IngestError("value", "is required")
    return p.PriorityClassObserved(
        name=_name(obj), value=_int(value, "value"),
        preemption_policy=str(obj.get("preemptionPolicy", "PreemptLowerPriority")))


def namespace(obj: Obj) -> p.NamespaceObserved:
    name = _name(obj)
    labels = _map(obj, "metadata.labels")
    labels.setdefault("kubernetes.io/metadata.name", name)  # set by the API server on every namespace
    return p.NamespaceObserved(name=name, labels=labels)


def claim(obj: Obj) -> p.ClaimObserved:
    name = _name(obj)
    namespace = _namespace(obj)
    phase = _get(obj, "status.phase", "Pending")
    if phase not in ("Pending", "Bound", "Lost"):
        raise IngestError("status.phase", f"unknown phase {phase!r}")
    return p.ClaimObserved(namespace=namespace, name=name, uid=_uid(obj, f"{namespace}/{name}"),
                           phase=phase, volume=str(_get(obj, "spec.volumeName", "") or ""))


def volume(obj: Obj) -> p.VolumeObserved:
    base = "spec.nodeAffinity.required"
    required = _get(obj, base)
    if required is not None and not isinstance(required, Mapping):
        raise IngestError(base, "must be a map")
    terms = node_selector_terms((required or {}).get("nodeSelectorTerms") or [], f"{base}.nodeSelectorTerms")
    return p.VolumeObserved(name=_name(obj), node_affinity=tuple(terms))


def config_map(obj: Obj) -> p.ConfigMapObserved:
    return p.ConfigMapObserved(namespace=_namespace(obj), name=_name(obj))


#: (apiVersion group, kind) -> translator. The apiVersion's group must match; version may vary.
TRANSLATORS: dict[tuple[str, str], Any] = {
    ("", "Node"): node,
    ("", "Pod"): pod,
    ("scheduling.run.ai", "Queue"): queue,
    ("scheduling.run.ai", "PodGroup"): podgroup,
    ("kai.scheduler", "Topology"): topology,
    ("scheduling.k8s.io", "PriorityClass"): priority_class,
    ("", "Namespace"): namespace,
    ("", "PersistentVolumeClaim"): claim,
    ("", "PersistentVolume"): volume,
    ("", "ConfigMap"): config_map,
}


def api_group(obj: Obj) -> str:
    version = str(obj.get("apiVersion", ""))
    return version.rsplit("/", 1)[0] if "/" in version else ""


def translate(obj: Obj, *, ours: str = SCHEDULER_NAME) -> p.Payload:
    """The observed-event payload of any supported object (`ours`: the scheduler name kai-es
    answers to, which a Pod's translation depends on)."""
    if not isinstance(obj, Mapping):
        raise IngestError("", "a Kubernetes object must be a map")
    kind = obj.get("kind")
    fn = TRANSLATORS.get((api_group(obj), str(kind)))
    if fn is None:
        raise IngestError("kind", f"unsupported object {obj.get('apiVersion')}/{kind}")
    try:
        result: p.Payload = pod(obj, ours=ours) if fn is pod else fn(obj)
    except IngestError:
        raise
    except (msgspec.ValidationError, TypeError, AttributeError, ValueError) as exc:
        raise IngestError("", f"invalid {kind}: {exc}") from None
    return result


def removal(obj: Obj) -> p.Payload:
    """The removed-event payload of a deleted object."""
    kind = str(obj.get("kind"))
    name = _name(obj)
    if kind == "Node":
        return p.NodeRemoved(name=name)
    if kind == "Pod":
        return p.PodRemoved(namespace=_namespace(obj), name=name, uid=str(_get(obj, "metadata.uid", "") or ""))
    if kind == "Queue":
        return p.QueueRemoved(name=name)
    if kind == "PodGroup":
        return p.PodGroupRemoved(namespace=_namespace(obj), name=name)
    if kind == "Topology":
        return p.TopologyRemoved(name=name)
    if kind == "PriorityClass":
        return p.PriorityClassRemoved(name=name)
    if kind == "Namespace":
        return p.NamespaceRemoved(name=name)
    if kind == "PersistentVolumeClaim":
        return p.ClaimRemoved(namespace=_namespace(obj), name=name)
    if kind == "PersistentVolume":
        return p.VolumeRemoved(name=name)
    if kind == "ConfigMap":
        return p.ConfigMapRemoved(namespace=_namespace(obj), name=name)
    raise IngestError("kind", f"unsupported object kind {kind!r}")


def subject_of(payload: p.Payload) -> str:
    """CloudEvents subject (and Kafka key) of an observed/removed payload."""
    kind = type(payload).__name__.replace("Observed", "").replace("Removed", "").lower()
    ns = getattr(payload, "namespace", None)
    name = getattr(payload, "name", "")
    return f"{kind}/{ns}/{name}" if ns else f"{kind}/{name}"
