"""The pod spec as digests before kai-es/v16 hash it (`kai_es.state.legacy_spec_form`): held to
the payload classes as they were declared before v16 put their fields in name order, copied
here as they were (types, defaults, order), on specs decoded from canonical bytes (as a fold
gets them) and on specs built directly (as the informer and the what-if build them)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kai_es.events import payloads as p
from kai_es.events.codec import encode_payload
from kai_es.state.incremental_digest import encode_form
from kai_es.state.legacy_spec_form import legacy_spec


class OldResources(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    milli_cpu: int = 0
    memory_bytes: int = 0


class OldGpu(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    whole: int = 0
    fraction_milli: int = 0
    gpu_memory_mib: int = 0
    fraction_devices: int = 1


class OldPodObserved(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    namespace: str
    name: str
    uid: str
    scheduler_name: str = "kai-scheduler"
    phase: p.Phase = "Pending"
    node_name: str = ""
    terminating: bool = False
    queue: str = ""
    podgroup: str
    implicit_podgroup: bool = False
    priority_class: str = ""
    priority: int | None = None
    preemptibility: p.Preemptibility = ""
    requests: OldResources = OldResources()
    gpu: OldGpu = OldGpu()
    gpu_group: str = ""
    gpu_devices: list[int] = []
    node_selector: dict[str, str] = {}
    affinity_terms: list[p.NodeSelectorTerm] = []
    tolerations: list[p.Toleration] = []
    subgroup: str = ""
    node_pool: str = ""
    task_priority: int = 0
    owner: p.OwnerRef | None = None
    created_ns: int = 0
    labels: dict[str, str] = {}
    preferred_affinity: list[p.PreferredSchedulingTerm] = []
    pod_affinity: list[p.PodAffinityTerm] = []
    pod_anti_affinity: list[p.PodAffinityTerm] = []
    preferred_pod_affinity: list[p.WeightedPodAffinityTerm] = []
    preferred_pod_anti_affinity: list[p.WeightedPodAffinityTerm] = []
    host_ports: list[p.HostPort] = []
    scalar_requests: dict[str, int] = {}
    claims: list[str] = []
    config_maps: list[str] = []
    started_ns: int = 0
    preemption_delay_ns: int | None = None
    staleness_grace_ns: int | None = None
    deletion_ns: int = 0
    scheduling_gates: list[str] = []


_ENCODE = encode_form  # (the digest's encoding)
# past what msgpack carries (the digest tags those apart), and often at its edges
_big = st.integers(-(2**128), 2**128) | st.sampled_from([-(2**63), 2**63 - 1, 2**64 - 1, 2**64, -(2**63) - 1])
# fresh string objects, as a caller's are: msgspec omits a default-valued field only when it is
# the default object itself (a str equal to "kai-scheduler" but not it is written)
_text = st.sampled_from(["", "a", "kai-scheduler", "Pending", "ns/x", "ü"]).map(lambda s: (s + ".")[:-1])
_strs = st.lists(_text, max_size=3).map(tuple)
_req = st.builds(p.NodeSelectorRequirement, key=_text, operator=st.sampled_from(["In", "Exists"]), values=_strs)
_term = st.builds(p.NodeSelectorTerm, match_expressions=st.lists(_req, max_size=2).map(tuple))
_affinity = st.builds(p.PodAffinityTerm, topology_key=st.just("zone"), namespaces=_strs)
_weighted = st.builds(p.WeightedPodAffinityTerm, weight=st.integers(1, 100), term=_affinity)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "scheduler_name": _text, "phase": st.sampled_from(["Pending", "Running", "Succeeded"]), "node_name": _text,
    "terminating": st.booleans(), "queue": _text, "implicit_podgroup": st.booleans(), "priority_class": _text,
    "priority": st.none() | _big, "preemptibility": st.sampled_from(["", "preemptible", "non-preemptible"]),
    "requests": st.builds(p.PodResources, milli_cpu=_big, memory_bytes=_big) | st.just(p.PodResources()),
    "gpu": st.builds(p.GpuRequest, whole=_big, fraction_milli=_big, gpu_memory_mib=_big, fraction_devices=_big),
    "gpu_group": _text, "gpu_devices": st.lists(_big, max_size=3).map(tuple),
    "node_selector": st.dictionaries(_text, _text, max_size=2), "affinity_terms": st.lists(_term, max_size=2).map(tuple),
    "tolerations": st.lists(st.builds(p.Toleration, key=_text), max_size=2).map(tuple), "subgroup": _text,
    "node_pool": _text, "task_priority": _big, "owner": st.none() | st.builds(p.OwnerRef, kind=_text, name=_text),
    "created_ns": _big, "labels": st.dictionaries(_text, _text, max_size=3),
    "preferred_affinity": st.lists(st.builds(p.PreferredSchedulingTerm, weight=st.integers(1, 100), term=_term),
                                   max_size=1).map(tuple),
    "pod_affinity": st.lists(_affinity, max_size=2).map(tuple),
    "pod_anti_affinity": st.lists(_affinity, max_size=2).map(tuple),
    "preferred_pod_affinity": st.lists(_weighted, max_size=1).map(tuple),
    "preferred_pod_anti_affinity": st.lists(_weighted, max_size=1).map(tuple),
    "host_ports": st.lists(st.builds(p.HostPort, port=st.integers(1, 65535)), max_size=2).map(tuple),
    "scalar_requests": st.dictionaries(_text, _big, max_size=2), "claims": _strs, "config_maps": _strs,
    "started_ns": _big, "preemption_delay_ns": st.none() | _big, "staleness_grace_ns": st.none() | _big,
    "deletion_ns": _big, "scheduling_gates": _strs,
}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """The keyword arguments of a PodObserved: the required ones and a random subset of the rest."""
    chosen = draw(st.lists(st.sampled_from(sorted(_FIELDS)), unique=True, max_size=len(_FIELDS)))
    kwargs = {"namespace": draw(_text), "name": draw(_text), "uid": draw(_text), "podgroup": draw(_text)}
    kwargs.update({name: draw(_FIELDS[name]) for name in chosen})
    return kwargs


def _old_built(kwargs: dict[str, Any]) -> OldPodObserved:
    """The old class built with the same arguments: its own request objects and lists, as its
    callers made them (an empty list is its default, as an empty tuple is the new class's)."""
    old = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    if "requests" in old:
        old["requests"] = OldResources(**msgspec.structs.asdict(old["requests"]))
    if "gpu" in old:
        old["gpu"] = OldGpu(**msgspec.structs.asdict(old["gpu"]))
    return OldPodObserved(**old)


@given(specs())
def test_a_spec_built_directly_hashes_as_the_old_class_did(kwargs: dict[str, Any]) -> None:
    spec = p.PodObserved(**kwargs)
    assert _ENCODE(legacy_spec(spec)) == _ENCODE(_old_built(kwargs))


@given(specs())
def test_a_decoded_spec_hashes_as_the_old_class_decoded_from_the_same_bytes_did(kwargs: dict[str, Any]) -> None:
    """A fold's specs come from canonical bytes: missing fields are the class's own default
    objects, which msgspec omits (a struct-valued one only when it is that very object)."""
    body = encode_payload(p.PodObserved(**kwargs))
    new = msgspec.json.decode(body, type=p.PodObserved)
    old = msgspec.json.decode(body, type=OldPodObserved)
    assert _ENCODE(legacy_spec(new)) == _ENCODE(old)


def test_the_current_class_is_in_name_order_and_hashes_otherwise() -> None:
    """What v16 hashes differs from the old form as soon as two fields are set out of the old
    order (so a v16 digest is not a v15 one), and the class decodes its keys in order."""
    for cls in (p.PodObserved, p.PodResources, p.GpuRequest):
        assert list(cls.__struct_fields__) == sorted(cls.__struct_fields__), cls
    spec = p.PodObserved(namespace="ns", name="a", uid="u", podgroup="g")
    assert _ENCODE(spec) != _ENCODE(legacy_spec(spec))
    assert msgspec.structs.asdict(msgspec.msgpack.decode(_ENCODE(legacy_spec(spec)), type=p.PodObserved)) == \
        msgspec.structs.asdict(spec)
