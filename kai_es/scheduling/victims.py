"""The victim search shared by reclaim and preempt (and, later, consolidation): on the Plan, evict
the cheapest victims first until the preemptor's pods fit, then keep only the victims whose
nodes the preemptor uses.

Contract:
- Victims come in *units*: an elastic job above its minimum offers its surplus pods one at a
  time (newest first); a job at its minimum offers all its occupying pods as one unit (a gang
  loses all its pods or none). Units are ordered cheapest first: lower job priority, newer job,
  then uid, then pod key.
- `admit(unit)` (the action's rule, evaluated on the Plan's current accounting) decides whether
  a unit may be taken; the search never takes a unit it refuses.
- The preemptor is placed whole or nothing happens: on failure every eviction and placement of
  the attempt is rolled back (`Plan.rollback`), so the Plan is exactly as before.
- Effort is bounded by counts, never by time (replay stays exact): at most `MAX_VICTIM_PODS`
  pods evicted per attempt and `MAX_PLACEMENT_TRIES` placement tries; a try is made only once the
  evicted capacity adds up to at least what the preemptor requests.
- Pure: reads the state, writes only the Plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kai_es.scheduling.plan import Entry, Eviction
from kai_es.scheduling.session import Session, Vector
from kai_es.state.model import Job, PodState

MAX_VICTIM_PODS = 20_000
MAX_PLACEMENT_TRIES = 64


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods that are evicted together, and the job they belong to."""

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
    state, evicted = session.state, session.plan.evicted_pods
    out: list[tuple[tuple[object, ...], Unit]] = []
    for job in jobs:
        pods = [state.pods[k] for k in sorted(job.members)]
        running = [pod for pod in pods if pod.status in ("Running", "Binding") and pod.node in state.nodes
                   and pod.key not in evicted]
        if not running:
            continue
        occupying = sum(1 for pod in pods if pod.status in ("Running", "Binding", "Releasing"))
        surplus = occupying - job.min_member
        newest_first = sorted(running, key=lambda pod: (-pod.spec.created_ns, pod.key))
        base = (job.priority, -job.created_ns, job.uid)
        if surplus > 0:
            for i, pod in enumerate(newest_first[:surplus]):
                out.append(((*base, 0, i, pod.key), Unit(job, (pod,), surplus=True)))
            rest = newest_first[surplus:]
            if rest:
                out.append(((*base, 1, 0, rest[0].key), Unit(job, tuple(rest))))
        else:
            out.append(((*base, 1, 0, newest_first[0].key), Unit(job, tuple(newest_first))))
    out.sort(key=lambda item: item[0])
    return [unit for _, unit in out]


Placer = Callable[[], list[Entry] | None]


def search(session: Session, units: Iterable[Unit], admit: Callable[[Unit], bool],
           request: Vector, place: Placer, action: str, preemptor: str,
           reason: Callable[[Unit], tuple[str, dict[str, int]]]) -> list[Eviction] | None:
    """Evict admitted units cheapest first until `place()` succeeds (it must place the whole
    preemptor on the Plan, or roll its own placements back and return None). Returns the
    evictions kept, or None with the Plan unchanged."""
    plan = session.plan
    start = plan.checkpoint()
    freed: Vector = (0, 0, 0)
    evicted_pods = 0
    tries = 0
    chosen: list[Unit] = []
    for unit in units:
        if evicted_pods + len(unit.pods) > MAX_VICTIM_PODS or tries >= MAX_PLACEMENT_TRIES:
            break
        if not admit(unit):
            continue
        _evict_all(session, [unit], action, preemptor, reason)
        chosen.append(unit)
        evicted_pods += len(unit.pods)
        r = unit.request
        freed = (freed[0] + r[0], freed[1] + r[1], freed[2] + r[2])
        if any(need > got for need, got in zip(request, freed)):
            continue
        tries += 1
        entries = place()
        if entries is None:
            continue
        return _keep_needed(session, start, chosen, entries, place, action, preemptor, reason)
    plan.rollback(start)
    return None


def _keep_needed(session: Session, start: int, chosen: list[Unit], entries: list[Entry], place: Placer,
                 action: str, preemptor: str, reason: Callable[[Unit], tuple[str, dict[str, int]]]
                 ) -> list[Eviction]:
    """Victims on nodes the preemptor did not land on were not needed: try again without them
    (same order); keep the smaller set if the preemptor still fits, else the first one."""
    plan = session.plan
    used = {e.node for e in entries}
    index = plan.node_index
    needed = [u for u in chosen if any(index[p.node] in used for p in u.pods)]
    if len(needed) < len(chosen):
        plan.rollback(start)
        _evict_all(session, needed, action, preemptor, reason)
        if place() is None:
            plan.rollback(start)
            _evict_all(session, chosen, action, preemptor, reason)
            again = place()
            assert again is not None, "a placement that fitted must fit again on the same plan"
    return [op for op in plan.operations[start:] if isinstance(op, Eviction)]


def _evict_all(session: Session, units: Sequence[Unit], action: str, preemptor: str,
               reason: Callable[[Unit], tuple[str, dict[str, int]]]) -> None:
    for unit in units:
        why, numbers = reason(unit)
        for pod in unit.pods:
            session.plan.evict(pod.key, action, preemptor, why, numbers)
