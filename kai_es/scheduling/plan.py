"""The Plan: KAI's Statement. Typed tentative operations — allocate (onto idle capacity),
pipeline (onto capacity still being released) and evict — over scratch copies of cluster
capacity, with checkpoint and rollback; committing a plan means turning its operations into
decision events (`kai_es.scheduling.emit`).

Contract:
- Two tables are kept in node-name order: `idle` (free now) and `future` (free once every
  Releasing pod, and every pod this plan evicts, is gone). An allocation takes capacity in both;
  a pipelined placement in `future` only; an eviction gives its pod's capacity back in `future`.
  A move (consolidation) is an eviction and an allocation of the same pod elsewhere (`Entry`
  with `moved_from` set), announced only as the eviction.
- Every operation is also announced to the plan's listeners (`PlanListener`), and its undoing
  too: `rollback(cp)` undoes every operation after checkpoint `cp`, newest first, in the tables
  *and* in everything the listeners derive (queue accounting, predicate trackers), so that after
  a rollback the plan is exactly what it was at the checkpoint.
- `epoch` counts the operations that made capacity grow within the cycle (evictions). Anything
  remembered on the premise "free capacity only shrinks" is keyed by it (the no-fit memo here;
  the session's order cache is invalidated by its accounting listener).
- Verification mode (`verify=True`; CI runs it) re-checks every remembered "does not fit"
  against the packer before using it, and the incremental pack tables against a rebuild at the
  cut; it raises `VerificationError` on a disagreement.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from kai_es.events.factory import derived_id
from kai_es.events.payloads import PodObserved
from kai_es.scheduling.packing import (
    ArrayPackTable,
    BoundPlace,
    Packer,
    Placement,
    Strategy,
    TaskShape,
    bind_place,
    bind_rank,
)
from kai_es.scheduling.packing.among import best_among, on_one_node
from kai_es.scheduling.packing.reference import filter_node
from kai_es.scheduling.tables import index_of, tables
from kai_es.state.model import ClusterState
from kai_es.state.quantities import device_count


#: how many nodes the packer's scan checks in the time its Python twin checks one: the nodes
#: with evictions are looked at alone (`Plan._pipeline`) while there are fewer than this many
#: times less of them than nodes
AMONG_PER_SCAN = 128

#: how many fitting nodes a `Plan.fits_elsewhere` scan keeps to answer later asks with
WITNESSES = 8


class VerificationError(AssertionError):
    """A memo or an incremental structure disagrees with a recomputation (verification mode)."""


class Entry(msgspec.Struct, gc=False):
    """One tentative placement: an allocation, or a pipelined one (`pipelined`). (A msgspec
    Struct, not a dataclass: a cycle builds one per placement, and a Struct is several times
    cheaper to construct. It holds no reference back to itself.)"""

    pod_key: str
    node: int
    devices: tuple[int, ...]
    shape: TaskShape
    pipelined: bool
    gpu_groups: tuple[str, ...]
    #: a member of a gang whose minimum was pipelined: decided as pipelined too (its tables
    #: entry stays what `pipelined` says, so a rollback undoes exactly what was applied)
    gang_pipelined: bool = False
    #: a running pod this plan evicts and re-places (consolidation): the node index it moves
    #: off, else -1. A move holds capacity for the pod's replacement within the cycle; it is
    #: announced in the pod's eviction, never as a placement of its own
    moved_from: int = -1

    @property
    def announced_pipelined(self) -> bool:
        return self.pipelined or self.gang_pipelined


@dataclass(slots=True)
class Eviction:
    """One tentative eviction of a pod that occupies `node` (its `devices`), decided by
    `action` for `preemptor` (a pod key) with a reason a person can read."""

    pod_key: str
    node: int
    devices: tuple[int, ...]
    shape: TaskShape
    action: str
    preemptor: str
    reason: str
    numbers: dict[str, int]
    #: a move (kai-es/v6): the name of the node the pod is re-placed on, announced with the
    #: eviction as one decision; "" for an eviction
    to_node: str = ""
    #: put back where it runs by a later `Plan.unevict` (kai-es/v6): no longer an eviction
    undone: bool = False


@dataclass(slots=True)
class Unevict:
    """The undoing of `eviction` by a later decision (kai-es/v6's re-placement: a victim that
    fits back where it runs stays). Listeners are told of it as the eviction's undoing."""

    eviction: Eviction


