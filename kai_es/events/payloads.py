"""Payload types of every event, version 1.

Contract: every quantity is an integer whose unit is in its name (`milli_cpu`, `memory_bytes`,
`milli_gpu`, `gpu_memory_mib`); there are no floats. Field order is irrelevant on the wire because
the codec sorts keys. A payload never carries a log position of its own event: the log assigns it.

msgspec Structs (not dataclasses or pydantic) because one definition gives us the fastest decoder
on PyPI, canonical sorted-key JSON and the JSON Schema in `schemas/`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
#: "semi-preemptible" (KAI's semi-preemptible design): non-preemptible up to the minimum shape
#: (minMember, each leaf sub-group's minMember), preemptible above it; policy kai-es/v8 on
Preemptibility = Literal["", "preemptible", "non-preemptible", "semi-preemptible"]


class Payload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True,
              gc=False):
    """Base of all payloads: immutable, keyword-only, unknown fields rejected."""


# --- shared value types ---------------------------------------------------------------------


class Taint(Payload, kw_only=True, frozen=True):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Toleration(Payload, kw_only=True, frozen=True):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""


class NodeSelectorRequirement(Payload, kw_only=True, frozen=True):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[str, ...] = ()


class NodeSelectorTerm(Payload, kw_only=True, frozen=True):
    """All requirements of a term must hold; a pod's terms are ORed. `match_fields` test node
    fields (Kubernetes supports only `metadata.name`); `match_expressions` test node labels. A
    term with neither matches no node (as in Kubernetes)."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


class PreferredSchedulingTerm(Payload, kw_only=True, frozen=True):
    """A preferred node-affinity term: nodes matching `term` score `weight` (1..100)."""

    weight: int
    term: NodeSelectorTerm


class LabelSelectorRequirement(Payload, kw_only=True, frozen=True):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class LabelSelector(Payload, kw_only=True, frozen=True):
    """A Kubernetes label selector: every `match_labels` pair and every expression must hold.
    An empty selector matches everything."""

    match_labels: dict[str, str] = {}
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


class PodAffinityTerm(Payload, kw_only=True, frozen=True):
    """Pods matching `selector` (None: no pod) in the namespaces `namespaces` ∪ those matching
    `namespace_selector` (both empty/None: the pod's own namespace; an empty selector: every
    namespace), counted per domain of the node label `topology_key`."""

    selector: LabelSelector | None = None
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None
    topology_key: str


class WeightedPodAffinityTerm(Payload, kw_only=True, frozen=True):
    weight: int
    term: PodAffinityTerm


class HostPort(Payload, kw_only=True, frozen=True):
    """A container port bound on the node. `host_ip` "" means every address (0.0.0.0)."""

    port: int
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    host_ip: str = ""


class OwnerRef(Payload, kw_only=True, frozen=True):
    kind: str
    name: str
    uid: str


class PodResources(Payload, kw_only=True, frozen=True):
    # (fields in name order, as `PodObserved`'s)
    memory_bytes: int = 0
    milli_cpu: int = 0


class GpuRequest(Payload, kw_only=True, frozen=True):
    """What a pod asks of GPUs. `whole` devices, or a share of `fraction_devices` devices given
    as `fraction_milli` (1..999) or as `gpu_memory_mib`. All zero: a CPU-only pod."""

    # (fields in name order, as `PodObserved`'s)
    fraction_devices: int = 1
    fraction_milli: int = 0
    gpu_memory_mib: int = 0
    whole: int = 0


class QueueResource(Payload, kw_only=True, frozen=True):
    """One resource of a queue: quota (-1 unlimited), over-quota weight, limit (-1 none)."""

    quota: int = 0
    over_quota_weight: int = 1
    limit: int = -1


