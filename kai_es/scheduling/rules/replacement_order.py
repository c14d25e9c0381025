"""Replacement order: when, during a victim search of reclaim and preempt, the victims get their
place back — all after the preemptor is placed (`rules.replacement.settle`), or some before it.

- `PreemptorFirstV11` (kai-es/v1 to v11): nothing before; the preemptor is placed on the room
  its victims made, and the re-placement rule then puts back what still fits.
- `InAllocationOrder` (kai-es/v12 on), KAI's `TryToVirtuallyAllocatePreemptorAndGetVictims`,
  which pops the preemptor and its victim jobs from one jobs-by-queues order (`GetJobsToAllocate`:
  every pending job, the victims and the preemptor) built once the victims are evicted: before
  each try to place the preemptor, the victim jobs that order takes first get their place back
  first (`popped_before`; each through the re-placement rule's `replace_job`: under
  `ReplaceWholeGangs` a gang comes back whole or not at all), and the preemptor is placed on
  what is left. A victim of a queue the queue order puts first — a queue of higher priority,
  whatever its share; a queue whose own head job, pending or victim, compares better — is
  such a job, compared level by level below the lowest common ancestor. So a queue cannot
  reclaim from a queue of higher priority the room that queue's victims take back (KAI's
  reclaim integration tests "... reclaim from less prioritized queue", round 2, and "queue0 is
  over quota, queue1 is under quota, yet we don't reclaim ..."), and a failed reclaim search
  says so (`failed_search_note`). Consolidation is not concerned: every victim it takes is
  moved, after its preemptor.

Contract: pure; `before_preemptor` writes only the Session's Plan (what it puts back, a failed
try rolls back with the preemptor's placements); `failed_search_note` reads.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Protocol
from weakref import WeakKeyDictionary

from kai_es.scheduling.plan import VerificationError
from kai_es.scheduling.rules.reclaim_victims import sides
from kai_es.scheduling.rules.replacement import victim_jobs
from kai_es.scheduling.session import QueueNode, Session
from kai_es.state.keys import PendingJob
from kai_es.state.model import Job
from kai_es.state.quantities import Vector


class ReplacementOrder(Protocol):
    def before_preemptor(self, session: Session, start: int, preemptor: Job, request: Vector) -> None:
        """Called before each try to place `preemptor` (requesting `request`), with the
        evictions after checkpoint `start` on the Plan (reclaim and preempt)."""

    def failed_search_note(self, session: Session, leaf: QueueNode,
                           victim_queues: Callable[[], Iterable[str]]) -> str:
        """What a failed reclaim search for a job of `leaf` adds to its reason, given the queues
        it may take victims from (asked only when needed); "" for nothing, the same words for
        the same queues."""


class PreemptorFirstV11:
    __slots__ = ()

    def before_preemptor(self, session: Session, start: int, preemptor: Job, request: Vector) -> None:
        return None

    def failed_search_note(self, session: Session, leaf: QueueNode,
                           victim_queues: Callable[[], Iterable[str]]) -> str:
        return ""


class InAllocationOrder:
    __slots__ = ()

    def before_preemptor(self, session: Session, start: int, preemptor: Job, request: Vector) -> None:
        by_job = victim_jobs(session, start)
        if not by_job:
            return
        pods, jobs, replace_job = session.state.pods, session.state.jobs, session.rules.replacement.replace_job
        requests = {key: session.request_of([pods[op.pod_key] for op in ops]) for key, ops in by_job.items()}
        for key in popped_before(session, requests, preemptor, request):
            replace_job(session, jobs[key], by_job[key])

    def failed_search_note(self, session: Session, leaf: QueueNode,
                           victim_queues: Callable[[], Iterable[str]]) -> str:
        """Names the victim queues whose side of the queue tree has a higher priority than the
        job's: their victims get their place back before the job is tried, whatever their
        share, so those queues give it nothing."""
        queues = session.queues
        first = []
        for name in sorted(set(victim_queues())):
            theirs = queues.get(name)
            found = sides(leaf, theirs) if theirs is not None else None
            if found is not None and found[2].priority > found[1].priority:
                first.append(f"{name} (priority {found[2].priority} > {found[1].priority})")
        if not first:
            return ""
        return (f"; the victims of queue{'s' if len(first) > 1 else ''} {', '.join(first)} get their place back "
                f"before it: KAI's allocation order takes a queue of higher priority first")


#: a job in a queue's lane of the allocation order: (job order, job, its request)
_Lane = list[tuple[PendingJob, Job, Vector]]


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
    job below, which may be theirs). In the preemptor's own queue nothing after it in job
    order pops before it: its lane ends there."""
    relevant = {preemptor.key: request, **victims}
    jobs = session.state.jobs
    lanes: dict[str, _Lane] = {}
    own = _job_order(preemptor)
    for key, wanted in relevant.items():
        job = jobs[key]
        order = _job_order(job)
        # (a victim of a queue the Session does not know waits; one after the preemptor in its
        # own queue comes after it)
        if job.queue in session.queues and (job.queue != preemptor.queue or order <= own):
            lanes.setdefault(job.queue, []).append((order, job, wanted))
    ahead = _ahead(session)
    for name, lane in lanes.items():
        last = own if name == preemptor.queue else max(order for order, _, _ in lane)
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
    (`Session.job_candidate`: pods placed this cycle left out, the gang minimum counted on the
    Plan), read from `ClusterState.pending_jobs` only as far as asked, so a search's tries share
    what was read. An entry holds while the cycle places no pod and, as its minimum counts the
    job's occupying pods on the Plan, while none of the job's pods is evicted on the Plan then or
    now (it is read again otherwise). A job with no pod left to place is skipped for the rest of
    the cycle (placed pods stay placed), so a queue's placed head jobs are read once."""

    __slots__ = ("placed", "skip", "read")

    def __init__(self) -> None:
        #: len(Session.placed_pods) when `read` was filled
        self.placed = -1
        #: per queue: the index in its pending jobs before which none has a pod left to place
        self.skip: dict[str, int] = {}
        #: per queue: the entries read and the next index to read
        self.read: dict[str, tuple[list[_Read], int]] = {}

    def before(self, session: Session, queue: str, bound: PendingJob) -> _Lane:
        """The queue's jobs with something to place now whose job order is before `bound`."""
        placed = session.placed_pods
        if len(placed) != self.placed:
            self.placed = len(placed)
            self.read.clear()
        index = session.state.pending_jobs.get(queue)
        if not index:
            return []
        entries, at = self.read.get(queue) or ([], self.skip.get(queue, 0))
        evicted = session.plan.evicted_pods
        for i, (order, job, _, clean) in enumerate(entries):
            if order >= bound:
                break
            if not clean or (evicted and _touched(job, evicted)):
                entries[i] = _read(session, order, job)
        jobs = session.state.jobs
        while (not entries or entries[-1][0] < bound) and at < len(index):
            order = index[at]  # (the index's own entry is the job order)
            if order >= bound and not entries:
                break
            at += 1
            job = jobs[order.job_key]
            if all(pending.pod_key in placed for pending in job.pending):
                if not entries:
                    self.skip[queue] = at
                continue
            entries.append(_read(session, order, job))
        self.read[queue] = (entries, at)
        upto = bisect_left(entries, bound, key=itemgetter(0))
        return [(order, job, request) for order, job, request, _ in entries[:upto] if request is not None]


#: an entry read: (job order, job, the request of what it would place now or None, whether
#: none of its pods was evicted on the Plan when it was read)
_Read = tuple[PendingJob, Job, Vector | None, bool]


def _read(session: Session, order: PendingJob, job: Job) -> _Read:
    picked = session.job_candidate(job, exclude=session.placed_pods)
    evicted = session.plan.evicted_pods
    return (order, job, picked[1] if picked is not None else None, not (evicted and _touched(job, evicted)))


def _touched(job: Job, evicted: set[str]) -> bool:
    """Whether a pod of `job` is among `evicted`."""
    members = job.members
    if len(members) > len(evicted):
        return any(key in members for key in evicted)
    return any(key in evicted for key in members)


_AHEAD: WeakKeyDictionary[Session, PendingAhead] = WeakKeyDictionary()


def _ahead(session: Session) -> PendingAhead:
    found = _AHEAD.get(session)
    if found is None:
        found = _AHEAD[session] = PendingAhead()
    return found


def _job_order(job: Job) -> PendingJob:
    """Job order inside one queue: the job's entry in `ClusterState.pending_jobs` (higher
    priority, older, uid), made for a job that is not pending too."""
    return PendingJob(-job.priority, job.created_ns, job.uid, job.queue, job.key)


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