Operation = Entry | Eviction | Unevict
#: what listeners are told of (an unevict is told as its eviction's undoing)
Announced = Entry | Eviction


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
    """Told of every operation (`sign=+1`) and of its undoing by a rollback (`sign=-1`), in
    that order, so that what it derives from the plan follows it exactly."""

    def on_operation(self, op: Announced, sign: int) -> None: ...


class Plan:
    """Tentative placements with checkpoint/rollback (see module docstring)."""

    def __init__(self, state: ClusterState, packer: Packer, strategy: Strategy, verify: bool = False,
                 skips_held_idle: bool = False) -> None:
        self.state = state
        self.verify = verify
        #: `place` passes over a node whose idle capacity fits but is held for pipelined pods
        #: and asks the packer again (kai-es/v10: `rules.releasing_capacity.HeldIdleSkipped`);
        #: else it gives up on the first such node
        self.skips_held_idle = skips_held_idle
        #: pods `place` puts on idle capacity only, never pipelined (pending background pods:
        #: `rules.background_pods`)
        self.idle_only: frozenset[str] = frozenset()
        self.epoch = 0
        self.packer = packer
        self.strategy = strategy
        self.names, self.nodes, idle, future = tables(state)
        self.node_index = index_of(state, self.names)  # (the tables': read only)
        self.idle, self.future = idle.copy(), future.copy()
        self._place_idle = bind_place(packer, self.idle, strategy)
        self._place_future = bind_place(packer, self.future, strategy)
        self._rank_idle = bind_rank(packer, self.idle, strategy)
        self.operations: list[Operation] = []
        #: the nodes whose starting point `hold` or `reserve` made differ from the tables' (no
        #: operation, so no listener, tells of them)
        self.adjusted: set[int] = set()
        self._evicted: set[str] = set()
        self.listeners: list[PlanListener] = []
        self._new_groups: dict[tuple[int, int], str] = {}
        # answers that cannot change while `epoch` stays the same, by (epoch, id of interned
        # shape, id of mask); the shapes and remembered masks live as long as the plan
        self._failed: dict[tuple[int, int, int], Placement] = {}
        #: idle answers that did not place, by (id of interned shape, id of mask), found with no
        #: tentative placement outstanding on a mask that does not change: idle capacity only
        #: shrinks during a cycle (evictions give capacity to `future` only; a rollback
        #: restores no more than was settled), so such a shape fails there for the rest of the
        #: cycle, whatever the epoch (`place`'s `explain=False`)
        self._idle_failed: dict[tuple[int, int], Placement] = {}
        #: (id of interned shape, id of mask) of tasks that fitted no releasing capacity of a
        #: mask that does not change, found settled: releasing capacity grows only by evictions,
        #: so until the cycle ends such a task can fit only a node with an eviction in force
        #: (`_pipeline` looks at those alone)
        self._future_failed: set[tuple[int, int]] = set()
        #: node index -> how many of the plan's evictions in force are on it
        self._evicted_on: dict[int, int] = {}
        #: the masks allowing one node (`one_node_mask`), by node index and by id (the mask and
        #: its node: kept alive, so the id stays the mask's)
        self._one_node_masks: dict[int, array[int]] = {}
        self._one_node_of: dict[int, tuple[array[int], int]] = {}
        self._shapes: dict[tuple[object, int, int], TaskShape] = {}
        #: `fits_elsewhere`'s last scan per (id of shape, id of mask): (shape, mask, the nodes
        #: that fitted then, best first; the two kept alive so that their ids stay theirs)
        self._witnesses: dict[tuple[int, int], tuple[TaskShape, array[int], Sequence[int]]] = {}
        #: verification mode: id of each mask `place` was told does not change -> (the mask, a
        #: copy of it when first told)
        self._fixed: dict[int, tuple[array[int], array[int]]] = {}
        if verify:
            self.verify_tables()

    def shape(self, spec: PodObserved) -> TaskShape:
        """The packer's view of `spec`: one object per distinct request in this plan."""
        requests = spec.requests
        key = (spec.gpu, requests.milli_cpu, requests.memory_bytes)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = task_shape(spec)
        return shape

    @property
    def entries(self) -> list[Entry]:
        """The placements (allocations and pipelined ones), in order."""
        return [op for op in self.operations if isinstance(op, Entry)]

    @property
    def evictions(self) -> list[Eviction]:
        """The evictions that stand (not undone by an `unevict`), in order."""
        return [op for op in self.operations if isinstance(op, Eviction) and not op.undone]

    @property
    def evicted_pods(self) -> set[str]:
        """Keys of the pods this plan evicts (kept with the operations)."""
        return self._evicted

    def checkpoint(self) -> int:
        return len(self.operations)

    def rollback(self, checkpoint: int) -> None:
        """Undo every operation made after `checkpoint`, newest first."""
        while len(self.operations) > checkpoint:
            op = self.operations.pop()
            if isinstance(op, Entry):
                self.future.apply_placed(op.node, op.devices, op.shape, -1)
                if not op.pipelined:
                    self.idle.apply_placed(op.node, op.devices, op.shape, -1)
            elif isinstance(op, Eviction):
                self.future.apply_placed(op.node, op.devices, op.shape, +1)
                self._evicted.discard(op.pod_key)
                self._count_eviction(op.node, -1)
            else:  # the eviction an unevict undid stands again
                ev = op.eviction
                self.future.apply_placed(ev.node, ev.devices, ev.shape, -1)
                self._evicted.add(ev.pod_key)
                self._count_eviction(ev.node, +1)
                ev.undone = False
                self._announce(ev, +1)
                continue
            self._announce(op, -1)

    def unevict(self, op: Eviction) -> bool:
        """Put an evicted pod back where it runs, on its own devices, when the capacity it
        gave back is still free once released (nothing placed since took it): the eviction is
        undone (announced as its undoing; a rollback past this makes it stand again). False,
        with nothing changed, when the capacity is taken."""
        if op.undone or op.pod_key not in self._evicted or not self.future.can_take(op.node, op.devices, op.shape):
            return False
        self.future.apply_placed(op.node, op.devices, op.shape, 1)
        self._evicted.discard(op.pod_key)
        self._count_eviction(op.node, -1)
        op.undone = True
        self.operations.append(Unevict(op))
        self._announce(op, -1)
        return True

    def hold(self, pod_key: str) -> None:
        """Keep a Releasing pod's capacity used in `future` for this plan (a stuck releasing
        pod: `rules.releasing_capacity`). Only before the first operation: it is the plan's
        starting point, which no rollback undoes."""
        if self.operations:
            raise RuntimeError("Plan.hold after an operation")
        pod = self.state.pods[pod_key]
        node, devices = self._where(pod_key)
        self.future.apply_placed(node, devices, self.shape(pod.spec), 1)
        self.adjusted.add(node)

    def reserve(self, spec: PodObserved, node: str) -> bool:
        """Keep idle capacity for one task of `spec`'s shape used on `node` for this plan (the
        room held for a moved pod's replacement: `rules.move_holds`), on the devices the packer
        picks there. Only before the first operation, like `hold`. False, with nothing held,
        when the node is unknown or the shape no longer fits its idle capacity."""
        if self.operations:
            raise RuntimeError("Plan.reserve after an operation")
        index = self.node_index.get(node)
        if index is None:
            return False
        shape = self.shape(spec)
        only = array("q", bytes(8 * len(self.nodes)))
        only[index] = 1
        now = self._place_idle(shape, only)
        if not now.placed or not self.future.can_take(now.node, now.devices, shape):
            return False
        self.future.apply_placed(now.node, now.devices, shape, 1)
        self.idle.apply_placed(now.node, now.devices, shape, 1)
        self.adjusted.add(now.node)
        return True

    def _where(self, pod_key: str) -> tuple[int, tuple[int, ...]]:
        """The node index of an occupying pod and its devices' indices in the tables."""
        pod = self.state.pods[pod_key]
        node = self.node_index[pod.node]
        base = self.idle.gpu_start[node]
        return node, tuple(base + d for d in pod.devices)

    def close(self) -> None:
        """The plan is done with: its listeners are dropped. They hold the plan (a Session, the
        predicate trackers), so until then a cycle's Session, Plan, entries and the pods they
        name form reference cycles that only a collection frees; after it, reference counting
        frees them as the cycle returns (a replay runs with the collector paused: else every
        cycle's objects stay, ~1 KB a placement, and each cycle allocates fresh memory)."""
        self.listeners.clear()

    def _announce(self, op: Announced, sign: int) -> None:
        for listener in self.listeners:
            listener.on_operation(op, sign)

    def evict(self, pod_key: str, action: str, preemptor: str, reason: str,
              numbers: dict[str, int] | None = None) -> Eviction:
        """Evict an occupying pod: its capacity becomes future capacity (a capacity-growing
        operation: `epoch` moves on, and what was remembered as not fitting is forgotten)."""
        pod = self.state.pods[pod_key]
        node, devices = self._where(pod_key)
        op = Eviction(pod_key, node, devices, self.shape(pod.spec), action, preemptor, reason, dict(numbers or {}))
        self.future.apply_placed(node, devices, op.shape, -1)
        self.operations.append(op)
        self._evicted.add(pod_key)
        self._count_eviction(node, +1)
        self.epoch += 1
        self._announce(op, +1)
        return op

    def nominated_first(self, node: str, mask: array[int], levels: list[array[int]] | None
                        ) -> list[array[int]] | None:
        """`levels` (None: `mask` alone) with the nominated node (reserved by an earlier
        pipelining or a move) tried first, on its `one_node_mask`, as KAI's nominated-node
        score outranks every other; `levels` unchanged when the node is not in `mask`."""
        i = self.node_index.get(node)
        if i is None or not mask[i]:
            return levels
        return [self.one_node_mask(i), *(levels if levels is not None else [mask])]

    def one_node_mask(self, node: int) -> array[int]:
        """The mask allowing node index `node` only: one object for the plan, which nobody may
        change. Placed on it, a task is checked on that node alone (`packing.among.on_one_node`),
        not with a scan of every node."""
        mask = self._one_node_masks.get(node)
        if mask is None:
            mask = array("q", bytes(8 * len(self.nodes)))
            mask[node] = 1
            self._one_node_masks[node] = mask
            self._one_node_of[id(mask)] = (mask, node)
        return mask

    def _ask(self, place: BoundPlace, table: ArrayPackTable, shape: TaskShape, mask: array[int],
             fixed: bool) -> Placement:
        """`place`'s answer (the bound packer of `table`) for `shape` on `mask`: on a mask of
        `one_node_mask`, computed on its node alone."""
        one = self._one_node_of.get(id(mask))  # (it keeps the mask alive: the id is the mask's)
        if one is not None:
            answer = on_one_node(table, shape, self.strategy, mask, one[1])
            if answer is not None:
                if self.verify and answer != self.packer.place(table, shape, self.strategy, mask):
                    raise VerificationError(f"{shape} on the one node {one[1]}: {answer} is not the packer's answer")
                return answer
        return place(shape, mask, fixed)

    def _count_eviction(self, node: int, sign: int) -> None:
        count = self._evicted_on.get(node, 0) + sign
        if count:
            self._evicted_on[node] = count
        else:
            del self._evicted_on[node]

    def place(self, pod_key: str, spec: PodObserved, mask: array[int], settled: bool = False,
              remember: bool = True, levels: list[array[int]] | None = None, explain: bool = True
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
        the rest of the cycle: that answer is remembered and reused (its rejection counts are
        those of the first failure: as capacity shrinks further a node may fail an earlier
        check, which the remembered reason does not follow). Such a mask is handed to the bound
        packer as fixed (`packing.repeat.RepeatedPlace`: a run of identical pods is then known
        by the mask's identity); verification mode checks that it indeed never changes.

        `explain=False`: the caller ignores the idle answer returned. Then, on a remembered mask
        without `levels`, an idle failure found settled earlier in the cycle (by any epoch:
        idle capacity never grows) is not asked again: the task goes straight to releasing
        capacity, and that failure's answer is returned."""
        shape = self.shape(spec)
        failed_key = (self.epoch, id(shape), id(mask))
        if remember:
            if self.verify:
                self._verify_fixed(mask)
            known = self._failed.get(failed_key)
            if known is not None:
                if self.verify:
                    self._verify_failure(shape, mask, known)
                return None, known
            if not explain and levels is None:
                idle_known = self._idle_failed.get((id(shape), id(mask)))
                if idle_known is not None:
                    if self.verify:
                        self._verify_idle_failure(shape, mask, idle_known)
                    return self._pipeline(pod_key, spec, shape, (mask,), mask), idle_known
        if self.skips_held_idle:
            return self._place_past_held(pod_key, spec, shape, mask, levels, remember, settled, failed_key)
        for level in (levels or (mask,)):
            now = self._ask(self._place_idle, self.idle, shape, level, remember and level is mask)
            if now.placed:
                future = self.future
                if not future.can_take(now.node, now.devices, shape):
                    if levels is None:
                        return None, now  # idle capacity a pipelined pod is already waiting for
                    continue
                future.apply_placed(now.node, now.devices, shape, 1)
                self.idle.apply_placed(now.node, now.devices, shape, 1)
                return self._record(pod_key, spec, shape, now, pipelined=False), now
        if levels is not None:
            now = self._place_idle(shape, mask, remember)
            if now.placed:
                return None, now  # fits only capacity pipelined pods are waiting for
        if settled and remember:
            self._idle_failed[(id(shape), id(mask))] = now
        later = self._pipeline(pod_key, spec, shape, levels or (mask,), mask if remember else None)
        if later is not None:
            return later, now
        if settled and remember and pod_key not in self.idle_only:  # (an idle-only failure says nothing of others)
            self._failed[failed_key] = now
            if levels is None:
                self._future_failed.add((id(shape), id(mask)))
        return None, now

    def _place_past_held(self, pod_key: str, spec: PodObserved, shape: TaskShape, mask: array[int],
                         levels: list[array[int]] | None, fixed: bool, settled: bool,
                         failed_key: tuple[int, int, int]) -> tuple[Entry | None, Placement]:
        """`place` when `skips_held_idle`: on each level, idle capacity on a node the packer
        picks whose capacity no pipelined pod waits for (a node so held is left out and the
        packer asked again), else pipelined onto releasing capacity. The idle answer returned
        is the first held node's when there was one (the capacity that fits is held), else the
        packer's answer on `mask`. `fixed` and `settled` are `place`'s `remember` and `settled`."""
        held: Placement | None = None
        answer: Placement | None = None
        for level in (levels or (mask,)):
            allowed = level  # copied before the first node is left out: `level` is the caller's
            while True:
                now = self._ask(self._place_idle, self.idle, shape, allowed, fixed and allowed is mask)
                if not now.placed:
                    if allowed is mask:
                        answer = now
                    break
                if self.future.can_take(now.node, now.devices, shape):
                    self.future.apply_placed(now.node, now.devices, shape, 1)
                    self.idle.apply_placed(now.node, now.devices, shape, 1)
                    return self._record(pod_key, spec, shape, now, pipelined=False), now
                if held is None:
                    held = now
                if id(allowed) in self._one_node_of:
                    break  # (its one node is held: left out, it allows none)
                if allowed is level:
                    allowed = array("q", level)
                allowed[now.node] = 0
        if held is not None:
            answer = held
        else:
            if answer is None:
                answer = self._place_idle(shape, mask, fixed)
            if settled and fixed and not answer.placed:
                self._idle_failed[(id(shape), id(mask))] = answer
        later = self._pipeline(pod_key, spec, shape, levels or (mask,), mask if fixed else None)
        if later is not None:
            return later, answer
        if settled and fixed and held is None and pod_key not in self.idle_only:
            self._failed[failed_key] = answer
            if levels is None:
                self._future_failed.add((id(shape), id(mask)))
        return None, answer

    def _pipeline(self, pod_key: str, spec: PodObserved, shape: TaskShape,
                  levels: Sequence[array[int]], fixed_mask: array[int] | None = None) -> Entry | None:
        """Pipeline one task onto releasing capacity, on the first level with a fitting node
        (never a pod placed on idle capacity only); None when none fits. `fixed_mask`: a mask
        among `levels` that never changes (the packer's kept answer is then known by identity)."""
        if pod_key in self.idle_only:
            return None
        if len(levels) == 1 and levels[0] is fixed_mask and (id(shape), id(fixed_mask)) in self._future_failed \
                and len(self._evicted_on) * AMONG_PER_SCAN <= len(self.nodes):
            # it can fit only where an eviction released capacity
            answers: Iterator[Placement] = iter((self._future_on_evicted(shape, fixed_mask),))
        else:
            answers = (self._ask(self._place_future, self.future, shape, level, level is fixed_mask) for level in levels)
        for later in answers:
            if later.placed:
                entry = self._record(pod_key, spec, shape, later, pipelined=True)
                self.future.apply_placed(later.node, later.devices, shape, 1)
                return entry
        return None

    def _future_on_evicted(self, shape: TaskShape, mask: array[int]) -> Placement:
        """The packer's node and devices for `shape` on releasing capacity of `mask`, looking
        only at nodes with an eviction in force (`_future_failed`: no other node can fit).
        Rejections are not counted: no caller reads them."""
        future, strategy = self.future, self.strategy
        answer = best_among(future, shape, strategy, mask, sorted(self._evicted_on))
        if self.verify:
            full = self.packer.place(future, shape, strategy, mask)
            if (full.node, full.devices) != (answer.node, answer.devices):
                raise VerificationError(f"{shape} on releasing capacity: node {answer.node} {answer.devices} from the "
                                        f"nodes with evictions, the packer says {full.node} {full.devices}")
        return answer

    def place_idle(self, pod_key: str, spec: PodObserved, mask: array[int], away_from: int = -1,
                   fixed: bool = False) -> Entry | None:
        """Place one task on idle capacity only (never pipelined), on a node of `mask` other
        than node index `away_from` whose capacity no pipelined pod is waiting for: a node the
        packer picks that is `away_from` or whose idle capacity is so held is left out and the
        packer asked again. None when no node fits. `fixed`: `mask` never changes during the
        cycle (as `place`'s `remember`; the packer's kept answer is then known by identity, and
        the mask is copied only when a node must be left out)."""
        shape = self.shape(spec)
        if fixed and self.verify:
            self._verify_fixed(mask)
        allowed = mask  # copied before the first node is left out: `mask` is the caller's
        while True:
            now = self._place_idle(shape, allowed, fixed and allowed is mask)
            if not now.placed:
                return None
            if now.node != away_from and self.future.can_take(now.node, now.devices, shape):
                self.future.apply_placed(now.node, now.devices, shape, 1)
                self.idle.apply_placed(now.node, now.devices, shape, 1)
                return self._record(pod_key, spec, shape, now, pipelined=False)
            if allowed is mask:
                allowed = array("q", mask)
            allowed[now.node] = 0

    def fits_elsewhere(self, shape: TaskShape, mask: array[int], node: int) -> bool:
        """Whether `shape` fits idle capacity now on a node of `mask` other than `node` (the
        node index a pod runs on: may it move?). A scan (`Packer.rank_raw`) lists up to
        `WITNESSES` nodes that fit; while one of them other than `node` still passes the
        packer's filter (`reference.filter_node`, checked now), that is the answer without a
        scan of the cluster; only when none does is it scanned again. So a `(shape, mask)` of a
        cycle's consolidation searches costs one scan, not one per search. `mask` must not
        change during the cycle (a static mask). Verification mode asks the packer too."""
        key = (id(shape), id(mask))
        kept = self._witnesses.get(key)
        found = False
        if kept is not None:
            idle = self.idle
            found = any(n != node and filter_node(idle, mask, n, shape) is None for n in kept[2])
        if not found:
            _, ranked = self._rank_idle(shape, mask, WITNESSES)
            self._witnesses[key] = (shape, mask, ranked)
            found = any(n != node for n in ranked)
        if self.verify:
            others = array("q", mask)
            if 0 <= node < len(others):
                others[node] = 0
            if found != self.packer.place(self.idle, shape, self.strategy, others).placed:
                raise VerificationError(f"fits_elsewhere answered {found} for {shape} off node {node}; "
                                        "the packer does not agree")
        return found

    def known_failure(self, spec: PodObserved, mask: array[int]) -> Placement | None:
        """The remembered answer if `spec`'s shape already failed on `mask` with no tentative
        placement outstanding and capacity has not grown since (same epoch): `place` would
        return exactly it, now or later in this cycle unless capacity grows."""
        shape = self.shape(spec)
        known = self._failed.get((self.epoch, id(shape), id(mask)))
        if known is not None and self.verify:
            self._verify_failure(shape, mask, known)
        return known

    def _verify_fixed(self, mask: array[int]) -> None:
        kept = self._fixed.get(id(mask))
        if kept is None or kept[0] is not mask:
            self._fixed[id(mask)] = (mask, array("q", mask))
        elif kept[1] != mask:
            raise VerificationError("a node mask placed with remember=True (one that does not change during "
                                    "the cycle) changed after its first placement")

    def _verify_idle_failure(self, shape: TaskShape, mask: array[int], known: Placement) -> None:
        if self.packer.place(self.idle, shape, self.strategy, mask).placed:
            raise VerificationError(f"{shape} was remembered as fitting no idle capacity of its mask, "
                                    "but the packer places it")

    def _verify_failure(self, shape: TaskShape, mask: array[int], known: Placement) -> None:
        again = self.packer.place(self.idle, shape, self.strategy, mask)
        later = self.packer.place(self.future, shape, self.strategy, mask)
        if again.placed or later.placed:
            raise VerificationError(
                f"remembered 'does not fit' for {shape} is wrong: it fits node {again.node if again.placed else later.node}")

    def verify_tables(self) -> None:
        """Verification mode: the incremental tables at the cut equal tables built from
        scratch (before any operation of this plan)."""
        from kai_es.scheduling.tables import build_tables

        _, _, idle, future = build_tables(self.state)
        for name, mine, fresh in (("idle", self.idle, idle), ("future", self.future, future)):
            for field in fresh.ARRAYS:
                if getattr(mine, field) != getattr(fresh, field):
                    raise VerificationError(f"{name} table field {field} differs from a rebuild")

    def _record(self, pod_key: str, spec: PodObserved, shape: TaskShape, placement: Placement,
                pipelined: bool) -> Entry:
        groups: tuple[str, ...] = ()
        if device_count(spec.gpu) and not spec.gpu.whole:
            groups = tuple(self._group_for(placement.node, d, spec.uid) for d in placement.devices)
        entry = Entry(pod_key, placement.node, tuple(placement.devices), shape, pipelined, groups)
        self.operations.append(entry)
        self._announce(entry, +1)
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

    def local_devices(self, entry: Entry) -> tuple[int, ...]:
        """Device indices of an entry relative to its node (what events carry)."""
        base = self.idle.gpu_start[entry.node]
        return tuple([d - base for d in entry.devices])