class SubGroup(Payload, kw_only=True, frozen=True):
    """A level of a gang: a leaf sub-group needs `min_member` of its pods (label
    `kai.scheduler/subgroup-name`); an inner one needs `min_subgroup` of its children (all when
    unset). Its topology constraint, when set, applies to its pods and its descendants' pods."""

    name: str
    min_member: int = 1
    parent: str = ""
    min_subgroup: int | None = None
    # --- PodGroup schema version 4: the sub-group's own `topologyConstraint` (its pods, those
    # of its descendants included, share one domain of the required level)
    topology: str = ""
    required_topology_level: str = ""
    preferred_topology_level: str = ""


class Reason(Payload, kw_only=True, frozen=True):
    """One structured reason a pod could not be placed. `numbers` holds the quantities that make
    the reason checkable (requested, allocated, limit, nodes, ...), integers only."""

    code: str
    message: str
    numbers: dict[str, int] = {}


# --- cluster: observed and removed objects -------------------------------------------------


class NodeObserved(Payload, kw_only=True, frozen=True):
    name: str
    uid: str = ""
    labels: dict[str, str] = {}
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    milli_cpu: int
    memory_bytes: int
    gpus: int = 0
    max_pods: int = 110
    gpu_memory_mib: int = 0
    gpu_model: str = ""
    #: allocatable of every other resource (extended resources, ephemeral-storage, hugepages-*),
    #: in the resource's base unit (bytes, or units for extended resources)
    scalar_resources: dict[str, int] = {}


class NodeRemoved(Payload, kw_only=True, frozen=True):
    name: str


class PodObserved(Payload, kw_only=True, frozen=True):
    # A pod as the informer saw it. (A comment, not a docstring: the published schemas carry
    # docstrings.) Fields are declared in name order, the order of their keys in canonical
    # bytes: msgspec matches each key to a field by scanning on from the last one matched, so
    # this order finds each at once (decoding costs about 5% less of a fold than in the order
    # they were added in, which digests of policies before kai-es/v16 still hash:
    # `kai_es.state.legacy_spec_form`). Schema versions: 2 added `labels`, the pod affinities,
    # `preferred_affinity`, `host_ports`, `scalar_requests`, `claims` and `config_maps`; 3
    # `started_ns`, `preemption_delay_ns` and `staleness_grace_ns`; 4 `deletion_ns`; 5
    # `scheduling_gates`. Each is optional: an older payload is a valid newer one.
    affinity_terms: tuple[NodeSelectorTerm, ...] = ()
    #: PersistentVolumeClaims the pod mounts, and ConfigMaps it needs (non-optional volumes)
    claims: tuple[str, ...] = ()
    config_maps: tuple[str, ...] = ()
    created_ns: int = 0
    #: `metadata.deletionTimestamp` (0: none; `terminating` says whether there is one), when a
    #: Running pod being deleted counts as stuck releasing (KAI's StuckInReleasing, kai-es/v7 on)
    deletion_ns: int = 0
    gpu: GpuRequest = GpuRequest()
    gpu_devices: tuple[int, ...] = ()
    gpu_group: str = ""
    host_ports: tuple[HostPort, ...] = ()
    implicit_podgroup: bool = False
    labels: dict[str, str] = {}
    name: str
    namespace: str
    node_name: str = ""
    node_pool: str = ""
    node_selector: dict[str, str] = {}
    owner: OwnerRef | None = None
    phase: Phase = "Pending"
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    podgroup: str
    preemptibility: Preemptibility = ""
    #: KAI's annotations `kai.scheduler/preemption-delay` and
    #: `kai.scheduler/staleness-grace-period` (None: unset), which a job without a PodGroup
    #: object takes from its pods
    preemption_delay_ns: int | None = None
    preferred_affinity: tuple[PreferredSchedulingTerm, ...] = ()
    preferred_pod_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    preferred_pod_anti_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    priority: int | None = None
    priority_class: str = ""
    queue: str = ""
    requests: PodResources = PodResources()
    #: requests of every resource but cpu, memory and nvidia.com/gpu (base units)
    scalar_requests: dict[str, int] = {}
    scheduler_name: str = "kai-scheduler"
    #: the names of `spec.schedulingGates`, in order (empty: no gate). A gated pod waits for its
    #: gates to be removed: from policy kai-es/v14 on it is not pending for kai-es, and counts as
    #: existing but not ready in its gang (KAI's Gated status)
    scheduling_gates: tuple[str, ...] = ()
    staleness_grace_ns: int | None = None
    #: `status.startTime` (0: unknown)
    started_ns: int = 0
    subgroup: str = ""
    task_priority: int = 0
    terminating: bool = False
    tolerations: tuple[Toleration, ...] = ()
    uid: str


