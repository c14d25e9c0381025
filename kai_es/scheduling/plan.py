"""A Plan: tentative placements over scratch copies of cluster capacity, with checkpoint and
rollback (KAI's Statement). Committing a plan means turning its entries into decision events.

Two tables are kept in node-name order: `idle` (free now) and `future` (free once every
Releasing pod is gone). A task that fits idle capacity takes it in both; a task that only fits
future capacity is pipelined and takes it in `future` only.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from kai_es.events.factory import derived_id
from kai_es.events.payloads import PodObserved
from kai_es.scheduling.packing import ArrayPackTable, Packer, Placement, Strategy, TaskShape
from kai_es.state.model import ClusterState, NodeState
from kai_es.state.reducer import device_count


@dataclass(slots=True)
class Entry:
    """One tentative placement."""

    pod_key: str
    node: int
    devices: tuple[int, ...]
    shape: TaskShape
    pipelined: bool
    gpu_groups: tuple[str, ...]


def task_shape(spec: PodObserved) -> TaskShape:
    """The packer's view of a pod's request."""
    gpu = spec.gpu
    cpu, mem = spec.requests.milli_cpu, spec.requests.memory_bytes
    if gpu.whole:
        return TaskShape.whole(gpu.whole, cpu, mem)
    if gpu.fraction_milli:
        return TaskShape.fraction(gpu.fraction_milli, max(1, gpu.fraction_devices), cpu, mem)
    if gpu.gpu_memory_mib:
        return TaskShape.gpu_memory(gpu.gpu_memory_mib, max(1, gpu.fraction_devices), cpu, mem)
    return TaskShape.cpu(cpu, mem)


def build_tables(state: ClusterState) -> tuple[list[str], list[NodeState], ArrayPackTable, ArrayPackTable]:
    """Node names, node states and the idle and future tables, in node-name order."""
    names = list(state.node_names)
    nodes = [state.nodes[n] for n in names]
    gpu_start = [0]
    for n in nodes:
        gpu_start.append(gpu_start[-1] + len(n.device_used))
    dev_total = [n.spec.gpu_memory_mib for n in nodes for _ in n.device_used]
    sharers = [s for n in nodes for s in n.device_sharers]
    shared = [1 if s > 0 else 0 for s in sharers]
    idle = ArrayPackTable(
        free_milli_cpu=[max(0, n.free_milli_cpu) for n in nodes],
        free_memory_bytes=[max(0, n.free_memory_bytes) for n in nodes],
        free_pods=[max(0, n.free_pods) for n in nodes],
        alloc_milli_cpu=[n.spec.milli_cpu for n in nodes],
        gpu_start=gpu_start,
        dev_free_milli=[max(0, 1000 - u) for n in nodes for u in n.device_used],
        dev_total_memory_mib=dev_total, dev_shared=shared, dev_frac_holders=sharers,
    )
    future = ArrayPackTable(
        free_milli_cpu=[max(0, n.free_milli_cpu + n.releasing_milli_cpu) for n in nodes],
        free_memory_bytes=[max(0, n.free_memory_bytes + n.releasing_memory_bytes) for n in nodes],
        free_pods=[max(0, n.free_pods + n.releasing_pods) for n in nodes],
        alloc_milli_cpu=[n.spec.milli_cpu for n in nodes],
        gpu_start=gpu_start,
        dev_free_milli=[min(1000, max(0, 1000 - u + r))
                        for n in nodes for u, r in zip(n.device_used, n.device_releasing)],
        dev_total_memory_mib=dev_total, dev_shared=shared, dev_frac_holders=sharers,
    )
    return names, nodes, idle, future


class Plan:
    """Tentative placements with checkpoint/rollback (see module docstring)."""

    def __init__(self, state: ClusterState, packer: Packer, strategy: Strategy) -> None:
        self.state = state
        self.packer = packer
        self.strategy = strategy
        self.names, self.nodes, self.idle, self.future = build_tables(state)
        self.entries: list[Entry] = []
        self._new_groups: dict[tuple[int, int], str] = {}

    def checkpoint(self) -> int:
        return len(self.entries)

    def rollback(self, checkpoint: int) -> None:
        """Undo every placement made after `checkpoint`, newest first."""
        while len(self.entries) > checkpoint:
            e = self.entries.pop()
            self.future.apply(e.node, e.devices, e.shape, -1)
            if not e.pipelined:
                self.idle.apply(e.node, e.devices, e.shape, -1)

    def place(self, pod_key: str, spec: PodObserved, mask: array[int]) -> tuple[Entry | None, Placement]:
        """Place one task: idle capacity first, else pipelined onto releasing capacity.
        Returns the entry (None when nothing fits) and the idle-capacity placement answer,
        whose rejection counts explain a failure."""
        shape = task_shape(spec)
        now = self.packer.place(self.idle, shape, self.strategy, mask)
        if now.placed:
            entry = self._record(pod_key, spec, shape, now, pipelined=False)
            self.idle.apply(now.node, now.devices, shape, 1)
            self.future.apply(now.node, now.devices, shape, 1)
            return entry, now
        later = self.packer.place(self.future, shape, self.strategy, mask)
        if later.placed:
            entry = self._record(pod_key, spec, shape, later, pipelined=True)
            self.future.apply(later.node, later.devices, shape, 1)
            return entry, now
        return None, now

    def _record(self, pod_key: str, spec: PodObserved, shape: TaskShape, placement: Placement,
                pipelined: bool) -> Entry:
        groups: tuple[str, ...] = ()
        if device_count(spec.gpu) and not spec.gpu.whole:
            groups = tuple(self._group_for(placement.node, d, spec.uid) for d in placement.devices)
        entry = Entry(pod_key, placement.node, tuple(placement.devices), shape, pipelined, groups)
        self.entries.append(entry)
        return entry

    def _group_for(self, node_index: int, device: int, pod_uid: str) -> str:
        """The shared-GPU group of a device: the one it already has, else a new stable id."""
        local = device - self.idle.gpu_start[node_index]
        existing = self.nodes[node_index].device_group(local)
        if existing is not None:
            return existing
        key = (node_index, local)
        if key not in self._new_groups:
            self._new_groups[key] = derived_id(pod_uid, device)
        return self._new_groups[key]

    def local_devices(self, entry: Entry) -> list[int]:
        """Device indices of an entry relative to its node (what events carry)."""
        base = self.idle.gpu_start[entry.node]
        return [d - base for d in entry.devices]
