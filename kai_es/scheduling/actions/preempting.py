"""What consolidation, reclaim and preempt share: which pending jobs may make room for
themselves, how their pods are placed on room being made, and the loop over the shared victim
search (`kai_es.scheduling.victims`). Each action says which units it may take (`admit`), in
which order and over which nodes (`bounded_search`), whether gangs are kept whole
(`whole_units`) and has the last word on a found placement (`settle`).

Contract:
- Preemptors are the jobs of the pods the version's `preemptors` rule names (kai-es/v5: those
  an earlier action left waiting for capacity; kai-es/v6: every pending job), tried once each,
  most deserving first: queue order at the start of the action (the Session's key), then job
  priority, age, uid. A job the action tried and could not help is told why
  (`rules.preemptors.refuse`: `why_not`, `no_victims`, `search_failed`, a queue limit).
- A preemptor places the pods its gang needs now (all of a gang's minimum, or one elastic pod),
  all or none; pods landing on capacity that victims release are Pipelined, and a gang whose
  minimum is pipelined is pipelined whole.
- The queue's limits (and, for a non-preemptible job, quota) hold for a preemptor as for
  allocate.
- The policy version's rules (`kai_es.scheduling.rules`, on `Session.rules`) decide the rest:
  `preemption_delay` (a job within its delay is no preemptor; its waiting pods get a
  PreemptionDelay reason), `min_runtime` (a victim job within its min-runtime offers only its
  surplus pods, never its gang), `victim_search` (which victims, over which nodes: the
  unbounded search, or the reducer's index through the buckets the action allows,
  `victim_buckets`, bounded per node, `bounded_search`), `victim_eligibility` (units no action
  takes this cycle), `replacement` (victims moved rather than evicted, in `settle`), and the
  topology placer (`topology_placement`: a preemptor with a required topology constraint
  searches within one domain of its required level at a time,
  `TopologyPlacer.preempt_domains`; its placement honours every constraint of the job and its
  sub-groups, `TopologyPlacer.place`; a moved pod of a constrained job stays in its domain).
- Pure: reads the state; writes only the Session's Plan and the returned result.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator
from itertools import islice
from operator import itemgetter

from kai_es.events.payloads import Reason
from kai_es.events.timefmt import format_duration, rfc3339
from kai_es.scheduling import framework as fw
from kai_es.scheduling.packing import TaskShape
from kai_es.scheduling.plan import Entry
from kai_es.scheduling.session import QueueNode, Session
from kai_es.scheduling.topology import constrained
from kai_es.scheduling.victims import (
    MAX_PLACEMENT_TRIES,
    MAX_VICTIM_PODS,
    RoomBound,
    Unit,
    shared,
    room,
    search,
    units_of,
)
from kai_es.state.model import Job, PodState
from kai_es.state.quantities import Vector


#: what a failed search's reason adds under `rules.search_backoff` (the same words at each failure)
BACKING_OFF = "further searches for it back off"

class PreemptingAction:
    """Base of reclaim and preempt: `victim_jobs`, `admit` and `why` make the difference."""

    name = ""
    #: the search keeps victims by whole unit (a gang loses all its pods), else by pod
    whole_units = True

    def __init__(self, session: Session) -> None:
        self.session = session
        self.state = session.state
        self.plan = session.plan
        self.result = fw.ActionResult()
        self._occupying_jobs: list[Job] | None = None
        #: kai-es/v3: victim units by (queue, priority) bucket of `state.victim_jobs`, with their
        #: order keys; built when a preemptor first needs the bucket
        self._bucket_units: dict[tuple[str, int], list[tuple[tuple[object, ...], Unit]]] = {}
        #: bounded searches that failed, by everything the search depends on but the Plan's other
        #: operations (see `_scenario`)
        self.failed_scenarios: set[Hashable] = set()
        self._room: RoomBound | None = None
        self._bucket_cursor: dict[tuple[str, int], int] = {}
        #: unbounded searches that found nothing, by (queue, request, plan length): an equal
        #: preemptor on an unchanged plan would find nothing either
        self.failed_searches: set[Hashable] = set()
        self._units: list[Unit] | None = None
        self._allowed: dict[tuple[str, int], set[int]] = {}
        self._cursor: dict[tuple[str, int], int] = {}
        self._protection: dict[tuple[str, str], bool] = {}

    @property
    def occupying_jobs(self) -> list[Job]:
        """Jobs that may lose pods (preemptible, occupying), by key; computed once per action."""
        if self._occupying_jobs is None:
            jobs = self.state.jobs
            self._occupying_jobs = [jobs[k] for k in sorted(jobs) if jobs[k].preemptible and jobs[k].occupying]
        return self._occupying_jobs

    # -- what each action says ---------------------------------------------------------------

    def victim_jobs(self, leaf: QueueNode, job: Job) -> list[Job]:
        """The jobs this action may take pods from for `job` (a filter of `occupying_jobs` that
        depends only on the job's queue and priority)."""
        raise NotImplementedError

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        """kai-es/v3: the (queue, priority) buckets of `state.victim_jobs` whose jobs this action
        may take pods from for `job`, judged on the Plan's accounting now (a bucket left out can
        hold no unit `admit` would take during this preemptor's search)."""
        raise NotImplementedError

    def _units_in(self, bucket: tuple[str, int]) -> list[tuple[tuple[object, ...], Unit]]:
        found = self._bucket_units.get(bucket)
        if found is None:
            queue, priority = bucket
            jobs = self.state.jobs
            members = [jobs[k] for k in sorted(self.state.victim_jobs.get(queue, {}).get(priority, ()))]
            found = self._bucket_units[bucket] = shared(self.session).units(self.session, bucket, members)
        return found

    def _merged(self, buckets: tuple[tuple[str, int], ...], for_leaf: QueueNode | None = None
                ) -> Iterator[Unit]:
        """The units of `buckets`, cheapest first, lazily. With `for_leaf` (a search for a
        preemptor of that queue): without the units this Plan already evicts, and without a
        min-runtime-protected job's gang (its surplus pods stay offered). Without it: every unit
        (for the per-node bound, which may count more victims than the search takes)."""
        evicted = self.plan.evicted_pods
        if for_leaf is None:
            for _, unit in heapq.merge(*(self._units_in(b) for b in buckets), key=itemgetter(0)):
                yield unit
            return
        streams = []
        for bucket in buckets:
            units = self._units_in(bucket)
            # units evicted by an earlier preemptor stay evicted (its operations are committed):
            # skip that prefix for good; a rollback only ever undoes units after it
            start = self._bucket_cursor.get(bucket, 0)
            while start < len(units) and all(pod.key in evicted for pod in units[start][1].pods):
                start += 1
            self._bucket_cursor[bucket] = start
            streams.append((bucket[0], self._offered(islice(units, start, None), for_leaf)))
        # across queues, the version's victim queue order (`rules.victim_queue_order`)
        yield from self.session.rules.victim_queue_order.merge(self.session, streams)

    def _offered(self, units: Iterable[tuple[tuple[object, ...], Unit]], for_leaf: QueueNode
                 ) -> Iterator[tuple[tuple[object, ...], Unit]]:
        """`units` a search for a preemptor of `for_leaf` may take: not evicted by this Plan
        already, and not a min-runtime-protected job's gang (its surplus pods stay offered)."""
        evicted = self.plan.evicted_pods
        for item in units:
            unit = item[1]
            if not any(pod.key in evicted for pod in unit.pods):
                if not unit.surplus and self._protected(for_leaf, unit.job):
                    continue  # min-runtime: a protected job keeps its gang
                yield item

    def bounded_search(self, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector,
                       shapes: list[tuple[TaskShape, array[int]]]
                       ) -> tuple[set[int] | None, Iterable[Unit], Hashable] | None:
        """The bounded search (`rules.victim_search`): what a search for `job` (its `pods` to place now, their `shapes`: the
        packer's shape and static eligible nodes of each) covers — the nodes
        it may take from, the units it tries in order, and its scenario (remembered when it
        fails, see `_scenario`) — or None when it need not run: no eligible victim, a scenario
        that failed already, or no node with room (`RoomBound`; the pods get
        VictimsCannotMakeRoom)."""
        buckets = tuple(self.victim_buckets(leaf, job, request))
        if not buckets:  # no eligible victim at all
            self.refuse(job, *self.no_victims(leaf, job, request))
            return None
        scenario = (buckets, *self._scenario(leaf, job, pods, request, shapes))
        if scenario in self.failed_scenarios:
            self.refuse(job, *self._failed_search(leaf, job, request))
            return None
        if self._room is None:
            self._room = RoomBound(self.session)
        on_nodes = self._room.nodes(buckets, lambda: self._merged(buckets), shapes)
        if on_nodes is None:
            self.failed_scenarios.add(scenario)
            self._cannot_make_room(pods, buckets)
            return None
        return on_nodes, self._merged(buckets, for_leaf=leaf), scenario

    def victim_units(self, leaf: QueueNode, job: Job) -> Iterator[Unit]:
        """The victim units for `job`, cheapest first, produced lazily: the units of every
        occupying job are ordered once per action; a unit whose pods this plan already evicts
        is skipped."""
        if self._units is None:
            self._units = units_of(self.session, self.occupying_jobs)
        key = (leaf.name, job.priority)  # what victim_jobs depends on (for both actions)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = self._allowed[key] = {id(j) for j in self.victim_jobs(leaf, job)}
        evicted = self.plan.evicted_pods
        units = self._units
        # units evicted by an earlier preemptor stay evicted (its operations are committed):
        # skip that prefix for good; a rollback only ever undoes units after it
        start = self._cursor.get(key, 0)
        while start < len(units) and all(pod.key in evicted for pod in units[start].pods):
            start += 1
        self._cursor[key] = start
        for i in range(start, len(units)):
            unit = units[i]
            if id(unit.job) in allowed and not any(pod.key in evicted for pod in unit.pods):
                # min-runtime: a protected job keeps its gang; only an elastic job's surplus goes
                if not unit.surplus and self._protected(leaf, unit.job):
                    continue
                yield unit

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        raise NotImplementedError

    def min_runtime_protects(self, leaf: QueueNode, victim: Job, victim_leaf: QueueNode | None) -> bool:
        """Whether the min-runtime rule (`rules.min_runtime`) keeps `victim`'s gang from a
        preemptor of `leaf` in this action (here: never)."""
        return False

    def _protected(self, leaf: QueueNode, victim: Job) -> bool:
        """Whether `victim` is within its min-runtime, memoised."""
        key = (leaf.name, victim.key)
        found = self._protection.get(key)
        if found is None:
            found = self._protection[key] = self.min_runtime_protects(
                leaf, victim, self.session.queues.get(victim.queue))
        return found

    def why(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], tuple[str, dict[str, int]]]:
        raise NotImplementedError

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        return True

    # -- what a job the action could not help is told (`rules.preemptors.refuse`) --------------

    def refuse(self, job: Job, message: str, numbers: dict[str, int] | None = None) -> None:
        self.session.rules.preemptors.refuse(self.session, self.name, job, message, numbers)

    def why_not(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        """Why `may_start` refused `job` (the rule and its numbers)."""
        return f"job {job.key} may not start a search", {}

    def no_victims(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        """Why no job is a victim this action may take for `job`."""
        return f"no job is a victim it may take for job {job.key}", {}

    def search_failed(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        """The search over the victims it may take found no placement for `job`."""
        return (f"evicting the victims it may take (at most {MAX_VICTIM_PODS} pods, {MAX_PLACEMENT_TRIES} "
                f"placement tries) makes no room for job {job.key}",
                {"requested_milli_gpu": request[0], "requested_milli_cpu": request[1]})

    def _failed_search(self, leaf: QueueNode, job: Job, request: Vector,
                       backoff: dict[str, int] | None = None) -> tuple[str, dict[str, int]]:
        """`search_failed`'s reason, with the back-off's numbers (`rules.search_backoff`):
        `backoff`, else those a failure now sets."""
        message, numbers = self.search_failed(leaf, job, request)
        if backoff is None:
            backoff = self.session.rules.search_backoff.after_failure(job, self.session.now_ns)
        if not backoff:
            return message, numbers
        # the words stay the same from one failure to the next (a pod's Event and condition
        # change only with the verdict); the numbers say how many and until when
        return f"{message}; {BACKING_OFF}", {**numbers, **backoff}

    def before_place(self, job: Job, request: Vector, start: int) -> None:
        """Called before each try to place `job` (requesting `request`) with the evictions after
        checkpoint `start`: the victims that go before it (`rules.replacement_order`)."""
        self.session.rules.replacement_order.before_preemptor(self.session, start, job, request)

    def settle(self, job: Job, start: int, request: Vector) -> bool:
        """Called when the search placed `job` with the evictions after checkpoint `start`: the
        action's last word on the attempt (False: it is rolled back, as a failed search). Here:
        the re-placement rule's (`rules.replacement`), which may move victims instead."""
        self.session.rules.replacement.settle(self.session, start)
        return True

    # -- the loop ----------------------------------------------------------------------------

    def preemptors(self, waiting: list[str] | None = None) -> list[tuple[QueueNode, Job]]:
        """The jobs of the `waiting` pod keys (default: the `preemptors` rule's), most deserving first."""
        delay, now = self.session.rules.preemption_delay, self.session.now_ns
        seen: set[str] = set()
        leaf_keys: dict[str, tuple[object, ...]] = {}  # (the accounting holds still while the list is built)
        out: list[tuple[tuple[object, ...], QueueNode, Job]] = []
        if waiting is None:
            waiting = self.session.rules.preemptors.waiting(self.session)
        for pod_key in waiting:
            pod = self.state.pods[pod_key]
            job = self.state.jobs[pod.job_key]
            leaf = self.session.queues.get(job.queue)
            if job.key in seen or leaf is None or leaf.children:
                continue
            seen.add(job.key)
            delayed = self.session.delayed_until.get(job.key)
            if delayed is None:
                delayed = self.session.delayed_until[job.key] = delay.delayed_until_ns(self.state, job, now)
            if delayed:
                self._explain_delay(job, delayed)
                continue
            key = leaf_keys.get(leaf.name)
            if key is None:
                key = leaf_keys[leaf.name] = self.session.key(leaf, (0, 0, 0))
            out.append(((key, -job.priority, job.created_ns, job.uid, job.key), leaf, job))
        out.sort(key=lambda item: item[0])
        return [(leaf, job) for _, leaf, job in out]

    def _explain_delay(self, job: Job, until_ns: int) -> None:
        """Add the preemption-delay reason to the job's waiting pods (once per cycle)."""
        delay = self.session.rules.preemption_delay.delay_ns(self.state, job)
        reason = Reason(code=fw.PREEMPTION_DELAY, message=(
            f"job {job.key} is within its preemption delay ({format_duration(delay)}) and may not "
            f"trigger evictions before {rfc3339(until_ns)}"),
            numbers={"preemption_delay_ns": delay, "until_ns": until_ns})
        waiting = self.session.unschedulable
        for entry in job.pending:
            pod_key = entry.pod_key
            reasons = waiting.get(pod_key)
            if reasons is not None and all(r.code != fw.PREEMPTION_DELAY for r in reasons):
                waiting[pod_key] = [*reasons, reason]  # a new list: reason lists may be shared

    def run(self) -> fw.ActionResult:
        try:
            for leaf, job in self.session.rules.queue_depth.within(self.session, self.name, self.preemptors()):
                self._try(leaf, job)
        finally:
            if self._room is not None:
                self._room.close()
        return self.result

    def _try(self, leaf: QueueNode, job: Job) -> None:
        topology = self.session.topology
        if topology is None or not constrained(job.spec):
            self._try_within(leaf, job)
            return
        # kai-es/v5: a job with a required topology constraint searches victims within one
        # domain of that level at a time (the placement itself honours every constraint)
        eligibility = self.session.eligibility
        for nodes in topology.preempt_domains(job):
            with eligibility.restricted(nodes):
                if self._try_within(leaf, job):
                    return

    def _refuse_once(self, job: Job, pods: list[PodState], reason: Reason) -> None:
        """Tell `job` a limit or quota holds it, unless its first pod was told that code already
        (by allocate, or by the first action that met it)."""
        if not any(r.code == reason.code for r in self.session.unschedulable.get(pods[0].key, ())):
            self.refuse(job, reason.message, reason.numbers)

    def _try_within(self, leaf: QueueNode, job: Job) -> bool:
        """One victim search for `job` on the masks the eligibility hands out now; True when it
        placed the job."""
        picked = self.session.job_candidate(job, exclude=self.session.placed_pods)
        if picked is None:
            return False
        pods, request = picked
        if any(pod.backoff_until_ns > self.session.now_ns or pod.bind_final_message for pod in pods):
            return False
        rules = self.session.rules
        limited = rules.queue_limits.pre_check(self.session, leaf, job, request)
        if limited:
            self._refuse_once(job, pods, limited[0])
            return False
        if not self.may_start(leaf, job, request):
            self.refuse(job, *self.why_not(leaf, job, request))
            return False
        if any(self.session.eligibility.pod_problem(pod.spec) for pod in pods):
            return False
        gang = len(pods) > 1 or job.min_member > 1
        eligibility = self.session.eligibility
        shapes = [(self.plan.shape(pod.spec), eligibility.static_mask(pod.spec)) for pod in pods]
        covered = rules.victim_search.plan(self, leaf, job, pods, request, shapes)
        if covered is None:
            return False
        backing_off = rules.search_backoff.waiting_until(job, self.session.now_ns)
        if backing_off:
            # the search itself waits (`rules.search_backoff`; the checks before it did not): the
            # job is told what its last search found, word for word, so its verdict stands
            self.refuse(job, *self._failed_search(leaf, job, request, {
                "search_failures": job.search_failures, "retry_at_ns": backing_off}))
            return False
        on_nodes, units, memo = covered
        placed: list[Entry] = []

        def place_each(group: list[PodState], _explain: bool = False) -> tuple[list[Entry] | None, list[Reason]]:
            cp = self.plan.checkpoint()
            entries: list[Entry] = []
            eligibility = self.session.eligibility
            for pod in group:
                mask, dynamic = eligibility.mask(pod.spec)
                entry, _ = self.plan.place(pod.key, pod.spec, mask, remember=not dynamic,
                                           levels=eligibility.levels(pod.spec, mask), explain=False)
                if entry is None:
                    self.plan.rollback(cp)
                    return None, []
                entries.append(entry)
            return entries, []

        topology = self.session.topology if constrained(job.spec) else None

        def place() -> list[Entry] | None:
            cp_place = self.plan.checkpoint()
            self.before_place(job, request, start)
            if topology is not None:
                cp = self.plan.checkpoint()
                entries, _ = topology.place(job, pods, place_each, self.session.request_of)
                if entries is None:
                    self.plan.rollback(cp)
            else:
                entries, _ = place_each(pods)
            if entries is not None and not rules.queue_limits.holds(self.session, leaf, job, request):
                entries = None  # over a queue limit even with the victims taken so far
            if entries is None:
                self.plan.rollback(cp_place)  # (and the victims given their place back before it)
            else:
                placed[:] = entries
            return entries

        preemptor = f"{job.namespace}/{pods[0].spec.name}" if len(pods) == 1 else job.key
        start = self.plan.checkpoint()
        free = rules.victim_search.free(self, on_nodes)
        admit = rules.victim_eligibility.admit(self.session, self.admit(leaf, job, request))

        future = self.plan.future

        def node_fits(node: int) -> bool:  # one of the tasks could take `node` now
            return any(mask[node] and room(future, node, shape) for shape, mask in shapes)

        fits_on = rules.victim_search.fits_on(node_fits)

        evictions = search(self.session, units, admit, request, place,
                           self.name, preemptor, self.why(leaf, job, request), on_nodes, free,
                           self.whole_units, fits_on)
        if evictions is not None and not self.settle(job, start, request):
            self.plan.rollback(start)
            evictions = None
        if evictions is None:
            rules.victim_search.failed(self, memo)
            limited = rules.queue_limits.after_search(self.session, leaf, job, request)
            if limited:  # (kai-es/v10: judged on the Plan) no victims brought it under the limit
                self._refuse_once(job, pods, limited[0])
                return False
            self.refuse(job, *self._failed_search(leaf, job, request))
            return False
        entries = list(placed)  # what the last successful place() put on the Plan
        if gang and any(e.pipelined for e in entries):
            for e in entries:
                e.gang_pipelined = True
        for e in entries:
            self.session.placed_pods.add(e.pod_key)
            self.session.done.add(e.pod_key)  # an allocate after this action leaves it be
            self.session.unschedulable.pop(e.pod_key, None)
        self.result.placed.extend(entries)
        return True

    def _scenario(self, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector,
                  shapes: list[tuple[TaskShape, array[int]]]) -> tuple[object, ...]:
        """What a victim search depends on besides the Plan: the preemptor's queue, priority,
        preemptibility, request, and each task's shape and static eligible nodes (both interned
        for the cycle: the shape by the Plan, the mask by the eligibility cache), with the
        Plan's length (within an action the Plan only grows, but for failed attempts rolled
        back to where they began, so equal lengths are equal Plans). Tasks with dynamic
        predicates (affinity to other pods, host ports) are told apart by their pod, as their
        eligibility depends on more than their spec."""
        dynamic = tuple(pod.key for pod in pods if self.session.eligibility.is_dynamic(pod.spec))
        return (leaf.name, job.priority, job.preemptible, request,
                tuple((id(shape), id(mask)) for shape, mask in shapes), dynamic, len(self.plan.operations))

    def _cannot_make_room(self, pods: list[PodState], buckets: tuple[tuple[str, int], ...]) -> None:
        """The per-node bound failed: the pods keep their reasons, plus this action's."""
        victim_jobs = sum(len(self.state.victim_jobs.get(q, {}).get(prio, ())) for q, prio in buckets)
        reason = Reason(code=fw.VICTIMS_CANNOT_MAKE_ROOM, message=(
            f"{self.name}: evicting every preemptible job of the queues and priorities it may take from "
            f"({victim_jobs} jobs) would make room for it on no node"), numbers={"victim_jobs": victim_jobs})
        waiting = self.session.unschedulable
        for pod in pods:
            if self.session.topology is not None and reason in waiting.get(pod.key, ()):
                continue  # kai-es/v5: one search per topology domain, said once
            waiting[pod.key] = [*waiting.get(pod.key, ()), reason]


def reason_numbers(prefix: str, allocated: Vector, fair: Vector) -> dict[str, int]:
    return {f"{prefix}_allocated_milli_gpu": allocated[0], f"{prefix}_fair_milli_gpu": fair[0],
            f"{prefix}_allocated_milli_cpu": allocated[1], f"{prefix}_fair_milli_cpu": fair[1]}


__all__ = ["PreemptingAction", "reason_numbers"]
