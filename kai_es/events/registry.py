"""The event type names (CloudEvents `type`) and the payload class of each, with its version.

Contract: a type name never changes meaning. A new payload shape is a new schema version of that
type (`SCHEMA_VERSIONS`) with an upcaster in `kai_es.events.upcast`; the published schema file of
the old version stays as it is. Versions are per type: a type never changed is still at 1.
"""

from __future__ import annotations

from typing import Final, cast

import msgspec

from kai_es.events import payloads as p
from kai_es.events.envelope import Envelope

#: the version of types not listed in SCHEMA_VERSIONS (kept for readers of version-1 logs)
CURRENT_SCHEMA_VERSION: Final = 1

EVENT_TYPES: Final[dict[str, type[p.Payload]]] = {
    "kai.cluster.node.observed": p.NodeObserved,
    "kai.cluster.node.removed": p.NodeRemoved,
    "kai.cluster.pod.observed": p.PodObserved,
    "kai.cluster.pod.removed": p.PodRemoved,
    "kai.cluster.queue.observed": p.QueueObserved,
    "kai.cluster.queue.removed": p.QueueRemoved,
    "kai.cluster.podgroup.observed": p.PodGroupObserved,
    "kai.cluster.podgroup.removed": p.PodGroupRemoved,
    "kai.cluster.topology.observed": p.TopologyObserved,
    "kai.cluster.topology.removed": p.TopologyRemoved,
    "kai.cluster.priorityclass.observed": p.PriorityClassObserved,
    "kai.cluster.priorityclass.removed": p.PriorityClassRemoved,
    "kai.cluster.resync.started": p.ResyncStarted,
    "kai.cluster.resync.completed": p.ResyncCompleted,
    "kai.cluster.object.rejected": p.ObjectRejected,
    "kai.scheduler.config.applied": p.ConfigApplied,
    "kai.scheduler.cycle.started": p.CycleStarted,
    "kai.scheduler.cycle.completed": p.CycleCompleted,
    "kai.scheduler.pod.bindingdecided": p.BindingDecided,
    "kai.scheduler.pod.pipelined": p.PodPipelined,
    "kai.scheduler.pod.evictiondecided": p.EvictionDecided,
    "kai.scheduler.pod.unschedulable": p.PodUnschedulable,
    "kai.binder.pod.bound": p.PodBound,
    "kai.binder.pod.bindfailed": p.PodBindFailed,
    "kai.binder.pod.evicted": p.PodEvicted,
    "kai.binder.pod.evictionfailed": p.PodEvictionFailed,
    "kai.cluster.namespace.observed": p.NamespaceObserved,
    "kai.cluster.namespace.removed": p.NamespaceRemoved,
    "kai.cluster.claim.observed": p.ClaimObserved,
    "kai.cluster.claim.removed": p.ClaimRemoved,
    "kai.cluster.volume.observed": p.VolumeObserved,
    "kai.cluster.volume.removed": p.VolumeRemoved,
    "kai.cluster.configmap.observed": p.ConfigMapObserved,
    "kai.cluster.configmap.removed": p.ConfigMapRemoved,
}

#: type name -> its current schema version (every other type: CURRENT_SCHEMA_VERSION)
SCHEMA_VERSIONS: Final[dict[str, int]] = {
    name: 1 for name in EVENT_TYPES} | {
    # v2 adds optional fields only (pod labels, affinities, ports, scalar resources, volumes;
    # node scalar resources; resync of the new kinds): a v1 payload decodes as v2 unchanged.
    # v3 adds started_ns, preemption_delay_ns, staleness_grace_ns; v4 deletion_ns; v5
    # scheduling_gates (`written_version`)
    "kai.cluster.pod.observed": 5,
    "kai.cluster.node.observed": 2,
    "kai.cluster.resync.started": 2,
    "kai.cluster.resync.completed": 2,
    # v2 adds the top-level min_subgroup, v3 preemption_delay_ns, v4 the sub-groups' topology
    # constraints, v5 the handover times (stale and last-eviction timestamps; `written_version`)
    "kai.cluster.podgroup.observed": 5,
    "kai.cluster.queue.observed": 2,  # v2: the min-runtimes may be None (unset, inherited)
    # v2 adds preemptor and numbers, v3 to_node (a move as one decision; `written_version`)
    "kai.scheduler.pod.evictiondecided": 3,
    "kai.binder.pod.bindfailed": 2,  # v2 adds final
    # v2 adds stuck_releasing, v3 tried_order (`written_version`)
    "kai.scheduler.cycle.completed": 3,
}

