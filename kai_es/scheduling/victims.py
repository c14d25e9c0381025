"""The victim search shared by consolidation, reclaim and preempt: on the Plan, evict victims in
the order the action gives (reclaim and preempt: cheapest first; consolidation: node by node)
until the preemptor's pods fit, then keep only the victims whose nodes the preemptor uses.

Contract:
- Victims come in *units*: an elastic job above its minimum offers its surplus pods one at a
  time (in the version's victim order, `rules.victim_order`); a job at its minimum offers all its occupying pods as one unit (a gang
  loses all its pods or none — but with `whole_units=False`, consolidation's, whose victims are
  re-placed, only the pods of a unit that are in the way are kept); a semi-preemptible job
  whose core is kept (`rules.semi_preemptible`) offers only its extras, one pod at a time, never
  the pods of its minimum shape; and (kai-es/v8 on) a job's occupying pods leave out those the
  Plan evicted already, so an earlier action's victims do not count towards its surplus again.
  Units are ordered cheapest
  first (`keyed_units`): lower job priority, newer job, then uid, then pod key.
- `admit(unit)` (the action's rule, evaluated on the Plan's current accounting) decides whether
  a unit may be taken; the search never takes a unit it refuses.
- The preemptor is placed whole or nothing happens: on failure every eviction and placement of
  the attempt is rolled back (`Plan.rollback`), so the Plan is exactly as before.
- Effort is bounded by counts, never by time (replay stays exact): at most `MAX_VICTIM_PODS`
  pods evicted per attempt and `MAX_PLACEMENT_TRIES` placement tries; a try is made only once the
  evicted capacity (kai-es/v4: with the free capacity) adds up to at least what the preemptor
  requests, and (kai-es/v4) the last eviction left a node able to take one of its tasks.
- kai-es/v3 bounds the search per node first (`RoomBound`): only units with a pod on a node
  where evicting every eligible victim could make room for the preemptor are taken, and only
  what they free there counts; and a job whose eviction the binder refused recently
  (`EVICTION_REFUSED_BACKOFF_NS`, by the log's times) offers no unit.
- Pure: reads the state, writes only the Plan.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence

import msgspec

from kai_es.scheduling.packing import TaskShape
from kai_es.scheduling.packing.model import MILLI_PER_GPU, ArrayPackTable
from kai_es.scheduling.plan import Announced, Entry, Eviction
from kai_es.scheduling.gang import surplus as semi_surplus
from kai_es.scheduling.session import Session
from kai_es.state.model import Job, PodState
from kai_es.state.quantities import Vector

MAX_VICTIM_PODS = 20_000
MAX_PLACEMENT_TRIES = 64
#: how long after the binder refused to evict one of its pods a job is not a victim (kai-es/v3)
EVICTION_REFUSED_BACKOFF_NS = 60 * 1_000_000_000


class Unit(msgspec.Struct, frozen=True, gc=False):
    """Pods that are evicted together, and the job they belong to. (A msgspec Struct: every
    preempting action builds the units of each victim job it looks at, and a Struct is several
    times cheaper to construct than a frozen dataclass. It holds no reference back to itself.)"""

    job: Job
    pods: tuple[PodState, ...]
    #: pods above the job's minimum (an elastic job's extra), not the gang itself
    surplus: bool = False

    @property
    def request(self) -> Vector:
        gpu = cpu = mem = 0
        for pod in self.pods:
            gpu += pod.milli_gpu
            cpu += pod.spec.requests.milli_cpu
            mem += pod.spec.requests.memory_bytes
        return (gpu, cpu, mem)


def units_of(session: Session, jobs: Sequence[Job]) -> list[Unit]:
    """The victim units of `jobs`, cheapest first (see module docstring). Only pods occupying a
    known node and not already releasing, and not placed by this plan, are offered."""
    return [unit for _, unit in keyed_units(session, jobs)]


def job_order(job: Job) -> tuple[int, int, str]:
    """Where a job's units stand in the victim order, before its own pods' order: lower
    priority, then newer, then uid (every unit key starts with it)."""
    return (job.priority, -job.created_ns, job.uid)


def keyed_units(session: Session, jobs: Iterable[Job], backoff: bool = False
                ) -> list[tuple[tuple[object, ...], Unit]]:
    """`units_of` with each unit's order key (units of any jobs merge cheapest first by it).
    With `backoff` (kai-es/v3), a job with a pod whose eviction the binder refused less than
    `EVICTION_REFUSED_BACKOFF_NS` ago (by the log's times) offers no unit: it is not a victim
    again every cycle while the cluster keeps refusing."""
    state, evicted = session.state, session.plan.evicted_pods
    now = session.now_ns
    order = session.rules.victim_order.order
    keeps_core = session.keeps_core
    elastic = session.rules.elastic_surplus
    out: list[tuple[tuple[object, ...], Unit]] = []
    for job in jobs:
        pods = [state.pods[k] for k in sorted(job.members)]
        running = [pod for pod in pods if pod.status in ("Running", "Binding") and pod.node in state.nodes
                   and pod.key not in evicted]
        if not running:
            continue
        if backoff and any(pod.eviction_refused_ns and now < pod.eviction_refused_ns + EVICTION_REFUSED_BACKOFF_NS
                           for pod in pods):
            continue
        newest_first = order(running)  # the version's victim order: the first to go first
        base = job_order(job)
        # kai-es/v8 on: without the pods this Plan evicted already (an earlier action's victims),
        # so its surplus is not offered twice
        held = session.occupying_on_plan(job)
        if job.semi and keeps_core:
            for i, pod in enumerate(semi_surplus(job, newest_first, held)):
                out.append(((*base, 0, i, pod.key), Unit(job, (pod,), surplus=True)))
            continue
        extra, rest = elastic.split(session, job, newest_first, held)
        for i, pod in enumerate(extra):
            out.append(((*base, 0, i, pod.key), Unit(job, (pod,), surplus=True)))
        if rest:
            out.append(((*base, 1, 0, rest[0].key), Unit(job, tuple(rest))))
    out.sort(key=lambda item: item[0])
    return out


class SharedBuckets:
    """The victim units of `state.victim_jobs`' (queue, priority) buckets, shared by the actions
    of one cycle (a Plan listener, made by the first action that needs it: `shared(session)`).
    A bucket's units (`keyed_units` with the back-off) depend only on the state, the cycle and
    the Plan's operations on its jobs' pods, so while no operation has touched one of its jobs
    since they were built, building them again gives the same list: preempt reuses what reclaim
    built for the buckets reclaim left alone, instead of every running job's units twice a cycle."""

    def __init__(self, session: Session) -> None:
        self.state = session.state
        self.seq = 0
        #: job key -> the number of the last Plan operation on one of its pods
        self.touched: dict[str, int] = {}
        self.built: dict[tuple[str, int], tuple[int, list[tuple[tuple[object, ...], Unit]]]] = {}
        session.plan.listeners.append(self)

    def on_operation(self, op: Announced, sign: int) -> None:
        self.seq += 1
        pod = self.state.pods.get(op.pod_key)
        if pod is not None:
            self.touched[pod.job_key] = self.seq

    def units(self, session: Session, bucket: tuple[str, int], members: Sequence[Job]
              ) -> list[tuple[tuple[object, ...], Unit]]:
        """`keyed_units(session, members, backoff=True)` of the bucket's `members`."""
        found = self.built.get(bucket)
        if found is not None:
            at, units = found
            touched = self.touched
            if all(touched.get(job.key, 0) <= at for job in members):
                return units
        units = keyed_units(session, members, backoff=True)
        self.built[bucket] = (self.seq, units)
        return units


def shared(session: Session) -> SharedBuckets:
    if session.shared_buckets is None:
        session.shared_buckets = SharedBuckets(session)
    return session.shared_buckets


class RoomBound:
    """The per-node bound on a victim search, kept for one action (a Plan listener: `close`
    when the action ends).

    For a set of victim buckets and a task (its shape and a superset of its eligible nodes), a
    node *has room* when it is eligible and its capacity free once released (the Plan's
    `future` table) plus what the buckets' victim pods on it hold (those this Plan has not
    evicted already) covers the task's CPU, memory and a pod slot, and enough of its devices
    would have the share the task needs on each. It is a necessary condition for the task to
    land there whatever subset of those victims is evicted (devices and predicates beyond the
    mask are the packer's to check), so a search restricted to these nodes loses no placement.

    The answer per (buckets, shape, mask) is computed over every node once, then brought up to
    date only on the nodes the Plan's operations (and their rollbacks) touched since: the cost
    per preemptor is what changed, not the cluster."""

    def __init__(self, session: Session) -> None:
        self.plan = session.plan
        self.touched: list[int] = []
        self._victims: dict[tuple[tuple[str, int], ...], dict[int, list[PodState]]] = {}
        self._rooms: dict[tuple[object, ...], tuple[set[int], int]] = {}
        self._masks: list[array[int]] = []  # keeps the masks whose ids key `_rooms` alive
        self.plan.listeners.append(self)

    def on_operation(self, op: Announced, sign: int) -> None:
        self.touched.append(op.node)

    def close(self) -> None:
        self.plan.listeners.remove(self)

    def nodes(self, buckets: tuple[tuple[str, int], ...], units: Callable[[], Iterable[Unit]],
              shapes: Sequence[tuple[TaskShape, array[int]]]) -> set[int] | None:
        """The nodes with room for at least one task (`units()` gives the buckets' victim units;
        called once per bucket set), or None when some task has room on no node. The set
        returned is the bound's own: read it, do not change it."""
        victims = self._victims.get(buckets)
        if victims is None:
            victims = self._victims[buckets] = {}
            index = self.plan.node_index
            for unit in units():
                for pod in unit.pods:
                    victims.setdefault(index[pod.node], []).append(pod)
        out: set[int] = set()
        for shape, mask in shapes:
            key = (buckets, id(shape), id(mask))
            known = self._rooms.get(key)
            if known is None:
                self._masks.append(mask)
                room = {n for n in range(len(mask)) if mask[n] and self._has_room(n, shape, victims)}
            else:
                room, seen = known
                for n in dict.fromkeys(self.touched[seen:]):  # each touched node once, in order
                    if mask[n] and self._has_room(n, shape, victims):
                        room.add(n)
                    else:
                        room.discard(n)
            self._rooms[key] = (room, len(self.touched))
            if not room:
                return None
            if len(shapes) == 1:
                return room
            out |= room
        return out

    def _has_room(self, node: int, shape: TaskShape, victims: dict[int, list[PodState]]) -> bool:
        table = self.plan.future
        evicted = self.plan.evicted_pods
        cpu = mem = slots = 0
        freed_dev: dict[int, int] = {}
        base = table.gpu_start[node]
        for pod in victims.get(node, ()):
            if pod.key in evicted:
                continue  # its capacity is in the table already
            requests = pod.spec.requests
            cpu += requests.milli_cpu
            mem += requests.memory_bytes
            slots += 1
            for d in pod.devices:
                freed_dev[base + d] = freed_dev.get(base + d, 0) + pod.device_milli
        return room(table, node, shape, cpu, mem, slots, freed_dev)


def room(table: ArrayPackTable, node: int, shape: TaskShape, cpu: int = 0, mem: int = 0, slots: int = 0,
         freed_dev: dict[int, int] | None = None) -> bool:
    """Whether `node` of `table`, with `cpu`, `mem`, `slots` and device shares `freed_dev` more
    free, has the CPU, memory, a pod slot and enough devices with the share `shape` needs."""
    freed_dev = freed_dev or {}
    if table.free_milli_cpu[node] + cpu < shape.milli_cpu or \
            table.free_memory_bytes[node] + mem < shape.memory_bytes or table.free_pods[node] + slots < 1:
        return False
    if shape.whole_gpus:
        need, devices = MILLI_PER_GPU, shape.whole_gpus
    elif shape.fraction_devices:
        need, devices = max(1, shape.fraction_milli), shape.fraction_devices
    else:
        return True
    free = table.dev_free_milli
    have = 0
    for d in range(table.gpu_start[node], table.gpu_start[node + 1]):
        if free[d] + freed_dev.get(d, 0) >= need:
            have += 1
    return have >= devices


Placer = Callable[[], list[Entry] | None]


def search(session: Session, units: Iterable[Unit], admit: Callable[[Unit], bool],
           request: Vector, place: Placer, action: str, preemptor: str,
           reason: Callable[[Unit], tuple[str, dict[str, int]]],
           on_nodes: set[int] | None = None, free: Callable[[], Vector] | None = None,
           whole_units: bool = True, fits_on: Callable[[int], bool] | None = None) -> list[Eviction] | None:
    """Evict admitted units cheapest first until `place()` succeeds (it must place the whole
    preemptor on the Plan, or roll its own placements back and return None). Returns the
    evictions kept, or None with the Plan unchanged. With `on_nodes` (the per-node bound,
    `room_nodes`) only units with a pod on one of those nodes are taken, and only what they
    free there counts towards the request. `free` (kai-es/v4: `free_capacity` on those nodes;
    asked at most once, and only when what the victims free falls short) is capacity free
    already that counts towards it too, so that a preemptor needing some of it and a few
    victims is tried as soon as they are evicted. `whole_units=False` (consolidation, whose
    victims are re-placed, so a gang keeps its members) keeps, of the units chosen, only the
    pods on nodes the preemptor uses: the others stay where they run. `fits_on(node)` (kai-es/v4)
    says whether one of the preemptor's tasks could now fit `node`: a placement is tried only
    after an eviction that leaves a node it touched able to take one (the only nodes whose
    capacity it changed), so victims spread over many nodes do not use up the tries before one
    node is free enough."""
    plan = session.plan
    start = plan.checkpoint()
    freed: Vector = (0, 0, 0)
    evicted_pods = 0
    tries = 0
    chosen: list[Unit] = []
    index = plan.node_index
    already: Vector | None = None
    for unit in units:
        if evicted_pods + len(unit.pods) > MAX_VICTIM_PODS or tries >= MAX_PLACEMENT_TRIES:
            break
        if on_nodes is not None and not any(index[pod.node] in on_nodes for pod in unit.pods):
            continue
        if not admit(unit):
            continue
        _evict_all(session, [unit], action, preemptor, reason)
        chosen.append(unit)
        evicted_pods += len(unit.pods)
        r = unit.request if on_nodes is None else Unit(unit.job, tuple(
            pod for pod in unit.pods if index[pod.node] in on_nodes)).request
        freed = (freed[0] + r[0], freed[1] + r[1], freed[2] + r[2])
        if any(need > got for need, got in zip(request, freed)):
            if free is None:
                continue
            if already is None:
                already = free()
            if any(need > got + have for need, got, have in zip(request, freed, already)):
                continue
        if fits_on is not None and not any(fits_on(index[pod.node]) for pod in unit.pods):
            continue
        tries += 1
        entries = place()
        if entries is None:
            continue
        return _keep_needed(session, start, chosen, entries, place, action, preemptor, reason, whole_units)
    plan.rollback(start)
    return None


def free_capacity(session: Session, nodes: Iterable[int] | None) -> Vector:
    """The capacity free once released (the Plan's `future` table) on `nodes` (None: all):
    GPU as the sum of every device's free share, so an upper bound of what a task can use."""
    gpu = cpu = mem = 0
    for g, c, m in free_of_each(session.plan.future, nodes):
        gpu, cpu, mem = gpu + g, cpu + c, mem + m
    return (gpu, cpu, mem)


def free_of_each(table: ArrayPackTable, nodes: Iterable[int] | None) -> Iterator[Vector]:
    """Each node's free capacity once released in `table` (a `future` table), as
    `free_capacity` counts it (negative free shares, CPU and memory of an over-committed node
    count as none)."""
    start = table.gpu_start
    dev, cpus, mems = table.dev_free_milli, table.free_milli_cpu, table.free_memory_bytes
    for n in (range(len(table.free_pods)) if nodes is None else nodes):
        devices = dev[start[n]:start[n + 1]]
        gpu = (sum(devices) if min(devices) >= 0 else sum(d for d in devices if d > 0)) if devices else 0
        cpu, mem = cpus[n], mems[n]
        yield gpu, cpu if cpu > 0 else 0, mem if mem > 0 else 0


def _keep_needed(session: Session, start: int, chosen: list[Unit], entries: list[Entry], place: Placer,
                 action: str, preemptor: str, reason: Callable[[Unit], tuple[str, dict[str, int]]],
                 whole_units: bool = True) -> list[Eviction]:
    """Victims on nodes the preemptor did not land on were not needed: try again without them
    (same order) — without such units, or with `whole_units=False` without such pods; keep the
    smaller set if the preemptor still fits, else the first one."""
    plan = session.plan
    used = {e.node for e in entries}
    index = plan.node_index
    if whole_units:
        needed = [u for u in chosen if any(index[p.node] in used for p in u.pods)]
    else:
        needed = [Unit(u.job, kept, u.surplus) for u in chosen
                  if (kept := tuple(p for p in u.pods if index[p.node] in used))]
    if sum(len(u.pods) for u in needed) < sum(len(u.pods) for u in chosen):
        plan.rollback(start)
        _evict_all(session, needed, action, preemptor, reason)
        if place() is None:
            plan.rollback(start)
            _evict_all(session, chosen, action, preemptor, reason)
            again = place()
            assert again is not None, "a placement that fitted must fit again on the same plan"
    return [op for op in plan.operations[start:] if isinstance(op, Eviction) and not op.undone]


def _evict_all(session: Session, units: Sequence[Unit], action: str, preemptor: str,
               reason: Callable[[Unit], tuple[str, dict[str, int]]]) -> None:
    for unit in units:
        why, numbers = reason(unit)
        for pod in unit.pods:
            session.plan.evict(pod.key, action, preemptor, why, numbers)