class PodRemoved(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str = ""


class QueueObserved(Payload, kw_only=True, frozen=True):
    name: str
    uid: str = ""
    parent: str = ""
    priority: int = 100
    gpu: QueueResource = QueueResource()
    cpu: QueueResource = QueueResource()
    memory: QueueResource = QueueResource()
    #: None: unset, inherited from the parent queue (then the scheduler's default); schema
    #: version 2 allows None (version 1 wrote 0 for unset, which decodes unchanged)
    preempt_min_runtime_ns: int | None = None
    reclaim_min_runtime_ns: int | None = None
    created_ns: int = 0


class QueueRemoved(Payload, kw_only=True, frozen=True):
    name: str


class PodGroupObserved(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str = ""
    queue: str = ""
    min_member: int = 1
    priority_class: str = ""
    preemptibility: Preemptibility = ""
    subgroups: tuple[SubGroup, ...] = ()
    topology: str = ""
    required_topology_level: str = ""
    preferred_topology_level: str = ""
    staleness_grace_ns: int | None = None
    created_ns: int = 0
    # --- schema version 2: top-level minSubGroup (direct child sub-groups required; None: all)
    min_subgroup: int | None = None
    # --- schema version 3: `spec.preemptionDelay` (or annotation `kai.scheduler/preemption-delay`)
    preemption_delay_ns: int | None = None
    # --- schema version 4: the times KAI (and kai-es from kai-es/v7) keep on the PodGroup, so a
    # gang handed over between schedulers keeps its clocks: annotations
    # `kai.scheduler/stale-podgroup-timestamp` (since when the gang has been stale) and
    # `kai.scheduler/last-eviction-timestamp` (its last eviction: preemption delay's anchor).
    # None: absent or not an RFC 3339 time (KAI ignores such a value too)
    stale_timestamp_ns: int | None = None
    last_eviction_timestamp_ns: int | None = None


class PodGroupRemoved(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str


class TopologyObserved(Payload, kw_only=True, frozen=True):
    name: str
    levels: tuple[str, ...] = ()


class TopologyRemoved(Payload, kw_only=True, frozen=True):
    name: str


class PriorityClassObserved(Payload, kw_only=True, frozen=True):
    name: str
    value: int
    preemption_policy: str = "PreemptLowerPriority"


class PriorityClassRemoved(Payload, kw_only=True, frozen=True):
    name: str


class NamespaceObserved(Payload, kw_only=True, frozen=True):
    name: str
    labels: dict[str, str] = {}


class NamespaceRemoved(Payload, kw_only=True, frozen=True):
    name: str


class ClaimObserved(Payload, kw_only=True, frozen=True):
    """A PersistentVolumeClaim. `volume` is the bound PersistentVolume ("" while unbound)."""

    namespace: str
    name: str
    uid: str = ""
    phase: Literal["Pending", "Bound", "Lost"] = "Pending"
    volume: str = ""


class ClaimRemoved(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str


class VolumeObserved(Payload, kw_only=True, frozen=True):
    """A PersistentVolume; `node_affinity` (required terms, ORed) restricts where pods using
    it may run (local volumes)."""

    name: str
    node_affinity: tuple[NodeSelectorTerm, ...] = ()


class VolumeRemoved(Payload, kw_only=True, frozen=True):
    name: str


class ConfigMapObserved(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str


class ConfigMapRemoved(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str


ResyncKind = Literal["Node", "Pod", "Queue", "PodGroup", "Topology", "PriorityClass", "Namespace",
                     "PersistentVolumeClaim", "PersistentVolume", "ConfigMap"]


class ResyncStarted(Payload, kw_only=True, frozen=True):
    """A relist of `kind` begins: objects of that kind not observed before the matching
    ResyncCompleted are removed from state when it arrives."""

    kind: ResyncKind


class ResyncCompleted(Payload, kw_only=True, frozen=True):
    kind: ResyncKind


class ObjectRejected(Payload, kw_only=True, frozen=True):
    """An object the informer or loader could not translate: kept in the log, never dropped."""

    kind: str
    namespace: str = ""
    name: str = ""
    path: str = ""
    reason: str


# --- scheduler ------------------------------------------------------------------------------


class ConfigApplied(Payload, kw_only=True, frozen=True):
    """The scheduler configuration in force from this position on (canonical JSON object)."""

    config_digest: str
    config: dict[str, Any]


class CycleStarted(Payload, kw_only=True, frozen=True):
    cycle: int
    config_digest: str


class TriedOrder(Payload, kw_only=True, frozen=True):
    """The order in which a cycle's allocate tried the waiting jobs (job keys, each at its first
    try), as an edit of the order the state held at the cycle's cut (`ClusterState.tried_order`,
    the order of cycle `since_cycle`; 0: none): the first `keep_head` and the last `keep_tail`
    jobs of that order are kept, and `jobs` stands between them (policy kai-es/v13 on)."""

    since_cycle: int
    keep_head: int
    keep_tail: int
    jobs: tuple[str, ...] = ()


class CycleCompleted(Payload, kw_only=True, frozen=True):
    cycle: int
    decisions: int
    bound: int = 0
    pipelined: int = 0
    evicted: int = 0
    unschedulable: int = 0
    # --- schema version 2 (optional): the Running pods being deleted for longer than the
    # config's `stuckInReleasingThreshold` at the cycle's time (pod keys, sorted): KAI's
    # StuckInReleasing, whose capacity nothing was pipelined onto (policy kai-es/v7 on)
    stuck_releasing: tuple[str, ...] = ()
    # --- schema version 3 (optional): the order allocate tried the waiting jobs in, as an edit
    # of the order of the last cycle (`TriedOrder`); None when it is that order unchanged
    # (policy kai-es/v13 on: the positions `explain`, `serve` and the PodGroup condition show)
    tried_order: TriedOrder | None = None


class BindingDecided(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    node: str
    podgroup: str
    queue: str
    gpu_devices: tuple[int, ...] = ()
    gpu_groups: tuple[str, ...] = ()


class PodPipelined(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    node: str
    podgroup: str
    queue: str
    gpu_devices: tuple[int, ...] = ()
    gpu_groups: tuple[str, ...] = ()
    waiting_for: tuple[str, ...] = ()


class EvictionDecided(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    node: str
    podgroup: str
    queue: str
    action: str
    reason: str
    # --- schema version 2: who the pod makes room for, and the numbers that justified it
    preemptor: str = ""
    numbers: dict[str, int] = {}
    # --- schema version 3 (kai-es/v6): a move — the pod leaves `node` for `to_node`, one decision
    # with both nodes (an eviction without it; older versions said a move only in `reason`)
    to_node: str = ""


class PodUnschedulable(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    podgroup: str
    queue: str
    reasons: tuple[Reason, ...]


# --- binder outcomes -------------------------------------------------------------------------


class PodBound(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    node: str
    decision_id: str
    gpu_devices: tuple[int, ...] = ()


class PodBindFailed(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    node: str
    decision_id: str
    message: str
    # --- schema version 2: the binder gave up on this pod (too many consecutive failures); the
    # scheduler does not pick it again until the pod is observed changed or recreated
    final: bool = False


class PodEvicted(Payload, kw_only=True, frozen=True):
    namespace: str
    name: str
    uid: str
    node: str
    decision_id: str


class PodEvictionFailed(Payload, kw_only=True, frozen=True):
    """The cluster refused an eviction (after the binder's retries when `retryable`): the pod
    keeps running and its capacity is not being released."""

    namespace: str
    name: str
    uid: str
    node: str
    decision_id: str
    message: str
    retryable: bool = False
