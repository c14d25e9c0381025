"""Kubernetes objects (plain JSON dicts) to observed-event payloads. Pure functions.

The same functions serve the informer (live objects) and the scenario loader (YAML files).

Contract: `translate(obj)` returns the payload for a supported kind or raises `IngestError`
with the field path and a readable message; it never raises anything else on any JSON input.
Quantities come out as integers: milli-CPU, bytes, milli-GPU, MiB. Queue quotas follow KAI's
units (CPU millicores, memory MB, GPU devices, possibly fractional) and are stored as milli-CPU,
bytes and milli-GPU; -1 (unlimited) stays -1.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import msgspec

from kai_es.events import payloads as p
from kai_es.events.timefmt import parse_duration, parse_rfc3339
from kai_es.ingest.quantity import QuantityError, parse_quantity, to_milli, to_units

from kai_es.ingest.names import SCHEDULER_NAME
GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_LABEL = "kai.scheduler/queue"
PODGROUP_ANNOTATION = "pod-group-name"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
TASK_PRIORITY_LABEL = "kai.scheduler/task-priority"
GPU_GROUP_LABEL = "runai-gpu-group"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_MODEL_LABEL = "nvidia.com/gpu.product"


class IngestError(ValueError):
    """An object that cannot be translated; `path` is the offending field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


Obj = Mapping[str, Any]


def _get(obj: Obj, path: str, default: Any = None) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return default
        cur = cur.get(part)
        if cur is None:
            return default
    return cur


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
    return out


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


def created_ns(obj: Obj) -> int:
    """metadata.creationTimestamp as int ns, or 0 when absent."""
    ts = _get(obj, "metadata.creationTimestamp")
    if ts is None:
        return 0
    try:
        return parse_rfc3339(str(ts))
    except ValueError as exc:
        raise IngestError("metadata.creationTimestamp", str(exc)) from None


def _duration(value: Any, path: str) -> int:
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        raise IngestError(path, str(exc)) from None


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
    for field, value in (("cpu", cpu), ("memory", memory), (GPU_RESOURCE, gpus), ("pods", pods)):
        if value < 0:
            raise IngestError(f"{base}.{field}", "must not be negative")
    return p.NodeObserved(
        name=name, uid=_uid(obj, name), labels=labels, taints=taints,
        unschedulable=bool(_get(obj, "spec.unschedulable", False)), milli_cpu=cpu,
        memory_bytes=memory, gpus=gpus, max_pods=pods, gpu_memory_mib=gpu_mem,
        gpu_model=labels.get(GPU_MODEL_LABEL, ""),
    )


# --- Pod ----------------------------------------------------------------------------------


def _container_requests(c: Obj, path: str) -> tuple[int, int, int]:
    req = _get(c, "resources.requests") or {}
    lim = _get(c, "resources.limits") or {}
    if not isinstance(req, Mapping) or not isinstance(lim, Mapping):
        raise IngestError(f"{path}.resources", "requests and limits must be maps")
    cpu = req.get("cpu", lim.get("cpu", 0))
    mem = req.get("memory", lim.get("memory", 0))
    gpu = req.get(GPU_RESOURCE, lim.get(GPU_RESOURCE, 0))
    return (_milli(cpu, f"{path}.resources.requests.cpu"),
            _units(mem, f"{path}.resources.requests.memory"),
            _units(gpu, f"{path}.resources.requests[{GPU_RESOURCE}]"))


def _pod_requests(obj: Obj) -> tuple[int, int, int]:
    total = [0, 0, 0]
    for i, c in enumerate(_list(obj, "spec.containers")):
        if not isinstance(c, Mapping):
            raise IngestError(f"spec.containers[{i}]", "must be a map")
        for k, v in enumerate(_container_requests(c, f"spec.containers[{i}]")):
            total[k] += v
    for i, c in enumerate(_list(obj, "spec.initContainers")):
        if not isinstance(c, Mapping):
            raise IngestError(f"spec.initContainers[{i}]", "must be a map")
        for k, v in enumerate(_container_requests(c, f"spec.initContainers[{i}]")):
            total[k] = max(total[k], v)
    return total[0], total[1], total[2]


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
    return p.GpuRequest(whole=whole, fraction_milli=fraction, gpu_memory_mib=gpu_memory,
                        fraction_devices=devices if (fraction or gpu_memory) else 1)


def _affinity_terms(obj: Obj) -> list[p.NodeSelectorTerm]:
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    terms = []
    for i, term in enumerate(_list(obj, base)):
        exprs = []
        for j, e in enumerate(term.get("matchExpressions", []) if isinstance(term, Mapping) else []):
            path = f"{base}[{i}].matchExpressions[{j}]"
            try:
                exprs.append(msgspec.convert(
                    {"key": e.get("key"), "operator": e.get("operator"),
                     "values": [str(v) for v in e.get("values", []) or []]},
                    p.NodeSelectorRequirement))
            except (msgspec.ValidationError, AttributeError) as exc:
                raise IngestError(path, str(exc)) from None
        terms.append(p.NodeSelectorTerm(match_expressions=exprs))
    return terms


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


