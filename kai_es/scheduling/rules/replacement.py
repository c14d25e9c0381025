"""Re-placement: what becomes of the victims reclaim and preempt found, once the preemptor is
placed; and `relocate`, the re-placement of evicted pods that consolidation shares.

- `EvictVictimsV3` (kai-es/v1 to v3): every victim is evicted.
- `MoveVictims` (kai-es/v4, v5): a victim job whose evicted pods all fit elsewhere on idle
  capacity is moved there instead of evicted (`move_victims`); only the rest are evicted. A
  victim is never put back on the node it runs on.
- `ReplaceVictims` (kai-es/v6 on), KAI's re-placement: once the preemptor is placed, every victim
  is tried again on the Plan with the preemptor placed, victim jobs in job order (queue order,
  then priority, age, uid), each job's surplus pods one at a time and its gang whole: a victim
  that still fits where it runs, on its own devices, stays (its eviction is undone,
  `Plan.unevict`); else one whose pods all fit elsewhere on idle capacity moves (`relocate`);
  only the rest are evicted. Its flaw: a surplus pod put back while its job's gang stays
  evicted leaves a fragment below the job's minimum, running until stalegangeviction takes it
  (an elastic gang with minMember 3 of 4 pods left with 1).
- `ReplaceWholeGangs` (kai-es/v8 on): as `ReplaceVictims`, but a victim job the evictions take
  below its minimum comes back whole or not at all, as KAI re-places a victim job: all its
  evicted pods back where they run, else all moved elsewhere on idle capacity, else it stays
  evicted and so do its pods still running (evicted with it, the reason saying so); a job left
  at its minimum has its surplus pods tried one at a time, as before.
- `ReplaceInAllocationOrder` (kai-es/v12 on): as `ReplaceWholeGangs`, and the victims are
  re-placed in KAI's allocation order *with* the preemptor, not all after it (KAI's
  `TryToVirtuallyAllocatePreemptorAndGetVictims` pops the preemptor and the victim jobs from one
  jobs-by-queues order built once the victims are evicted): before each try to place the
  preemptor, the victim jobs that order takes first — a job of a queue the queue order puts
  first (a queue of higher priority, whatever its share; compared level by level below the
  lowest common ancestor), or of the same queue and first in job order — get their place back
  first (`before_preemptor`), and the preemptor is placed on what is left. So a queue cannot
  reclaim from a queue of higher priority the room that queue's victims would take back (KAI's
  reclaim integration test "reclaim from less prioritized queue", round 2); v8–v11 placed the
  preemptor first and re-placed only what was left over.
- With `rules.queue_limits.LimitsOnThePlan` (kai-es/v10 on) a victim comes back (put back or
  moved) only if its queues stay within their limits with it (KAI re-places a victim through
  the same capacity predicate as any task): a job whose own victim made room under its queue's
  limit does not get that victim back.

Contract: pure; writes only the Session's Plan.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Protocol
from weakref import WeakKeyDictionary

from kai_es.scheduling.plan import Eviction, VerificationError
from kai_es.scheduling.rules.reclaim_victims import sides
from kai_es.scheduling.session import QueueNode, Session
from kai_es.state.model import Job
from kai_es.state.quantities import ZERO, Vector


class Replacement(Protocol):
    def before_preemptor(self, session: Session, start: int, preemptor: Job, request: Vector) -> None:
        """Called before each try to place `preemptor` (requesting `request`), with the
        evictions after checkpoint `start` on the Plan (reclaim and preempt; what it changes, a
        failed try rolls back)."""

    def settle(self, session: Session, start: int) -> None:
        """Called once a search placed its preemptor with the evictions after checkpoint `start`."""

    def failed_search_note(self, session: Session, leaf: QueueNode, victim_queues: Iterable[str]) -> str:
        """What a failed reclaim search for a job of `leaf` adds to its reason, given the queues
        it may take victims from ("" for nothing; the same words for the same queues)."""


class _PreemptorFirst:
    """Nothing is re-placed before the preemptor (kai-es/v1 to v11)."""

    __slots__ = ()

    def before_preemptor(self, session: Session, start: int, preemptor: Job, request: Vector) -> None:
        return None

    def failed_search_note(self, session: Session, leaf: QueueNode, victim_queues: Iterable[str]) -> str:
        return ""


class EvictVictimsV3(_PreemptorFirst):
    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        return None


class MoveVictims(_PreemptorFirst):
    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        move_victims(session, start)


def move_victims(session: Session, start: int) -> None:
    """Of the victims the Plan evicts after checkpoint `start`, each job whose evicted
    pods can all be re-placed (`relocate`) is moved: its pods keep their place in the cluster and
    its queue keeps its allocation; the eviction's reason says where each goes. A job whose pods
    do not all fit is evicted as decided. Jobs in the order of their first eviction."""
    plan, state = session.plan, session.state
    by_job: dict[str, list[Eviction]] = {}
    for op in plan.operations[start:]:
        if isinstance(op, Eviction) and not op.undone:
            by_job.setdefault(state.pods[op.pod_key].job_key, []).append(op)
    for ops in by_job.values():
        _announce_moves(session, relocate(session, ops) or [])


def _announce_moves(session: Session, moves: list[tuple[Eviction, int]]) -> None:
    """Announce each relocated victim as a move (`rules.move_decisions`), its reason saying so."""
    names, announce = session.plan.names, session.rules.move_decisions.announce
    for op, node in moves:
        announce(op, names[node], f"moved from node {names[op.node]} to node {names[node]} instead of evicted: "
                 f"{op.reason}", op.reason)


class ReplaceVictims(_PreemptorFirst):
    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        replace_victims(session, start)


class ReplaceWholeGangs(ReplaceVictims):
    """`ReplaceVictims` refined (see module docstring)."""

    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        replace_victims(session, start, whole_gangs=True)


class ReplaceInAllocationOrder(ReplaceWholeGangs):
    """`ReplaceWholeGangs`, the victims KAI's allocation order takes before the preemptor
    re-placed first (see module docstring)."""

    __slots__ = ()

    def failed_search_note(self, session: Session, leaf: QueueNode, victim_queues: Iterable[str]) -> str:
        """Names the victim queues whose side of the queue tree has a higher priority than the
        job's: their victims get their place back before the job is tried, whatever their
        share, so those queues give it nothing."""
        queues = session.queues
        first = []
        for name in sorted(set(victim_queues)):
            theirs = queues.get(name)
            found = sides(leaf, theirs) if theirs is not None else None
            if found is not None and found[2].priority > found[1].priority:
                first.append(f"{name} (priority {found[2].priority} > {found[1].priority})")
        if not first:
            return ""
        return (f"; the victims of queue{'s' if len(first) > 1 else ''} {', '.join(first)} get their place back "
                f"before it: KAI's allocation order takes a queue of higher priority first")

    def before_preemptor(self, session: Session, start: int, preemptor: Job, request: Vector) -> None:
        by_job = _victim_jobs(session, start)
        if not by_job:
            return
        pods = session.state.pods
        requests = {key: session.request_of([pods[op.pod_key] for op in ops]) for key, ops in by_job.items()}
        for key in popped_before(session, requests, preemptor, request):
            _replace_job(session, session.state.jobs[key], by_job[key], whole_gangs=True)


#: a job in a queue's lane of the allocation order: (job order, job, its request)
_Lane = list[tuple[tuple[object, ...], Job, Vector]]


def popped_before(session: Session, victims: dict[str, Vector], preemptor: Job, request: Vector) -> Iterator[str]:
    """The victim jobs (key -> the request of their evicted pods) that KAI's allocation order
    pops before `preemptor` (requesting `request`), in that order (KAI's jobs-by-queues order
    of `GetJobsToAllocate`: every pending job, the victim jobs and the preemptor). Each queue
    holding a victim or the preemptor is a lane of its jobs in job order — its pending jobs
    ahead of them too, each with the pods it would place now (`PendingAhead`: a queue's head
    decides how the queue compares, even a job that is then passed over); the next pop is the
    lane whose head `allocated_before` puts first. Lazy: the Session's accounting is read at
    each pop, so a victim re-placed before the next is counted. Queues holding neither are left
    out (their pops change nothing; under a common parent KAI would compare it with its best
    job below, which may be theirs)."""
    relevant = {preemptor.key: request, **victims}
    jobs = session.state.jobs
    lanes: dict[str, _Lane] = {}
    for key, wanted in relevant.items():
        job = jobs[key]
        lanes.setdefault(job.queue, []).append((_job_order(job), job, wanted))
    ahead = _ahead(session)
    for name, lane in lanes.items():
        last = max(order for order, _, _ in lane)
        read = ahead.before(session, name, last)
        if session.plan.verify and read != PendingAhead().before(session, name, last):
            raise VerificationError(f"the pending jobs kept for queue {name} differ from a fresh read")
        lane.extend(entry for entry in read if entry[1].key not in relevant)
        lane.sort(key=itemgetter(0))
    heads = dict.fromkeys(lanes, 0)
    while True:
        best: tuple[str, Job, Vector] | None = None
        for name, lane in lanes.items():
            i = heads[name]
            if i < len(lane):
                _, job, wanted = lane[i]
                if best is None or allocated_before(session, job, wanted, best[1], best[2]):
                    best = (name, job, wanted)
        if best is None:
            return
        heads[best[0]] += 1
        key = best[1].key
        if key == preemptor.key:
            return
        if key in victims:
            yield key


class PendingAhead:
    """A queue's pending jobs in job order with the request of the pods each would place now
    (`Session.job_candidate`, pods placed this cycle left out), read from
    `ClusterState.pending_jobs` only as far as asked. What was read holds while the cycle places
    no pod (a search's tries share it); a job with nothing to place is skipped for the rest of
    the cycle (placed pods stay placed), so a queue's placed head jobs are read once."""

    __slots__ = ("placed", "skip", "read")

    def __init__(self) -> None:
        #: len(Session.placed_pods) when `read` was filled
        self.placed = -1
        #: per queue: the index in its pending jobs before which none has anything to place
        self.skip: dict[str, int] = {}
        #: per queue: the entries read (with something to place) and the next index to read
        self.read: dict[str, tuple[_Lane, int]] = {}

    def before(self, session: Session, queue: str, bound: tuple[object, ...]) -> _Lane:
        """The queue's entries whose job order is before `bound`."""
        placed = session.placed_pods
        if len(placed) != self.placed:
            self.placed = len(placed)
            self.read.clear()
        index = session.state.pending_jobs.get(queue)
        if not index:
            return []
        entries, at = self.read.get(queue) or ([], self.skip.get(queue, 0))
        jobs = session.state.jobs
        while (not entries or entries[-1][0] < bound) and at < len(index):
            entry = index[at]
            order = (entry.neg_priority, entry.created_ns, entry.uid, entry.job_key)
            if order >= bound and not entries:
                break
            at += 1
            job = jobs[entry.job_key]
            picked = session.job_candidate(job, exclude=placed)
            if picked is None:
                if not entries:
                    self.skip[queue] = at
                continue
            entries.append((order, job, picked[1]))
        self.read[queue] = (entries, at)
        return entries[:bisect_left(entries, bound, key=itemgetter(0))]


_AHEAD: WeakKeyDictionary[Session, PendingAhead] = WeakKeyDictionary()


def _ahead(session: Session) -> PendingAhead:
    found = _AHEAD.get(session)
    if found is None:
        found = _AHEAD[session] = PendingAhead()
    return found


def _job_order(job: Job) -> tuple[object, ...]:
    """Job order inside one queue (as `ClusterState.pending_jobs`): higher priority, older, uid."""
    return (-job.priority, job.created_ns, job.uid, job.key)


def allocated_before(session: Session, job: Job, request: Vector, other: Job, other_request: Vector) -> bool:
    """Whether KAI's allocation order takes `job` (requesting `request`) before `other`: down
    the queue tree, the queue order of the two siblings below their lowest common ancestor
    (`Session.key` with each job as its queue's candidate, on the Session's accounting now); in
    one queue, job order. A job whose queue the Session does not know comes after."""
    mine, theirs = session.queues.get(job.queue), session.queues.get(other.queue)
    if mine is None or theirs is None:
        return False
    if mine is theirs:
        return _job_order(job) < _job_order(other)
    for a, b in zip(mine.chain[::-1], theirs.chain[::-1]):
        if a is not b:
            return session.key(a, request) < session.key(b, other_request)
    return False  # (a leaf is never another's ancestor)


def _put_back(session: Session, ops: list[Eviction]) -> bool:
    """Undo the evictions `ops` together, else move all their pods elsewhere (`relocate`);
    False, with the Plan as before, when neither can be done."""
    plan = session.plan
    # kai-es/v10 (`rules.queue_limits`): a victim back on the Plan must fit its queues' limits
    # (wherever it lands: a move gives back what it took too)
    fits = session.rules.queue_limits.victim_fits
    checkpoint = plan.checkpoint()
    if all(plan.unevict(op) for op in ops):
        if fits(session, ops):
            return True
        plan.rollback(checkpoint)
        return False
    plan.rollback(checkpoint)
    moves = relocate(session, ops)
    if moves is None:
        return False
    if not fits(session, ops):
        plan.rollback(checkpoint)
        return False
    _announce_moves(session, moves)
    return True


def _evict_the_rest(session: Session, job: Job, ops: list[Eviction]) -> None:
    """`job` stays below its minimum: its pods still running are evicted with it."""
    plan, pods = session.plan, session.state.pods
    first = ops[0]
    for key in sorted(job.members):
        pod = pods[key]
        if pod.status in ("Running", "Binding") and key not in plan.evicted_pods and pod.node in plan.node_index:
            plan.evict(key, first.action, first.preemptor,
                       f"{first.reason}; job {job.key} is left below its minimum of {job.min_member} pods, "
                       f"so its other running pods go with it", dict(first.numbers))


def _victim_jobs(session: Session, start: int) -> dict[str, list[Eviction]]:
    """The evictions after checkpoint `start` that stand, by job, in the order of the first."""
    state = session.state
    by_job: dict[str, list[Eviction]] = {}
    for op in session.plan.operations[start:]:
        if isinstance(op, Eviction) and not op.undone:
            by_job.setdefault(state.pods[op.pod_key].job_key, []).append(op)
    return by_job


def replace_victims(session: Session, start: int, whole_gangs: bool = False) -> None:
    """`ReplaceVictims` (see module docstring): of the evictions after checkpoint `start`, undo
    those whose pods fit back where they run, move those that fit elsewhere, keep the rest;
    `whole_gangs` (`ReplaceWholeGangs`): a job taken below its minimum comes back whole or its
    remaining pods go too."""
    state, queues = session.state, session.queues
    by_job = _victim_jobs(session, start)
    if not by_job:
        return

    queue_keys: dict[str, tuple[object, ...]] = {}

    def job_order(key: str) -> tuple[object, ...]:
        job = state.jobs[key]
        found = queue_keys.get(job.queue)
        if found is None:
            leaf = queues.get(job.queue)
            found = queue_keys[job.queue] = session.key(leaf, ZERO) if leaf is not None else ()
        return (found, -job.priority, job.created_ns, job.uid, key)

    for key in sorted(by_job, key=job_order):
        _replace_job(session, state.jobs[key], by_job[key], whole_gangs)


def _replace_job(session: Session, job: Job, ops: list[Eviction], whole_gangs: bool) -> None:
    """Re-place one victim job's evictions `ops` (see `replace_victims`)."""
    if whole_gangs:
        if len(session.rules.elastic_surplus.held(session, job)) < job.min_member:
            if not _put_back(session, ops):
                _evict_the_rest(session, job, ops)
            return
        for op in ops:
            _put_back(session, [op])
        return
    # the job's surplus pods (evicted first, one by one), then its gang as one
    surplus = max(0, job.occupying - job.min_member)
    units = [[op] for op in ops[:surplus]]
    if ops[surplus:]:
        units.append(ops[surplus:])
    for unit in units:
        _put_back(session, unit)


def relocate(session: Session, ops: list[Eviction]) -> list[tuple[Eviction, int]] | None:
    """Re-place every pod the evictions `ops` take, largest request first, on idle capacity of
    another node (`Plan.place_idle`: never the node it leaves, never capacity a pipelined pod
    waits for, within its eligibility; its preferences are not weighed), each placement an
    `Entry` with `moved_from` set; kai-es/v5: within its topology domains, `TopologyPlacer.home`).
    Returns (eviction, node it moves to) per pod, or None with the
    Plan as it was when one pod fits nowhere. A shape that fit no idle capacity once is not
    tried again in the cycle (`Session.idle_fits`): idle capacity only shrinks as operations are
    committed (a rollback only undoes later, tentative ones)."""
    plan, state, eligibility, topology = session.plan, session.state, session.eligibility, session.topology
    # kai-es/v5: a moved pod of a job with a required topology constraint stays in its domain
    homes = {op.pod_key: topology.home(state.pods[op.pod_key]) for op in ops} if topology is not None else None
    for op in ops:
        spec = state.pods[op.pod_key].spec
        with eligibility.restricted(homes[op.pod_key] if homes is not None else eligibility.restriction):
            shape, mask = plan.shape(spec), eligibility.static_mask(spec)
        key = (id(shape), id(mask))
        if key not in session.idle_fits:
            session.idle_fits[key] = plan.packer.place(plan.idle, shape, plan.strategy, mask).placed
        if not session.idle_fits[key]:
            return None
    checkpoint = plan.checkpoint()
    moves: list[tuple[Eviction, int]] = []
    for op in sorted(ops, key=lambda o: (-state.pods[o.pod_key].milli_gpu, -state.pods[o.pod_key].spec.requests.milli_cpu,
                                         -state.pods[o.pod_key].spec.requests.memory_bytes, o.pod_key)):
        pod = state.pods[op.pod_key]
        with eligibility.restricted(homes[op.pod_key] if homes is not None else eligibility.restriction):
            mask, _ = eligibility.mask(pod.spec)
        elsewhere = mask[:]
        elsewhere[op.node] = 0
        entry = plan.place_idle(pod.key, pod.spec, elsewhere)
        if entry is None:
            plan.rollback(checkpoint)
            return None
        entry.moved_from = op.node
        moves.append((op, entry.node))
    return moves
