"""What consolidation's searches of one cycle derive from each node (`NodeViews`), kept across
them and recomputed only where the Plan changed. Pure: reads the state and the Plan.

The nodes by free GPU capacity are a `sortedcontainers.SortedList` (the project's sorted
container, as the reducer's indexes): a search walks them in order and an operation moves only
the nodes it touched, each in O(log n), where sorting every node per search cost O(n log n)."""

from __future__ import annotations

import heapq
from array import array
from bisect import insort
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedList

from kai_es.scheduling.actions.consolidation_bounds import StateBounds, free_milli_gpu, fresh_bounds, state_bounds
from kai_es.scheduling.packing import TaskShape
from kai_es.scheduling.packing.model import MILLI_PER_GPU, ArrayPackTable
from kai_es.scheduling.plan import Announced, Unevict, VerificationError
from kai_es.scheduling.rules.consolidation_nodes import ConsolidationNodes
from kai_es.scheduling.session import Session
from kai_es.scheduling.kept_capacity import fresh_capacity, state_capacity
from kai_es.scheduling.victims import (Unit, free_of_each, job_order, keyed_units, room,
                                       shared)
from kai_es.state.model import Job, PodState
from kai_es.state.quantities import Vector

#: what a node's movable pods free, summed: (CPU, memory, their number, device -> share freed)
Freed = tuple[int, int, int, dict[int, int]]

#: how many searches' walks a cycle keeps, the most recently used (a walk of a full cluster holds
#: its whole tie group: preemptors of many different eligible nodes must not keep one each)
KEPT_WALKS = 8

#: a node a search tries: (its index, the resources it lacks (`short_of`), its movable pods)
Candidate = tuple[int, tuple[bool, bool, bool], list[PodState]]


@dataclass(slots=True)
class _Walk:
    """One search's candidates, kept for the next search of the same tasks (`nodes_to_try`; an
    order that does not break ties)."""

    #: how many of the Plan's operations it has seen
    seen: int
    #: the walk key (-free, node) of the first node the walk did not examine (for an order that
    #: breaks ties, (-free, -1): the whole group was not examined); None: every node was
    stop: tuple[int, int] | None
    #: each candidate node kept (every one that ranks before `stop`) -> its order key
    keys: dict[int, tuple[object, ...]]
    #: those keys, sorted (each ends in its node)
    ordered: SortedList


