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
- With `rules.queue_limits.LimitsOnThePlan` (kai-es/v10 on) a victim comes back (put back or
  moved) only if its queues stay within their limits with it (KAI re-places a victim through
  the same capacity predicate as any task): a job whose own victim made room under its queue's
  limit does not get that victim back.

Contract: pure; writes only the Session's Plan.
"""

from __future__ import annotations

from typing import Protocol

from kai_es.scheduling.plan import Eviction
from kai_es.scheduling.session import Session
from kai_es.state.model import Job
from kai_es.state.quantities import ZERO


class Replacement(Protocol):
    def settle(self, session: Session, start: int) -> None:
        """Called once a search placed its preemptor with the evictions after checkpoint `start`."""

    def replace_job(self, session: Session, job: Job, ops: list[Eviction]) -> None:
        """Re-place one victim job's evictions `ops` now, as `settle` re-places each job
        (`rules.replacement_order` calls it before the preemptor is placed); nothing for a rule
        that puts no victim back where it runs."""


class EvictVictimsV3:
    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        return None

    def replace_job(self, session: Session, job: Job, ops: list[Eviction]) -> None:
        return None


class MoveVictims:
    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        move_victims(session, start)

    def replace_job(self, session: Session, job: Job, ops: list[Eviction]) -> None:
        return None


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


class ReplaceVictims:
    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        replace_victims(session, start)

    def replace_job(self, session: Session, job: Job, ops: list[Eviction]) -> None:
        _replace_job(session, job, ops, whole_gangs=False)


class ReplaceWholeGangs(ReplaceVictims):
    """`ReplaceVictims` refined (see module docstring)."""

    __slots__ = ()

    def settle(self, session: Session, start: int) -> None:
        replace_victims(session, start, whole_gangs=True)

    def replace_job(self, session: Session, job: Job, ops: list[Eviction]) -> None:
        _replace_job(session, job, ops, whole_gangs=True)


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


def victim_jobs(session: Session, start: int) -> dict[str, list[Eviction]]:
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
    by_job = victim_jobs(session, start)
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
            mask, dynamic = eligibility.mask(pod.spec)
        entry = plan.place_idle(pod.key, pod.spec, mask, away_from=op.node, fixed=not dynamic)
        if entry is None:
            plan.rollback(checkpoint)
            return None
        entry.moved_from = op.node
        moves.append((op, entry.node))
    return moves
