"""A pod's spec as the state digests of policies before kai-es/v16 hash it.

The digest (`kai_es.state.incremental_digest`) hashes each entity's deterministic msgpack
encoding, and msgpack writes a struct's fields in the order they are declared. Until v16,
`PodObserved` (and its `PodResources` and `GpuRequest`) declared them in the order they were
added; v16 declared them in name order, which is the order of their keys in canonical bytes
and makes decoding cheaper (`kai_es.events.payloads`). Every log written before holds digests
of the old order, and replays to them only if those policies keep hashing it: this module
rebuilds that order.

Contract: under a policy whose fold rules say `name_ordered_specs` is False,
`legacy_spec(spec)` encodes (`msgspec.msgpack`, any order option) exactly as `spec` encoded
before the reorder, for every spec: the same fields, defaults and omissions (msgspec omits a
struct-valued field only when it *is* the default object, so the default request objects map to
the legacy classes' default objects and every other one to a new object), in the old order.
tests/test_legacy_spec_form.py holds it to the old classes, copied there as they were.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Final

import msgspec

from kai_es.events import payloads as p

#: the field orders before kai-es/v16 (recorded: the payload classes no longer have them)
POD_ORDER: Final = (
    "namespace", "name", "uid", "scheduler_name", "phase", "node_name", "terminating", "queue", "podgroup",
    "implicit_podgroup", "priority_class", "priority", "preemptibility", "requests", "gpu", "gpu_group",
    "gpu_devices", "node_selector", "affinity_terms", "tolerations", "subgroup", "node_pool", "task_priority",
    "owner", "created_ns", "labels", "preferred_affinity", "pod_affinity", "pod_anti_affinity",
    "preferred_pod_affinity", "preferred_pod_anti_affinity", "host_ports", "scalar_requests", "claims",
    "config_maps", "started_ns", "preemption_delay_ns", "staleness_grace_ns", "deletion_ns", "scheduling_gates",
)
RESOURCES_ORDER: Final = ("milli_cpu", "memory_bytes")
GPU_ORDER: Final = ("whole", "fraction_milli", "gpu_memory_mib", "fraction_devices")
assert set(POD_ORDER) == set(p.PodObserved.__struct_fields__), "a PodObserved field added: not in the old order"


def twin(cls: type[msgspec.Struct], order: tuple[str, ...], name: str,
         replaced: dict[str, tuple[type, object]] | None = None) -> type[msgspec.Struct]:
    """A struct of `cls`'s fields named in `order` (some or all of them), in that order,
    positional, with `cls`'s own default objects (or `replaced`'s type and default), omitting
    defaults as `cls` does: it encodes as `cls` did when it declared those fields so. A required
    field after one with a default (PodObserved's `podgroup`) gets UNSET as its default:
    positional fields need it, and a spec never holds UNSET, so it is always written."""
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    assert set(order) <= set(fields), (cls, set(order) - set(fields))
    spec: list[Any] = []
    seen_default = False
    for field_name in order:
        f = fields[field_name]
        if replaced and field_name in replaced:
            spec.append((field_name, *replaced[field_name]))
            seen_default = True
        elif f.required:
            spec.append((field_name, f.type | msgspec.UnsetType, msgspec.UNSET) if seen_default
                        else (field_name, f.type))
        else:
            default = f.default if f.default is not msgspec.NODEFAULT else msgspec.field(
                default_factory=f.default_factory)
            spec.append((field_name, f.type, default))
            seen_default = True
    return msgspec.defstruct(name, spec, frozen=True, omit_defaults=True, gc=False)


_Resources: Final[Any] = twin(p.PodResources, RESOURCES_ORDER, "PodResourcesBeforeV16")
_Gpu: Final[Any] = twin(p.GpuRequest, GPU_ORDER, "GpuRequestBeforeV16")
_RESOURCES_DEFAULT: Final = _Resources()
_GPU_DEFAULT: Final = _Gpu()
_POD_FIELDS: Final = {f.name: f for f in msgspec.structs.fields(p.PodObserved)}
#: the default objects of the current classes, mapped by identity to the legacy ones
_NEW_RESOURCES_DEFAULT: Final = _POD_FIELDS["requests"].default
_NEW_GPU_DEFAULT: Final = _POD_FIELDS["gpu"].default
_Pod: Final[Any] = twin(p.PodObserved, POD_ORDER, "PodObservedBeforeV16",
                         {"requests": (_Resources, _RESOURCES_DEFAULT), "gpu": (_Gpu, _GPU_DEFAULT)})
#: the current class's values (astuple: declaration order) picked in the legacy order
_IN_POD_ORDER: Final = itemgetter(*(p.PodObserved.__struct_fields__.index(n) for n in POD_ORDER))
_REQUESTS_AT: Final = POD_ORDER.index("requests")
_GPU_AT: Final = POD_ORDER.index("gpu")


def legacy_spec(spec: p.PodObserved) -> Any:
    """`spec` as a struct that encodes in the field order before kai-es/v16 (module docstring)."""
    values = list(_IN_POD_ORDER(msgspec.structs.astuple(spec)))
    r, g = spec.requests, spec.gpu
    values[_REQUESTS_AT] = _RESOURCES_DEFAULT if r is _NEW_RESOURCES_DEFAULT else _Resources(
        r.milli_cpu, r.memory_bytes)
    values[_GPU_AT] = _GPU_DEFAULT if g is _NEW_GPU_DEFAULT else _Gpu(
        g.whole, g.fraction_milli, g.gpu_memory_mib, g.fraction_devices)
    return _Pod(*values)