def pod(obj: Obj) -> p.PodObserved:
    name = _name(obj)
    namespace = _namespace(obj)
    labels = _map(obj, "metadata.labels")
    annotations = _map(obj, "metadata.annotations")
    cpu, memory, whole = _pod_requests(obj)
    gpu = gpu_request(annotations, whole)
    group = annotations.get(PODGROUP_ANNOTATION, "")
    implicit = not group
    if implicit:
        group = implicit_podgroup_name(obj)
    phase = _get(obj, "status.phase", "Pending")
    if phase not in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
        raise IngestError("status.phase", f"unknown phase {phase!r}")
    preempt = labels.get(PREEMPTIBILITY_LABEL, "")
    if preempt not in ("", "preemptible", "non-preemptible"):
        raise IngestError(f"metadata.labels[{PREEMPTIBILITY_LABEL}]",
                          f"must be preemptible or non-preemptible, got {preempt!r}")
    priority = _get(obj, "spec.priority")
    owners = _list(obj, "metadata.ownerReferences")
    owner = None
    if owners and isinstance(owners[0], Mapping) and owners[0].get("name"):
        o = owners[0]
        owner = p.OwnerRef(kind=str(o.get("kind", "")), name=str(o["name"]), uid=str(o.get("uid", "")))
    devices_text = annotations.get("kai-es.io/gpu-devices", "")
    devices = []
    if devices_text:
        devices = [_int(d, "metadata.annotations[kai-es.io/gpu-devices]", minimum=0)
                   for d in devices_text.split(",")]
    return p.PodObserved(
        namespace=namespace, name=name, uid=_uid(obj, f"{namespace}/{name}"),
        scheduler_name=str(_get(obj, "spec.schedulerName", "default-scheduler")),
        phase=phase, node_name=str(_get(obj, "spec.nodeName", "") or ""),
        terminating=_get(obj, "metadata.deletionTimestamp") is not None,
        queue=labels.get(QUEUE_LABEL, ""), podgroup=group, implicit_podgroup=implicit,
        priority_class=str(_get(obj, "spec.priorityClassName", "") or ""),
        priority=_int(priority, "spec.priority") if priority is not None else None,
        preemptibility=preempt,  # type: ignore[arg-type]
        requests=p.PodResources(milli_cpu=cpu, memory_bytes=memory), gpu=gpu,
        gpu_group=labels.get(GPU_GROUP_LABEL, ""), gpu_devices=devices,
        node_selector=_map(obj, "spec.nodeSelector"), affinity_terms=_affinity_terms(obj),
        tolerations=_tolerations(obj), subgroup=labels.get(SUBGROUP_LABEL, ""),
        node_pool=labels.get(NODE_POOL_LABEL, ""),
        task_priority=_int(labels.get(TASK_PRIORITY_LABEL, 0), f"metadata.labels[{TASK_PRIORITY_LABEL}]"),
        owner=owner, created_ns=created_ns(obj),
    )


# --- Queue, PodGroup, Topology, PriorityClass -----------------------------------------------

_QUEUE_UNIT = {"gpu": Fraction(1000), "cpu": Fraction(1), "memory": Fraction(10**6)}


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
        try:
            value = parse_quantity(raw)
        except QuantityError:
            raise IngestError(f"{base}.{field}", f"must be a number, got {raw!r}") from None
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


def queue(obj: Obj) -> p.QueueObserved:
    name = _name(obj)
    priority = _get(obj, "spec.priority", 100)
    res = {r: _queue_resource(obj, r) for r in ("gpu", "cpu", "memory")}
    for r, q in res.items():
        if q.limit != -1 and q.quota != -1 and q.limit < q.quota:
            raise IngestError(f"spec.resources.{r}.limit", f"limit is below quota")
    return p.QueueObserved(
        name=name, uid=_uid(obj, name), parent=str(_get(obj, "spec.parentQueue", "") or ""),
        priority=_int(priority, "spec.priority"), gpu=res["gpu"], cpu=res["cpu"], memory=res["memory"],
        preempt_min_runtime_ns=_duration(_get(obj, "spec.preemptMinRuntime", "0s"), "spec.preemptMinRuntime"),
        reclaim_min_runtime_ns=_duration(_get(obj, "spec.reclaimMinRuntime", "0s"), "spec.reclaimMinRuntime"),
        created_ns=created_ns(obj),
    )


