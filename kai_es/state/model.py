"""The folded state: objects as last observed, scheduling status, and incremental indexes.

Contract:
- Everything here is derived from the log alone. Nothing reads a clock or iterates an unordered
  collection to make a decision: code that needs an order uses the sorted indexes
  (`node_names`, `pending_jobs[queue]`, `Job.pending`), whose keys end in a unique id.
- Quantities are ints: milli-CPU, bytes, milli-GPU per device (1000 = one whole device).
- A pod occupies node and queue capacity while its status is Binding, Running or Releasing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec
from sortedcontainers import SortedList

from kai_es.events.payloads import (
    ClaimObserved,
    GpuRequest,
    NodeObserved,
    PodGroupObserved,
    PodObserved,
    PodResources,
    QueueObserved,
    VolumeObserved,
)
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.state.keys import PendingJob, PendingPod
from kai_es.state.sorted_on_read import SortedOnRead

PodStatus = Literal["Pending", "Binding", "Running", "Releasing"]
OCCUPYING: frozenset[str] = frozenset({"Binding", "Running", "Releasing"})

#: KAI's default priority classes (name -> value) when no PriorityClass object says otherwise.
DEFAULT_PRIORITY_CLASSES: dict[str, int] = {"train": 50, "build": 100, "inference": 125}

#: KAI: a job whose priority is below this is preemptible unless it says otherwise.
NON_PREEMPTIBLE_PRIORITY = 100

#: Bind back-off after the n-th consecutive failure: BASE * 2**(n-1), capped.
BIND_BACKOFF_BASE_NS = 1_000_000_000
BIND_BACKOFF_CAP_NS = 300_000_000_000


@dataclass(slots=True)
class NodeState:
    spec: NodeObserved
    used_milli_cpu: int = 0
    used_memory_bytes: int = 0
    used_pods: int = 0
    releasing_milli_cpu: int = 0
    releasing_memory_bytes: int = 0
    releasing_pods: int = 0
    device_used: list[int] = field(default_factory=list)
    device_releasing: list[int] = field(default_factory=list)
    device_sharers: list[int] = field(default_factory=list)
    group_holders: dict[str, dict[int, int]] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)
    #: scalar resources (extended, ephemeral-storage, hugepages) held by occupying pods
    used_scalar: dict[str, int] = field(default_factory=dict)

    def group_device(self, group: str) -> int | None:
        """The device a shared-GPU group lives on: the lowest device holding it (None if none).
        A function of the holders only, so it never depends on the order pods arrived in."""
        holders = self.group_holders.get(group)
        return min(holders) if holders else None

    def device_group(self, device: int) -> str | None:
        """The first (by name) group held on `device`, if any."""
        for group in sorted(self.group_holders):
            if self.group_device(group) == device:
                return group
        return None

    @property
    def free_milli_cpu(self) -> int:
        return self.spec.milli_cpu - self.used_milli_cpu

    @property
    def free_memory_bytes(self) -> int:
        return self.spec.memory_bytes - self.used_memory_bytes

    @property
    def free_pods(self) -> int:
        return self.spec.max_pods - self.used_pods

    def device_free(self, index: int) -> int:
        return 1000 - self.device_used[index]


@dataclass(slots=True)
class PodState:
    key: str
    spec: PodObserved
    job_key: str
    status: PodStatus = "Pending"
    node: str = ""
    devices: tuple[int, ...] = ()
    gpu_groups: tuple[str, ...] = ()
    device_milli: int = 0
    decision_id: str = ""
    bind_failures: int = 0
    backoff_until_ns: int = 0
    #: the message of the binder's final failed bind (PodBindFailed final=True): while set, the
    #: scheduler does not pick the pod; cleared when the pod is observed changed or recreated
    bind_final_message: str = ""
    #: logical time of the last eviction of this pod the binder reported refused
    #: (PodEvictionFailed); 0: none (kept only when `ClusterState.timed`: kai-es/v3 and later)
    eviction_refused_ns: int = 0
    started_ns: int = 0
    last_unschedulable: str = ""
    pending_key: PendingPod | None = None
    #: the node a PodPipelined decision (policy kai-es/v2 on) reserved for this pending pod:
    #: its capacity is being released for it, and the next cycles place it there first
    nominated_node: str = ""
    #: the queue whose allocation this pod's usage was added to while it occupies ("": none);
    #: its release subtracts from exactly that queue, whatever the pod's or job's queue became
    #: meanwhile (derived: not in snapshots, set again by restore)
    accounted_queue: str = ""

    @property
    def milli_gpu(self) -> int:
        """Total milli-GPU this pod holds while occupying (device share × devices)."""
        return self.device_milli * len(self.devices)


#: how long the room a move made is held for the moved pod's replacement (kai-es/v8)
MOVE_HOLD_NS: Final = 120 * 1_000_000_000


class MoveHold(msgspec.Struct, frozen=True, kw_only=True):
    """Room a consolidation move made on `node` for pod `pod` (its key), held for the pod its
    controller creates in its place (same owner, same requests) until that pod arrives or
    `MOVE_HOLD_NS` after the move was decided (`decided_ns`). Policy kai-es/v8 on."""

    pod: str
    node: str
    requests: PodResources
    gpu: GpuRequest
    scalar_requests: dict[str, int] = {}
    decided_ns: int

    def live(self, now_ns: int) -> bool:
        return now_ns - self.decided_ns <= MOVE_HOLD_NS


@dataclass(slots=True)
class Job:
    """A PodGroup (explicit or implicit) and its members."""

    key: str
    namespace: str
    name: str
    spec: PodGroupObserved | None
    implicit: bool
    queue: str = ""
    priority: int = 0
    created_ns: int = 0
    uid: str = ""
    members: set[str] = field(default_factory=set)
    #: pending pods (`PendingPod`: -task priority, created, uid, pod key), kept sorted with bisect: a
    #: plain list is far cheaper than a SortedList for the handful of pods a job usually has
    pending: list[PendingPod] = field(default_factory=list)
    occupying: int = 0
    preemptible: bool = True
    #: the job says `semi-preemptible` (then `preemptible` too): under policy kai-es/v8 its
    #: minimum shape is kept as non-preemptible (`kai_es.scheduling.rules.semi_preemptible`).
    #: Derived from the spec and the first member by `refresh_job`; never snapshotted
    semi: bool = False
    index_key: PendingJob | None = None
    #: kept only under a config whose policy version times jobs (`ClusterState.timed`, kai-es/v3
    #: on): when a pod of the job was last decided evicted (preemption delay's anchor); since
    #: when it has been a running gang below its minimum (0: it is not; stale gang eviction);
    #: how many of its pods succeeded (a gang with a succeeded pod is finishing, never stale)
    last_evicted_ns: int = 0
    stale_since_ns: int = 0
    succeeded: int = 0
    #: kai-es/v8 on (`rules.search_backoff`): the job's consecutive failed victim searches and
    #: the time before which none is tried again (0, 0: none failed since it last had a pod placed)
    search_failures: int = 0
    search_retry_ns: int = 0
    #: sub-group label (`PodObserved.subgroup`, non-empty) -> how many of the job's pods with it
    #: occupy (a name is deleted when its count drops to 0). Kept by the reducer wherever
    #: `occupying` changes or an occupying pod's label does; derived: rebuilt by `restore`,
    #: never snapshotted
    subgroup_occupying: dict[str, int] = field(default_factory=dict)

    @property
    def min_member(self) -> int:
        return self.spec.min_member if self.spec is not None else 1

    def leaves_below_minimum(self) -> list[tuple[str, int, int]]:
        """(name, occupying pods, min_member) of each leaf sub-group of the PodGroup (one that is
        no other's parent) with fewer occupying pods than its `min_member`, in spec order
        (empty without sub-groups). KAI's unsatisfied pod-sets."""
        groups = self.spec.subgroups if self.spec is not None else []
        if not groups:
            return []
        parents = {sg.parent for sg in groups}
        counts = self.subgroup_occupying
        return [(sg.name, counts.get(sg.name, 0), sg.min_member) for sg in groups
                if sg.name not in parents and counts.get(sg.name, 0) < sg.min_member]


@dataclass(slots=True)
class QueueState:
    spec: QueueObserved
    allocated_milli_cpu: int = 0
    allocated_memory_bytes: int = 0
    allocated_milli_gpu: int = 0
    #: the part of the allocation held by non-preemptible jobs (must stay within quota)
    nonpreemptible_milli_cpu: int = 0
    nonpreemptible_memory_bytes: int = 0
    nonpreemptible_milli_gpu: int = 0
    #: time-based fair share (kept only while `ClusterState.usage_resolution_ns` > 0): bucket
    #: index (time // resolution) -> [milli-GPU·ns, milli-CPU·ns, byte·ns] this queue's own
    #: pods held during that bucket, accrued up to `usage_since_ns`
    usage: dict[int, list[int]] = field(default_factory=dict)
    usage_since_ns: int = 0


@dataclass(slots=True)
class EntityHashes:
    """The incremental digest's memory: per kind, each entity's hash as last computed, and their
    sum mod 2**256. `complete=False` means the hashes cannot be trusted (a state built other than
    by the reducer, e.g. restored from a snapshot): the next digest recomputes them all."""

    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    total: int = 0
    complete: bool = True


@dataclass(slots=True)
class ClusterState:
    """The whole folded state. Mutated in place by `kai_es.state.reducer.apply` only."""

    position: int = -1
    logicaltime: int = 0
    records: int = 0
    cycle: int = 0
    completed_cycle: int = 0
    config_digest: str = ""
    config: dict[str, object] = field(default_factory=dict)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    node_names: SortedList = field(default_factory=SortedList)
    pods: dict[str, PodState] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    queues: dict[str, QueueState] = field(default_factory=dict)
    pending_jobs: dict[str, SortedOnRead] = field(default_factory=dict)
    priority_classes: dict[str, int] = field(default_factory=dict)
    topologies: dict[str, list[str]] = field(default_factory=dict)
    resync_seen: dict[str, set[str]] = field(default_factory=dict)
    rejected_objects: int = 0
    ignored_events: int = 0
    #: namespace -> its labels (namespace selectors of pod affinity terms)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    #: "namespace/name" -> PersistentVolumeClaim; PersistentVolume by name; "namespace/name" of
    #: every ConfigMap (volume predicates)
    claims: dict[str, ClaimObserved] = field(default_factory=dict)
    volumes: dict[str, VolumeObserved] = field(default_factory=dict)
    config_maps: set[str] = field(default_factory=set)
    #: derived index of every pod's labels: label key -> value -> pod keys (inter-pod affinity
    #: finds the pods a selector matches here instead of scanning every pod); and the keys of
    #: pods that carry inter-pod affinity terms. Rebuilt by `restore`, never snapshotted.
    pods_by_label: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    affinity_pods: set[str] = field(default_factory=set)
    #: the jobs that may be victims of reclaim, preempt or consolidation: preemptible jobs with
    #: at least one occupying pod, by queue (`Job.queue`, non-empty) and job priority (a bucket
    #: is deleted when it empties). Kept by the reducer wherever `Job.occupying`, `queue`,
    #: `preemptible` or `priority` changes; rebuilt by `restore`, never snapshotted.
    victim_jobs: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    #: the jobs with `stale_since_ns` set (KAI's stale gangs, timed states only), so the stale
    #: gang rules look at those and not at every job. Kept by `track_stale` and job removal;
    #: rebuilt by `restore`, never snapshotted.
    gangs_below_minimum: set[str] = field(default_factory=set)
    #: the keys of the jobs that say `semi-preemptible` (`Job.semi`), so a cycle finds them
    #: without scanning every job. Kept by `refresh_job` and job removal; rebuilt by `restore`,
    #: never snapshotted.
    semi_jobs: set[str] = field(default_factory=set)
    #: the keys of the pods with a nominated node (`PodState.nominated_node`), so a cycle finds
    #: the jobs allocate tries first without scanning every pending pod. Kept where the field
    #: is set or cleared and by pod removal; rebuilt by `restore`, never snapshotted.
    nominated: set[str] = field(default_factory=set)
    #: room held for moved pods' replacements: owner key ("<namespace>/<kind>/<name>" of the
    #: moved pod's owner) -> the holds for its pods, in decision order (`MoveHold`; kai-es/v8)
    move_holds: dict[str, list[MoveHold]] = field(default_factory=dict)
    #: the order the last completed cycle's allocate tried the waiting jobs in (job keys, each
    #: at its first try; kai-es/v13 on, `CycleCompleted.tried_order`), and that cycle's number
    #: (0: no cycle of a version that keeps it, and then the order is empty)
    tried_order: list[str] = field(default_factory=list)
    tried_order_cycle: int = 0
    #: change tracking for caches derived from node usage (not part of the snapshot or digest):
    #: nodes whose usage changed since a cache last looked (or where a job with pods there
    #: changed its victim order or preemptibility), and a counter bumped whenever the set of
    #: nodes or a node's spec changes.
    dirty_nodes: set[str] = field(default_factory=set)
    node_set_version: int = 0
    #: pods whose worth as a victim may have changed under the same key: the occupying pods of a
    #: job that changed its victim order or preemptibility, a pod moved to another job, a pod
    #: first seen running (caches that follow which pods a node holds look at those pods again
    #: where they run, and clear it: `scheduling.actions.consolidation_bounds`; a pod removed
    #: takes its mark along, so at most the pods of the state, with no search ever asking)
    victim_order_changed: set[str] = field(default_factory=set)
    caches: dict[str, object] = field(default_factory=dict)
    #: the incremental state digest's bookkeeping (not part of the snapshot or digest; see
    #: `kai_es.state.incremental_digest`). The stale sets hold, by kind, the keys of entities
    #: the reducer changed — created, changed or removed — since the digest was last computed:
    #: every change to what an entity's canonical form (`kai_es.state.snapshot`) covers adds its
    #: key (adding an unchanged one is harmless; a missing one makes the digest wrong, which
    #: `incremental_digest.recomputed_digest` exposes). Plain fields, not a sub-object: the
    #: reducer marks ~4 per event and one attribute lookup less is measurable in the fold.
    stale_nodes: set[str] = field(default_factory=set)
    stale_pods: set[str] = field(default_factory=set)
    stale_jobs: set[str] = field(default_factory=set)
    stale_queues: set[str] = field(default_factory=set)
    #: queues whose pending-jobs index (`pending_jobs`) changed
    stale_pending: set[str] = field(default_factory=set)
    stale_priority_classes: set[str] = field(default_factory=set)
    stale_topologies: set[str] = field(default_factory=set)
    #: kinds whose resync seen-set (`resync_seen`) changed
    stale_resync: set[str] = field(default_factory=set)
    stale_namespaces: set[str] = field(default_factory=set)
    stale_claims: set[str] = field(default_factory=set)
    stale_volumes: set[str] = field(default_factory=set)
    stale_config_maps: set[str] = field(default_factory=set)
    stale_move_holds: set[str] = field(default_factory=set)
    hashes: EntityHashes = field(default_factory=EntityHashes)
    #: how many times a queue's allocation changed (`handlers.accounting.queue_usage`, its only
    #: writer) and the queue of the latest change, for observers of the fold
    #: (`kai_es.report`): when the count moved by one since they last looked, only that queue's
    #: allocation can differ. Not part of the snapshot or digest (a restored state starts at 0).
    allocation_changes: int = 0
    allocation_changed: str = ""
    #: derived from `config` (not snapshotted: `restore` derives them again): whether jobs are
    #: timed (their policy version is kai-es/v3 or later), and the time-based fair share's usage
    #: bucket size and window (0: usage not kept)
    timed: bool = False
    #: whether `Job.stale_since_ns` also counts a leaf sub-group below its minimum (timed states
    #: whose policy version is kai-es/v4 or later; `kai_es.state.reducer.track_stale`)
    subgroup_stale: bool = False
    #: whether a PodGroup's stale timestamp anchors its gang's staleness (timed states whose
    #: policy version is kai-es/v7 or later; `kai_es.state.handlers.jobs.track_stale`)
    handover_stamps: bool = False
    #: whether a failed eviction of a moved pod drops its moves' holds (policy kai-es/v11 on;
    #: `kai_es.state.handlers.move_holds.release_holds`)
    releases_failed_moves: bool = False
    #: whether an observation without a node leaves a Running pod Running (a stale read: policy
    #: kai-es/v13 on; `kai_es.state.handlers.pods._reconcile_placement`)
    bindings_hold: bool = False
    #: whether a pod with scheduling gates is kept out of the pending pods (policy kai-es/v14 on;
    #: `kai_es.state.handlers.jobs.set_pending`)
    honours_gates: bool = False
    #: whether a pod whose bind failed stays out of the pending pods while it is terminating
    #: (policy kai-es/v15 on; `kai_es.state.handlers.jobs.set_pending`)
    failed_binds_honour_deletion: bool = False
    #: whether the state digest hashes pod specs with their fields in name order (policy
    #: kai-es/v16 on; `kai_es.state.legacy_spec_form`)
    name_ordered_specs: bool = False
    #: the scheduler name kai-es answers to (the config's `schedulerName`, default KAI's): only
    #: pods of it are pending for kai-es
    scheduler_name: str = SCHEDULER_NAME
    usage_resolution_ns: int = 0
    usage_window_ns: int = 0
    #: the logical time of the record being folded (set by `apply` before its handler), and the
    #: jobs whose occupying count it changed, or (kai-es/v4 on) whose sub-group counts or
    #: minimums it changed, to be judged stale or not on its outcome (timed states; emptied by
    #: `apply` after the handler)
    event_ns: int = 0
    occupancy_changed: set[str] = field(default_factory=set)
    #: the cluster's capacity over time, as queues' `usage` (snapshotted)
    capacity_usage: dict[int, list[int]] = field(default_factory=dict)
    capacity_since_ns: int = 0
