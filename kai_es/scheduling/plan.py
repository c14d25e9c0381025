"""A Plan: tentative placements over scratch copies of cluster capacity, with checkpoint and
rollback (KAI's Statement). Committing a plan means turning its entries into decision events.

Two tables are kept in node-name order: `idle` (free now) and `future` (free once every
Releasing pod is gone). A task that fits idle capacity takes it in both; a task that only fits
future capacity is pipelined and takes it in `future` only.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Protocol

from kai_es.events.factory import derived_id
from kai_es.events.payloads import PodObserved
from kai_es.scheduling.packing import Packer, Placement, Strategy, TaskShape, bind_place
from kai_es.scheduling.tables import tables
from kai_es.state.model import ClusterState
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


class PlanListener(Protocol):
    """Told of every tentative placement and of its undoing (rollback), in that order, so that
    what it derives from placements follows the Plan exactly."""

    def placed(self, pod_key: str, node: int) -> None: ...

    def unplaced(self, pod_key: str, node: int) -> None: ...


class Plan:
    """Tentative placements with checkpoint/rollback (see module docstring)."""

    def __init__(self, state: ClusterState, packer: Packer, strategy: Strategy) -> None:
        self.state = state
        self.packer = packer
        self.strategy = strategy
        self.names, self.nodes, idle, future = tables(state)
        self.idle, self.future = idle.copy(), future.copy()
        self._place_idle = bind_place(packer, self.idle, strategy)
        self._place_future = bind_place(packer, self.future, strategy)
        self.entries: list[Entry] = []
        self.listeners: list[PlanListener] = []
        self._new_groups: dict[tuple[int, int], str] = {}
        # answers that cannot change this cycle, by (id of interned shape, id of mask); the
        # shapes and masks live as long as the plan
        self._failed: dict[tuple[int, int], Placement] = {}
        self._shapes: dict[tuple[object, int, int], TaskShape] = {}

    def shape(self, spec: PodObserved) -> TaskShape:
        """The packer's view of `spec`: one object per distinct request in this plan."""
        requests = spec.requests
        key = (spec.gpu, requests.milli_cpu, requests.memory_bytes)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = task_shape(spec)
        return shape

    def checkpoint(self) -> int:
        return len(self.entries)

    def rollback(self, checkpoint: int) -> None:
        """Undo every placement made after `checkpoint`, newest first."""
        while len(self.entries) > checkpoint:
            e = self.entries.pop()
            self.future.apply_placed(e.node, e.devices, e.shape, -1)
            if not e.pipelined:
                self.idle.apply_placed(e.node, e.devices, e.shape, -1)
            for listener in self.listeners:
                listener.unplaced(e.pod_key, e.node)

    def place(self, pod_key: str, spec: PodObserved, mask: array[int], settled: bool = False,
              remember: bool = True, levels: list[array[int]] | None = None
              ) -> tuple[Entry | None, Placement]:
        """Place one task: idle capacity first, else pipelined onto releasing capacity.
        Returns the entry (None when nothing fits) and the idle-capacity placement answer on
        `mask`, whose rejection counts explain a failure.

        `levels` (sub-masks of `mask`, most preferred first) rank nodes before the packing
        strategy: on idle capacity, then on releasing capacity, the first level with a fitting
        node wins.

        `settled=True` says no tentative (uncommitted) placement is outstanding. Capacity never
        grows above its settled level during a cycle, so a shape that fails then, for the same
        static mask (`remember=True`: a mask that does not change during the cycle), fails for
        the rest of the cycle: that answer is remembered and reused."""
        shape = self.shape(spec)
        failed_key = (id(shape), id(mask))
        if remember:
            known = self._failed.get(failed_key)
            if known is not None:
                return None, known
        for level in (levels or (mask,)):
            now = self._place_idle(shape, level)
            if now.placed:
                future = self.future
                if not future.can_take(now.node, now.devices, shape):
                    if levels is None:
                        return None, now  # idle capacity a pipelined pod is already waiting for
                    continue
                future.apply_placed(now.node, now.devices, shape, 1)
                self.idle.apply_placed(now.node, now.devices, shape, 1)
                entry = self._record(pod_key, spec, shape, now, pipelined=False)
                return entry, now
        if levels is not None:
            now = self._place_idle(shape, mask)
            if now.placed:
                return None, now  # fits only capacity pipelined pods are waiting for
        for level in (levels or (mask,)):
            later = self._place_future(shape, level)
            if later.placed:
                entry = self._record(pod_key, spec, shape, later, pipelined=True)
                self.future.apply_placed(later.node, later.devices, shape, 1)
                return entry, now
        if settled and remember:
            self._failed[failed_key] = now
        return None, now

    def known_failure(self, spec: PodObserved, mask: array[int]) -> Placement | None:
        """The remembered answer if `spec`'s shape already failed on `mask` with no tentative
        placement outstanding: `place` would return exactly it, now or later in this cycle."""
        return self._failed.get((id(self.shape(spec)), id(mask)))

    def _record(self, pod_key: str, spec: PodObserved, shape: TaskShape, placement: Placement,
                pipelined: bool) -> Entry:
        groups: tuple[str, ...] = ()
        if device_count(spec.gpu) and not spec.gpu.whole:
            groups = tuple(self._group_for(placement.node, d, spec.uid) for d in placement.devices)
        entry = Entry(pod_key, placement.node, tuple(placement.devices), shape, pipelined, groups)
        self.entries.append(entry)
        for listener in self.listeners:
            listener.placed(pod_key, placement.node)
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