class NodeViews:
    """What consolidation's searches of one cycle derive from each node, kept across them (a
    Plan listener): the pods there a search may move with what they free (`movable`), whether a
    task could fit with them gone (`could_fit`), what it lacks (`short_of`), the nodes by free
    GPU capacity (`most_free_first`), the cluster's free capacity (`free_capacity`) and the key
    of the cheapest unit on offer there (`cheapest`). Every answer is what computing it afresh
    gives: one is kept while no Plan operation (or rollback) touched its node nor, for the
    cheapest unit, a pod of the jobs it was derived from. When every node ties on free GPU
    capacity (a full cluster, one idle device each), a search looked at every node of the tie:
    for an order that breaks ties it now takes the nodes by their bounds, kept across cycles
    (`consolidation_bounds`), and looks at about as many as it keeps."""

    def __init__(self, session: Session) -> None:
        self.session, self.state, self.plan = session, session.state, session.plan
        #: the cycle's shared victim buckets, which number the Plan's operations and note the
        #: last one on each job (`victims.SharedBuckets`, a listener told before this one)
        self.jobs = shared(session)
        #: node index -> the number of the last Plan operation on it
        self.node_seq: dict[int, int] = {}
        self._movable: dict[int, tuple[int, list[PodState], Freed]] = {}
        self._cheapest: dict[int, tuple[int, tuple[str, ...], tuple[object, ...] | None]] = {}
        self._units: dict[str, tuple[int, list[tuple[tuple[object, ...], Unit]]]] = {}
        self._room: dict[tuple[int, TaskShape], tuple[int, bool]] = {}
        self._short: dict[tuple[int, tuple[TaskShape, ...]], tuple[int, tuple[bool, bool, bool]]] = {}
        #: the node of every operation, in order (each view below notes how many it has seen)
        self.touched: list[int] = []
        #: the nodes' bounds in the node order as of the state (`consolidation_bounds`), and
        #: the nodes the Plan touched ranked apart by their bounds with their current free
        #: capacity (node -> its key there, None: no bound), up to `_ranked_seen` operations
        self._bounds: StateBounds | None = None
        self._touched_ranked: SortedList = SortedList()
        self._touched_key: dict[int, tuple[int, bool, tuple[int, int, str], int] | None] = {}
        self._ranked_seen = 0
        #: the nodes where the Plan differed from the tables before this view: held capacity
        #: (`Plan.adjusted`) and the operations made so far (an earlier action's)
        self._before = self.plan.adjusted | {op.eviction.node if isinstance(op, Unevict) else op.node
                                             for op in self.plan.operations}
        #: a search's candidate nodes in the order they are tried (`nodes_to_try`), per search
        self._walks: OrderedDict[tuple[object, ...], _Walk] = OrderedDict()
        #: `free_capacity`: the state's per node (`kept_capacity`), the Plan's on the nodes where
        #: it differs, their sum, up to `_capacity_seen` operations
        self._capacity_state: list[Vector] | None = None
        self._capacity_plan: dict[int, Vector] = {}
        self._capacity_sum: Vector = (0, 0, 0)
        self._capacity_seen = 0
        #: each node's free GPU capacity and the nodes by it (`most_free_first`)
        self._free_now: list[int] | None = None
        self._by_free: SortedList = SortedList()
        self._order_seen = 0
        self.plan.listeners.append(self)

    @property
    def seq(self) -> int:
        """The number of the Plan's last operation (`SharedBuckets.seq`)."""
        return self.jobs.seq

    def on_operation(self, op: Announced, sign: int) -> None:
        self.node_seq[op.node] = self.jobs.seq
        self.touched.append(op.node)

    def close(self) -> None:
        if self in self.plan.listeners:
            self.plan.listeners.remove(self)

    def _fresh(self, node: int, at: int) -> bool:
        return self.node_seq.get(node, 0) <= at

    def _touched_since(self, seen: int) -> Iterable[int]:
        """Each node operations touched after the first `seen` of them, once, in order."""
        return dict.fromkeys(self.touched[seen:])

    def free_capacity(self) -> Vector:
        """`victims.free_capacity` of the whole cluster: the state's, kept across cycles
        (`kept_capacity`), with the Plan's on the nodes it differs on (held room, operations)
        instead, brought up to date on the nodes touched since it was last asked."""
        nodes: Iterable[int] = ()
        if self._capacity_state is None:
            kept = state_capacity(self.state)
            if self.plan.verify and (kept.each, kept.total) != ((fresh := fresh_capacity(self.state)).each, fresh.total):
                raise VerificationError("the free capacity kept across cycles is not the state's")
            self._capacity_state, self._capacity_sum = kept.each, kept.total
            nodes = self._before
        seen, self._capacity_seen = self._capacity_seen, len(self.touched)
        changed = list(dict.fromkeys([*nodes, *self.touched[seen:]]))
        if changed:
            base, now = self._capacity_state, self._capacity_plan
            gpu, cpu, mem = self._capacity_sum
            for n, (g1, c1, m1) in zip(changed, free_of_each(self.plan.future, changed)):
                g0, c0, m0 = now.get(n, base[n])
                now[n] = (g1, c1, m1)
                gpu, cpu, mem = gpu - g0 + g1, cpu - c0 + c1, mem - m0 + m1
            self._capacity_sum = (gpu, cpu, mem)
        return self._capacity_sum

    def most_free_first(self) -> Iterator[tuple[int, int]]:
        """Every node with its free GPU capacity once released (milli-GPU: the sum of its
        devices' free shares in the Plan's `future` table), most first, then by index. Kept
        sorted and brought up to date on the nodes touched since it was last asked for; do not
        operate on the Plan while iterating."""
        self._sync_free()
        for negative, n in self._by_free:
            yield n, -negative

    def _sync_free(self) -> list[int]:
        """Each node's free GPU capacity once released, brought up to date (and `_by_free`)."""
        table = self.plan.future
        seen, self._order_seen = self._order_seen, len(self.touched)
        if self._free_now is None:
            self._free_now = [free_milli_gpu(table, n) for n in range(len(self.plan.names))]
            self._by_free = SortedList((-f, n) for n, f in enumerate(self._free_now))
        else:
            for n in self._touched_since(seen):
                now = free_milli_gpu(table, n)
                if now != self._free_now[n]:
                    self._by_free.remove((-self._free_now[n], n))
                    self._by_free.add((-now, n))
                    self._free_now[n] = now
        return self._free_now

    def movable(self, node: int, job: Job) -> tuple[list[PodState], Freed]:
        """The pods on `node` a search for `job` may move — Running or Binding, of another
        preemptible job, not evicted by this Plan, by key — and what they free."""
        found = self._movable.get(node)
        if found is None or not self._fresh(node, found[0]):
            pods = self._movable_on(node)
            found = self._movable[node] = (self.seq, pods, self._freed(node, pods))
        _, pods, freed = found
        if job.occupying and any(pod.job_key == job.key for pod in pods):
            pods = [pod for pod in pods if pod.job_key != job.key]  # its own pods never move for it
            return pods, self._freed(node, pods)
        return pods, freed

    def could_fit(self, node: int, shapes: list[tuple[TaskShape, array[int]]], movable: list[PodState],
                  freed: Freed) -> bool:
        """Whether one of the tasks (its shape, its eligible nodes) could fit `node` with
        `movable` gone (`freed`: what they free): the shared per-node room check (`victims.room`)."""
        table, cpu, mem, count, devices = self.plan.future, *freed
        whole = self._movable[node][1] is movable
        for shape, mask in shapes:
            if not mask[node]:
                continue
            if not whole:
                fits = room(table, node, shape, cpu, mem, count, devices)
            else:
                found = self._room.get((node, shape))
                if found is None or not self._fresh(node, found[0]):
                    found = self._room[(node, shape)] = (self.seq, room(table, node, shape, cpu, mem, count, devices))
                fits = found[1]
            if fits:
                return True
        return False

    def short_of(self, node: int, tasks: list[TaskShape]) -> tuple[bool, bool, bool]:
        """`short_of` the node for these tasks (which resources it lacks for some of them)."""
        key = (node, tuple(tasks))
        found = self._short.get(key)
        if found is None or not self._fresh(node, found[0]):
            found = self._short[key] = (self.seq, short_of(self.plan.future, node, tasks))
        return found[1]

    def _movable_on(self, node: int) -> list[PodState]:
        state, evicted = self.state, self.plan.evicted_pods
        out = []
        for key in sorted(self.plan.nodes[node].pods):
            pod = state.pods.get(key)
            if pod is None or pod.status not in ("Running", "Binding") or key in evicted:
                continue
            owner = state.jobs.get(pod.job_key)
            if owner is not None and owner.preemptible:
                out.append(pod)
        return out

    def _freed(self, node: int, pods: list[PodState]) -> Freed:
        base = self.plan.future.gpu_start[node]
        devices: dict[int, int] = {}
        cpu = mem = 0
        for pod in pods:
            for d in pod.devices:
                devices[base + d] = devices.get(base + d, 0) + pod.device_milli
            cpu += pod.spec.requests.milli_cpu
            mem += pod.spec.requests.memory_bytes
        return cpu, mem, len(pods), devices

    def cheapest(self, nodes: list[tuple[int, tuple[bool, bool, bool], list[PodState]]]
                 ) -> dict[int, tuple[object, ...] | None]:
        """Each node's cheapest movable unit's key in the victim order (`keyed_units`; None:
        none offered). A unit's key starts with its job's `job_order`, so a node's cheapest is
        among the units of the jobs first in that order that offer one with a pod there: only
        those jobs' units are built. Kept per node while neither the node nor a job it read
        changed; a node whose list lacks the preemptor's own pods there is computed for it alone."""
        job_seq = self.jobs.touched
        out: dict[int, tuple[object, ...] | None] = {}
        for n, _, movable in nodes:
            whole = self._movable.get(n)
            if whole is None or whole[1] is not movable:  # without `job`'s own pods: for it alone
                out[n] = self._cheapest_on(movable)[1]
                continue
            found = self._cheapest.get(n)
            if found is not None and self._fresh(n, found[0]) and all(job_seq.get(k, 0) <= found[0] for k in found[1]):
                out[n] = found[2]
                continue
            read, best = self._cheapest_on(movable)
            self._cheapest[n] = (self.seq, read, best)
            out[n] = best
        return out

    def nodes_to_try(self, job: Job, shapes: list[tuple[TaskShape, array[int]]], order: ConsolidationNodes,
                     most: int) -> list[Candidate]:
        """The nodes a search for `job` tries, in order, at most `most`: of the nodes one of its
        tasks (shape, eligible nodes) may use, large enough for one, with pods it may move whose
        going would make room for one (`could_fit`), the first `most` by `order.key` — what
        walking the nodes most free first, stopping once `most` are found (and, for an order
        that `breaks_ties`, their last one's group of equal free capacity is complete), then
        ordering them gives. Each with what it lacks (`short_of`) and its movable pods.

        An order that breaks ties: the nodes are taken by their bound in the order (`_ranked`,
        kept across cycles by `consolidation_bounds`), so a search looks at about `most` nodes
        however many tie on free capacity. Another: a search is kept (`_Walk`), and the next one
        for the same tasks and nodes (and a preemptor with no pod running) re-examines only the
        nodes touched since, instead of walking the cluster again. The nodes it kept are every
        candidate that ranked before the first node it did not examine; a node entering or
        leaving that range is a touched one, so what it keeps stays the first by the key while
        it holds `most` of them (else the cluster is walked again)."""
        masks = [mask for _, mask in shapes]
        key: tuple[object, ...] | None = None
        if not job.occupying:  # (its own pods never move for it: what it may move is its own)
            key = (type(order).__name__, most, tuple(shape for shape, _ in shapes),
                   tuple(mask.tobytes() for mask in masks))
        if order.breaks_ties:
            out = self._ranked(job, shapes, order, most)
            if self.plan.verify:
                self._verify_walk(out, job, shapes, order, most)
            return out
        walk = None
        if key is not None:
            walk = self._walks.get(key)
            if walk is not None:
                self._walks.move_to_end(key)
        if walk is not None and not self._bring_up_to_date(walk, job, shapes, order, most):
            walk = None
        if walk is None:
            walk = self._walk(job, shapes, order, most)
            if key is not None:
                self._walks[key] = walk
                if len(self._walks) > KEPT_WALKS:  # (each holds up to a tie group: keep memory bounded)
                    self._walks.popitem(last=False)
        tried = (self._candidate(k[-1], job, shapes) for k in walk.ordered.islice(0, most))
        out = [c for c in tried if c is not None]
        if self.plan.verify:
            self._verify_walk(out, job, shapes, order, most)
        return out

    def _verify_walk(self, out: list[Candidate], job: Job, shapes: list[tuple[TaskShape, array[int]]],
                     order: ConsolidationNodes, most: int) -> None:
        fresh = [n for n, _, _ in self._walk_nodes(job, shapes, order, most)[0]]
        if [n for n, _, _ in out] != fresh:
            raise VerificationError(f"consolidation's kept search tries nodes {[n for n, _, _ in out]}, "
                                    f"a fresh walk {fresh}")

    def _ranked(self, job: Job, shapes: list[tuple[TaskShape, array[int]]], order: ConsolidationNodes,
                most: int) -> list[Candidate]:
        """For an order that breaks ties by the cheapest victim: the first `most` candidates by
        `order.key`, found by taking the nodes by their bound (`consolidation_bounds`: never
        above the key), lowest first, and stopping once `most` candidates were found whose
        keys are all below the next node's bound; what walking every node most free first,
        whole groups of equal free capacity, then ordering gives."""
        bounds = self._sync_ranked()
        touched = self._touched_key
        masks = [mask for _, mask in shapes]
        best: list[tuple[tuple[object, ...], Candidate]] = []
        untouched = (b for b in bounds.ordered if b[3] not in touched)
        for bound in heapq.merge(untouched, self._touched_ranked):
            if len(best) >= most and bound > best[-1][0]:
                break  # every node left ranks after the `most` found
            n = bound[3]
            if not any(mask[n] for mask in masks):
                continue  # none of its tasks may use the node
            candidate = self._candidate(n, job, shapes)
            if candidate is None:
                continue
            insort(best, (order.key(n, -bound[0], self.cheapest([candidate])[n]), candidate))
            if len(best) > most:
                best.pop()
        return [candidate for _, candidate in best]

    def _sync_ranked(self) -> StateBounds:
        """The state's bounds, and the touched nodes' keys brought up to date with the Plan."""
        bounds = self._bounds
        nodes: Iterable[int] = ()
        if bounds is None:
            bounds = self._bounds = state_bounds(self.state)
            if self.plan.verify:
                fresh = fresh_bounds(self.state)
                if (bounds.names, bounds.least, bounds.free, list(bounds.ordered)) != \
                        (fresh.names, fresh.least, fresh.free, list(fresh.ordered)):
                    raise VerificationError("consolidation's node bounds kept across cycles are not "
                                            "the state's")
            nodes = self._before
        seen, self._ranked_seen = self._ranked_seen, len(self.touched)
        table, ranked, keys = self.plan.future, self._touched_ranked, self._touched_key
        added = []
        for n in dict.fromkeys([*nodes, *self.touched[seen:]]):
            old = keys.get(n)
            if old is not None:
                ranked.remove(old)
            least = bounds.least[n]
            keys[n] = key = None if least is None else (-free_milli_gpu(table, n), False, least, n)
            if key is not None:
                added.append(key)
        ranked.update(added)  # (at once: the first call ranks every node an earlier action touched)
        return bounds

    def _candidate(self, n: int, job: Job, shapes: list[tuple[TaskShape, array[int]]]) -> Candidate | None:
        """(n, what it lacks, its movable pods) if `n` is a candidate for the search, else None."""
        if not any(mask[n] for _, mask in shapes):
            return None
        tasks = [shape for shape, _ in shapes]
        start = self.plan.future.gpu_start
        size, spec = start[n + 1] - start[n], self.plan.nodes[n].spec
        if not any(t.whole_gpus <= size and t.milli_cpu <= spec.milli_cpu and t.memory_bytes <= spec.memory_bytes
                   for t in tasks):
            return None  # too small for any task, whatever moves
        movable, freed = self.movable(n, job)
        if movable and self.could_fit(n, shapes, movable, freed):
            return n, self.short_of(n, tasks), movable
        return None

    def _walk_nodes(self, job: Job, shapes: list[tuple[TaskShape, array[int]]], order: ConsolidationNodes,
                    most: int) -> tuple[list[Candidate], tuple[int, int] | None, dict[int, tuple[object, ...]]]:
        """Walk the nodes most free first: (the first `most` candidates by `order`, the walk key
        (-free, node) below which every node was examined (None: every node), each candidate
        found with its order key)."""
        found: list[Candidate] = []
        free_of: dict[int, int] = {}
        stop: tuple[int, int] | None = None
        masks = [mask for _, mask in shapes]
        for n, free in self.most_free_first():
            if not any(mask[n] for mask in masks):
                continue  # none of its tasks may use the node
            if len(found) >= most and (not order.breaks_ties or free != free_of[found[-1][0]]):
                # (a rule that breaks ties sees the whole group of the last node kept)
                stop = (-free, n) if not order.breaks_ties else (-free, -1)
                break
            free_of[n] = free
            candidate = self._candidate(n, job, shapes)
            if candidate is not None:
                found.append(candidate)
        cheapest: dict[int, tuple[object, ...] | None] = {}
        if order.breaks_ties and found:
            cheapest = self.cheapest(found)
        keys = {n: order.key(n, free_of[n], cheapest.get(n)) for n, _, _ in found}
        if order.breaks_ties and len(found) > 1:
            by_node = {entry[0]: entry for entry in found}
            found = [by_node[n] for n in order.order([n for n, _, _ in found], free_of, cheapest)]
        return found[:most], stop, keys

    def _walk(self, job: Job, shapes: list[tuple[TaskShape, array[int]]], order: ConsolidationNodes,
              most: int) -> _Walk:
        _, stop, keys = self._walk_nodes(job, shapes, order, most)
        return _Walk(seen=len(self.touched), stop=stop, keys=keys, ordered=SortedList(keys.values()))

    def _bring_up_to_date(self, walk: _Walk, job: Job, shapes: list[tuple[TaskShape, array[int]]],
                          order: ConsolidationNodes, most: int) -> bool:
        """Re-examine the nodes that changed since `walk` was last brought up to date: False when
        it no longer holds enough candidates to answer (walk the cluster again)."""
        seen = walk.seen
        if seen == len(self.touched):
            return True
        free_now = self._sync_free()
        changed = set(self.touched[seen:])
        walk.seen = len(self.touched)
        for n in changed:
            old = walk.keys.pop(n, None)
            if old is not None:
                walk.ordered.remove(old)
            free = free_now[n]
            if walk.stop is not None and (-free, n) >= walk.stop:
                continue  # ranks after a node never examined: not kept
            candidate = self._candidate(n, job, shapes)
            if candidate is None:
                continue
            walk.keys[n] = order.key(n, free, None)
            walk.ordered.add(walk.keys[n])
        return walk.stop is None or len(walk.ordered) >= most

    def _cheapest_on(self, movable: list[PodState]) -> tuple[tuple[str, ...], tuple[object, ...] | None]:
        """(the jobs whose units were read, the cheapest key of a unit with a pod in `movable`)."""
        jobs = self.state.jobs
        here = {pod.key for pod in movable}
        owners = sorted([(job_order(jobs[k]), k) for k in {pod.job_key for pod in movable}])  # (keys unique by k)
        best: tuple[object, ...] | None = None
        read: list[str] = []
        for order, k in owners:
            job = jobs[k]
            if best is not None and best[:3] != order:
                break  # every later job's units cost more
            read.append(k)
            for key, unit in self.units_of(job):  # cheapest first
                if any(pod.key in here for pod in unit.pods):
                    if best is None or key < best:
                        best = key
                    break
        return tuple(read), best

    def units(self, jobs: Iterable[Job]) -> list[tuple[tuple[object, ...], Unit]]:
        """`victims.keyed_units(session, jobs, backoff=True)`, each job's kept while no Plan
        operation touched it: a unit's key is unique (it ends in a pod's key), so the merge of
        each job's list, cheapest first, is the list of all of them."""
        return list(heapq.merge(*(self.units_of(job) for job in jobs), key=unit_key))

    def units_of(self, job: Job) -> list[tuple[tuple[object, ...], Unit]]:
        """`victims.keyed_units(session, [job], backoff=True)`, kept while no Plan operation
        touched the job."""
        found = self._units.get(job.key)
        if found is None or self.jobs.touched.get(job.key, 0) > found[0]:
            found = self._units[job.key] = (self.seq, keyed_units(self.session, [job], backoff=True))
        return found[1]


def unit_key(item: tuple[tuple[object, ...], Unit]) -> tuple[object, ...]:
    return item[0]


def short_of(table: ArrayPackTable, node: int, shapes: list[TaskShape]) -> tuple[bool, bool, bool]:
    """Which resources (GPU, CPU, memory) `node` lacks, once released, for some of the tasks:
    fewer devices with the share a task needs than it needs, or less CPU or memory than the
    largest request."""
    cpu = max(shape.milli_cpu for shape in shapes)
    mem = max(shape.memory_bytes for shape in shapes)
    devices = table.dev_free_milli[table.gpu_start[node]:table.gpu_start[node + 1]]
    gpu = False
    for shape in shapes:
        if shape.whole_gpus:
            gpu = gpu or sum(1 for d in devices if d >= MILLI_PER_GPU) < shape.whole_gpus
        elif shape.fraction_devices:
            need = max(1, shape.fraction_milli)
            gpu = gpu or sum(1 for d in devices if d >= need) < shape.fraction_devices
        elif shape.gpu_memory_mib:
            gpu = True  # device memory: any GPU freed may be what it needs
    return (gpu, table.free_milli_cpu[node] < cpu, table.free_memory_bytes[node] < mem)