#: type name -> the older versions whose payloads decode directly as the current version (the
#: newer version only added optional fields); other older versions go through an upcaster
ADDITIVE_VERSIONS: Final[dict[str, frozenset[int]]] = {
    "kai.cluster.pod.observed": frozenset({1, 2, 3, 4}),
    "kai.cluster.node.observed": frozenset({1}),
    "kai.cluster.resync.started": frozenset({1}),
    "kai.cluster.resync.completed": frozenset({1}),
    "kai.cluster.podgroup.observed": frozenset({1, 2, 3, 4}),
    "kai.cluster.queue.observed": frozenset({1}),
    "kai.scheduler.pod.evictiondecided": frozenset({1, 2}),
    "kai.binder.pod.bindfailed": frozenset({1}),
    "kai.scheduler.cycle.completed": frozenset({1, 2}),
}

TYPE_OF: Final[dict[type[p.Payload], str]] = {cls: name for name, cls in EVENT_TYPES.items()}


def _envelope_class(name: str, payload: type[p.Payload]) -> type[Envelope]:
    cls = msgspec.defstruct(f"{payload.__name__}Envelope", [("data", payload)], bases=(Envelope,),
                            tag=name, kw_only=True, frozen=True, omit_defaults=True, gc=False,
                            forbid_unknown_fields=True, module=__name__)
    return cast("type[Envelope]", cls)


#: event type name -> its envelope class (an Envelope subclass tagged with the name)
ENVELOPE_CLASSES: Final[dict[str, type[Envelope]]] = {
    name: _envelope_class(name, cls) for name, cls in EVENT_TYPES.items()}
#: payload class -> envelope class
ENVELOPE_OF: Final[dict[type[p.Payload], type[Envelope]]] = {
    EVENT_TYPES[name]: env for name, env in ENVELOPE_CLASSES.items()}

#: envelope class -> the schema versions it decodes directly (current + additive older ones)
DIRECT_VERSIONS: Final[dict[type[Envelope], frozenset[int]]] = {
    ENVELOPE_CLASSES[name]: frozenset({SCHEMA_VERSIONS[name]}) | ADDITIVE_VERSIONS.get(name, frozenset())
    for name in EVENT_TYPES}
#: payload class -> its current schema version
PAYLOAD_VERSION: Final[dict[type[p.Payload], int]] = {
    cls: SCHEMA_VERSIONS[name] for name, cls in EVENT_TYPES.items()}



#: payload class -> the steps of its schema versions that only added optional fields, newest
#: first: (the fields that version added, the version before). A payload that leaves a step's
#: fields unset is written as the version before it, and so on down (`written_version`)
ADDED_FIELDS: Final[dict[type[p.Payload], tuple[tuple[tuple[str, ...], int], ...]]] = {
    p.EvictionDecided: ((("to_node",), 2),),
    p.PodGroupObserved: ((("stale_timestamp_ns", "last_eviction_timestamp_ns"), 4),),
    p.PodObserved: ((("scheduling_gates",), 4), (("deletion_ns",), 3)),
    p.CycleCompleted: ((("tried_order",), 2), (("stuck_releasing",), 1)),
}
#: payload class -> its fields' defaults (a field "left unset" holds its default)
_DEFAULTS: Final[dict[type[p.Payload], dict[str, object]]] = {
    kind: {f.name: f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
           for f in msgspec.structs.fields(kind) if not f.required}
    for kind in ADDED_FIELDS}


def written_version(payload: p.Payload) -> int:
    """The schema version an event carrying `payload` is written as: its type's current one,
    but where that version only added optional fields (`ADDED_FIELDS`) and the payload leaves
    them unset, the version before — and so on down — its bytes are those older versions wrote,
    so their logs replay and a reader of the older schema reads everything in it (an
    EvictionDecided that is no move is version 2, a PodGroupObserved without handover times
    version 4, a CycleCompleted with neither a tried order nor pods stuck releasing version 1)."""
    kind = type(payload)
    steps = ADDED_FIELDS.get(kind)
    if steps is None:
        return PAYLOAD_VERSION[kind]
    defaults = _DEFAULTS[kind]
    version = PAYLOAD_VERSION[kind]
    for names, before in steps:
        for name in names:  # (a loop, not all() over a generator: every observed pod comes here)
            if getattr(payload, name) != defaults[name]:
                return version
        version = before
    return version


#: Types the scheduler writes as the outcome of a cycle (compared byte for byte by replay).
DECISION_TYPES: Final = frozenset(
    {
        "kai.scheduler.pod.bindingdecided",
        "kai.scheduler.pod.pipelined",
        "kai.scheduler.pod.evictiondecided",
        "kai.scheduler.pod.unschedulable",
        "kai.scheduler.cycle.completed",
    }
)


def type_name(payload: p.Payload) -> str:
    """The CloudEvents type of a payload instance."""
    return TYPE_OF[type(payload)]