def podgroup(obj: Obj) -> p.PodGroupObserved:
    name = _name(obj)
    namespace = _namespace(obj)
    subgroups = []
    for i, sg in enumerate(_list(obj, "spec.subGroups")):
        path = f"spec.subGroups[{i}]"
        if not isinstance(sg, Mapping) or not sg.get("name"):
            raise IngestError(path, "needs a name")
        min_sub = sg.get("minSubGroup")
        subgroups.append(p.SubGroup(
            name=str(sg["name"]), min_member=_int(sg.get("minMember", 1), f"{path}.minMember", minimum=0),
            parent=str(sg.get("parent", "") or ""),
            min_subgroup=_int(min_sub, f"{path}.minSubGroup", minimum=0) if min_sub is not None else None))
    names = [sg.name for sg in subgroups]
    for i, sg in enumerate(subgroups):
        if names.count(sg.name) > 1:
            raise IngestError(f"spec.subGroups[{i}].name", f"sub-group {sg.name!r} is defined twice")
        if sg.parent and sg.parent not in names:
            raise IngestError(f"spec.subGroups[{i}].parent", f"no sub-group named {sg.parent!r}")
    preempt = _get(obj, "spec.preemptibility", "")
    if preempt not in ("", "preemptible", "non-preemptible"):
        raise IngestError("spec.preemptibility", f"must be preemptible or non-preemptible, got {preempt!r}")
    grace = _get(obj, "spec.stalenessGracePeriod")
    topo = _get(obj, "spec.topologyConstraint", {}) or {}
    if not isinstance(topo, Mapping):
        raise IngestError("spec.topologyConstraint", "must be a map")
    return p.PodGroupObserved(
        namespace=namespace, name=name, uid=_uid(obj, f"{namespace}/{name}"),
        queue=str(_get(obj, "spec.queue", "") or ""),
        min_member=_int(_get(obj, "spec.minMember", 1), "spec.minMember", minimum=0),
        priority_class=str(_get(obj, "spec.priorityClassName", "") or ""),
        preemptibility=preempt, subgroups=subgroups,
        topology=str(topo.get("topology", "") or ""),
        required_topology_level=str(topo.get("requiredTopologyLevel", "") or ""),
        preferred_topology_level=str(topo.get("preferredTopologyLevel", "") or ""),
        staleness_grace_ns=_duration(grace, "spec.stalenessGracePeriod") if grace is not None else None,
        created_ns=created_ns(obj),
    )


def topology(obj: Obj) -> p.TopologyObserved:
    levels = []
    for i, level in enumerate(_list(obj, "spec.levels")):
        key = level.get("nodeLabel") if isinstance(level, Mapping) else None
        if not key:
            raise IngestError(f"spec.levels[{i}].nodeLabel", "is required")
        levels.append(str(key))
    return p.TopologyObserved(name=_name(obj), levels=levels)


def priority_class(obj: Obj) -> p.PriorityClassObserved:
    value = obj.get("value")
    if value is None:
        raise IngestError("value", "is required")
    return p.PriorityClassObserved(
        name=_name(obj), value=_int(value, "value"),
        preemption_policy=str(obj.get("preemptionPolicy", "PreemptLowerPriority")))


#: (apiVersion group, kind) -> translator. The apiVersion's group must match; version may vary.
TRANSLATORS: dict[tuple[str, str], Any] = {
    ("", "Node"): node,
    ("", "Pod"): pod,
    ("scheduling.run.ai", "Queue"): queue,
    ("scheduling.run.ai", "PodGroup"): podgroup,
    ("kai.scheduler", "Topology"): topology,
    ("scheduling.k8s.io", "PriorityClass"): priority_class,
}


def api_group(obj: Obj) -> str:
    version = str(obj.get("apiVersion", ""))
    return version.rsplit("/", 1)[0] if "/" in version else ""


def translate(obj: Obj) -> p.Payload:
    """The observed-event payload of any supported object."""
    if not isinstance(obj, Mapping):
        raise IngestError("", "a Kubernetes object must be a map")
    kind = obj.get("kind")
    fn = TRANSLATORS.get((api_group(obj), str(kind)))
    if fn is None:
        raise IngestError("kind", f"unsupported object {obj.get('apiVersion')}/{kind}")
    try:
        result: p.Payload = fn(obj)
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
    raise IngestError("kind", f"unsupported object kind {kind!r}")


def subject_of(payload: p.Payload) -> str:
    """CloudEvents subject (and Kafka key) of an observed/removed payload."""
    kind = type(payload).__name__.replace("Observed", "").replace("Removed", "").lower()
    ns = getattr(payload, "namespace", None)
    name = getattr(payload, "name", "")
    return f"{kind}/{ns}/{name}" if ns else f"{kind}/{name}"
