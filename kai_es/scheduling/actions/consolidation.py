"""The consolidation action (policy kai-es/v4; KAI's, between allocate and reclaim): a pending job
that fits nowhere may have running preemptible pods moved out of its way, when every pod moved
finds a place elsewhere on capacity that is free now. Nobody loses resources: a moved pod is
evicted, and its controller's replacement has room waiting for it.

Rules:
- Preemptors are reclaim's and preempt's (`PreemptingAction.preemptors`: the jobs allocate left
  waiting for capacity, most deserving first, none within its preemption delay), restricted to
  preemptible jobs (as KAI: a non-preemptible job does not consolidate) within their queue's
  limits.
- Victims are the running pods of any preemptible job but the preemptor's own, of any queue and
  any priority (they keep their resources, so neither fair share nor priority is at stake; nor
  is min-runtime, as in KAI). They are tried node by node (`bounded_search`: at most
  `MAX_NODES` nodes that could fit the job with their movable pods gone, in the version's node
  order, `rules.consolidation_nodes`: the most free GPU capacity first; on each, the cheapest units that free a resource the node lacks). Units
  and effort are the shared search's
  (`kai_es.scheduling.victims`) but for one thing: since every moved pod is re-placed, a gang
  keeps its members however many of them move, so of the units the search chose only the pods
  on nodes the preemptor uses move; the others stay where they run.
- A unit with a pod that fits on no other node's idle capacity now (static eligibility) is not
  taken: it could not move.
- Once the search has placed the preemptor, every victim pod it kept is re-placed
  (`rules.replacement.relocate`, shared with reclaim's and preempt's moves: largest request first, on
  idle capacity of another node that no pipelined pod waits for, within its own eligibility);
  if one cannot be, the whole attempt is rolled back. A re-placement is an
  `Entry` with `moved_from` set: it holds the capacity for the rest of the cycle and is
  announced in the pod's eviction (its reason names both nodes), not as a placement.
- At most `maxConsolidationPreemptees` jobs (default 16; -1: no limit; 0: the action is off)
  are moved per cycle; an attempt that would move more is rolled back.
- A preemptor for whom moving every movable pod would make room on no node is passed over
  silently (no VictimsCannotMakeRoom: its NoNodeFits says enough), as is one whose identical
  scenario failed already in this cycle.
- Off when a placement strategy is `spread` (GPU or CPU), as in KAI: packing pods tighter would
  work against it.
- Pure: reads the state; writes only the Session's Plan and the returned result.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator

from kai_es.scheduling.actions.consolidation_views import NodeViews, unit_key
from kai_es.scheduling.actions.preempting import PreemptingAction
from kai_es.scheduling.fairshare import RESOURCES, pod_request
from kai_es.scheduling.framework import ActionResult
from kai_es.scheduling.packing import TaskShape
from kai_es.scheduling.plan import Eviction, VerificationError
from kai_es.scheduling.rules.replacement import relocate
from kai_es.scheduling.session import QueueNode, Session, format_quantity
from kai_es.scheduling.victims import Unit, free_capacity, keyed_units
from kai_es.state.model import Job, PodState
from kai_es.state.quantities import Vector

NAME = "consolidation"
#: nodes a search for one preemptor looks at (a count, so that replay is exact)
MAX_NODES = 32


class Consolidation(PreemptingAction):
    name = NAME
    whole_units = False  # moved pods are re-placed: of a gang, only those in the way move

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        config = session.config
        #: jobs this cycle may still move (-1: no limit)
        self.budget = config.max_consolidation_preemptees if config is not None else 0
        #: keys of the jobs moved so far this cycle
        self.moved_jobs: set[str] = set()
        #: the cluster's free capacity (`free_capacity`) when the Plan had this many operations
        self._free_at, self._free = -1, (0, 0, 0)
        #: what the searches of this action know of each node (made by `run`)
        self._views: NodeViews | None = None

    def run(self) -> ActionResult:
        config = self.session.config
        if config is None or self.budget == 0 or "spread" in (
                config.placement_strategy.gpu, config.placement_strategy.cpu):
            return self.result
        self._views = NodeViews(self.session)
        try:
            return super().run()
        finally:
            self._views.close()
            self._views = None

    def preemptors(self, waiting: list[str] | None = None) -> list[tuple[QueueNode, Job]]:
        """Reclaim's and preempt's, without the non-preemptible jobs and the jobs of which every
        pending pod requests more of one resource than the cluster has free: what a job places
        now is one pending pod or more, so it could not fit (`may_start` checks the request
        itself). None at all when that holds for every waiting pod."""
        free = self._free_capacity()
        self._free_at, self._free = len(self.plan.operations), free
        hint = self.session.gpu_memory_hint
        keys = self.session.rules.preemptors.waiting(self.session) if waiting is None else waiting
        requests = {key: pod_request(self.state.pods[key].spec, hint) for key in keys}
        # (each resource's smallest request over a column of the requests: the scan in C)
        if not requests or any(min(column) > have for column, have in zip(zip(*requests.values()), free)):
            return []  # no waiting pod is that small: no job can fit (a full cluster ends here)
        out = []
        for leaf, job in super().preemptors(keys):  # the rule's list, computed once
            if not job.preemptible:
                continue
            # (a pending pod placed this cycle is not waiting: its request is computed here)
            asks = [requests.get(e.pod_key) or pod_request(self.state.pods[e.pod_key].spec, hint)
                    for e in job.pending]
            if all(min(column) <= have for column, have in zip(zip(*asks), free)):
                out.append((leaf, job))
        return out

    def _free_capacity(self) -> Vector:
        return free_capacity(self.session, None) if self._views is None else self._views.free_capacity()

    def why_not(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        if self.budget >= 0 and len(self.moved_jobs) >= self.budget:
            return (f"it moved the most jobs a cycle may move (maxConsolidationPreemptees {self.budget})",
                    {"max_consolidation_preemptees": self.budget})
        short = next(r for r in (0, 1, 2) if request[r] > self._free[r])
        resource = RESOURCES[short]
        return (f"moved pods keep the cluster's free capacity as it is, and job {job.key} requests more "
                f"{resource} than is free ({format_quantity(resource, request[short])} > "
                f"{format_quantity(resource, self._free[short])})",
                {"requested": request[short], "free": self._free[short]})

    def no_victims(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return f"no running preemptible pod could be moved out of job {job.key}'s way", {}

    def search_failed(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return f"the pods in job {job.key}'s way would not all fit elsewhere", {}

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        if self.budget >= 0 and len(self.moved_jobs) >= self.budget:
            return False
        # moves keep the cluster's free capacity as it is and the job takes `request` of it: a
        # cluster with less free in some resource has no room to make (a full one: no search)
        length = len(self.plan.operations)
        if self._free_at != length:
            self._free_at, self._free = length, self._free_capacity()
        return all(need <= have for need, have in zip(request, self._free))

    def bounded_search(self, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector,
                       shapes: list[tuple[TaskShape, array[int]]]
                       ) -> tuple[set[int] | None, Iterable[Unit], Hashable] | None:
        """Node by node, at most `MAX_NODES` of them: the nodes its tasks may use, most free GPU
        capacity (once released) first, that could fit one of its tasks with their movable pods
        gone (`victims.room`, device by device); on each, the units with a pod there that frees a resource the node
        lacks (`consolidation_views.short_of`), cheapest first. Room for a task is made on one node, so taking the
        cheapest units of the whole cluster (reclaim's and preempt's order) would spread the
        moves over many nodes and make room on none; and only these nodes' pods are looked at,
        so a search costs what its nodes hold, not what the cluster runs. Which nodes, in
        which order: `NodeViews.nodes_to_try`, which keeps them from one search to the next."""
        # what this search depends on: not the preemptor's queue or priority (any preemptible
        # pod may move for any preemptor), but its own running pods, which never move for it
        _, _, _, *rest = self._scenario(leaf, job, pods, request, shapes)
        scenario = (NAME, job.key if job.occupying else "", *rest)
        if scenario in self.failed_scenarios:
            self.refuse(job, *self.search_failed(leaf, job, request))
            return None
        if self._views is None:  # (outside `run`: kept until the Plan goes)
            self._views = NodeViews(self.session)
        views = self._views
        nodes = views.nodes_to_try(job, shapes, self.session.rules.consolidation_nodes, MAX_NODES)
        if not nodes:
            self.failed_scenarios.add(scenario)
            return None
        at_start: dict[str, list[tuple[tuple[object, ...], Unit]]] | None = None
        if self.plan.verify:
            state = self.state
            jobs = {pod.job_key: state.jobs[pod.job_key] for _, _, movable in nodes for pod in movable}
            at_start = {k: views.units_of(jobs[k]) for k in sorted(jobs)}
            if _unit_form(views.units(jobs[k] for k in sorted(jobs))) != \
                    _unit_form(keyed_units(self.session, [jobs[k] for k in sorted(jobs)], backoff=True)):
                raise VerificationError(f"consolidation's kept victim units of {sorted(jobs)} are not keyed_units'")
        return {n for n, _, _ in nodes}, self._units_by_node(nodes, views.units_of, at_start), scenario

    def _units_by_node(self, nodes: list[tuple[int, tuple[bool, bool, bool], list[PodState]]],
                       units_of: Callable[[Job], list[tuple[tuple[object, ...], Unit]]],
                       at_start: dict[str, list[tuple[tuple[object, ...], Unit]]] | None
                       ) -> Iterator[Unit]:
        """Of the units of the jobs with a movable pod on `nodes` (each job's as the search
        starts, cheapest first: `units_of`), node by node those with a pod there that frees
        something the node lacks, cheapest first: a unit with a pod on a node is one of the
        units of the jobs with a movable pod there, so only theirs are merged, as the search
        reaches the node.

        A job's units are read when the search first reaches one of its nodes, and kept for
        the rest of the search: only the search's own operations change the Plan meanwhile,
        and each touches a job whose units it read before (a victim's, from these units; the
        preemptor's, never a victim of its own search). Under verification `at_start` holds
        every job's units read as the search started, and each read is checked against it."""
        evicted = self.plan.evicted_pods
        names = self.plan.names
        jobs = self.state.jobs
        read: dict[str, list[tuple[tuple[object, ...], Unit]]] = {}

        def units(k: str) -> list[tuple[tuple[object, ...], Unit]]:
            found = read.get(k)
            if found is None:
                found = read[k] = units_of(jobs[k])
                if at_start is not None and _unit_form(found) != _unit_form(at_start[k]):
                    raise VerificationError(f"consolidation read job {k}'s victim units after the search "
                                            "changed them")
            return found

        seen: set[int] = set()
        for n, short, movable in nodes:
            name = names[n]
            here_jobs = sorted({pod.job_key for pod in movable})
            for _, unit in heapq.merge(*(units(k) for k in here_jobs), key=unit_key):
                here = [pod for pod in unit.pods if pod.node == name]
                if not here or id(unit) in seen or any(pod.key in evicted for pod in unit.pods):
                    continue
                if any(short) and not any(_frees(pod, short) for pod in here):
                    continue  # moving it would free nothing the node lacks
                seen.add(id(unit))
                yield unit

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        """Another job's preemptible unit whose every pod fits, now, on idle capacity of some
        node other than its own (within its static eligibility; kai-es/v5: and within the topology
        domains its job requires, `TopologyPlacer.home`): a pod that fits nowhere else
        cannot move, so a unit with one is not taken (`Plan.fits_elsewhere`, which keeps what
        one scan found for the searches after it)."""
        plan, eligibility, topology = self.plan, self.session.eligibility, self.session.topology

        def movable(pod: PodState) -> bool:
            if topology is not None:  # kai-es/v5: a constrained job's pod may move within its domain only
                with eligibility.restricted(topology.home(pod)):
                    mask = eligibility.static_mask(pod.spec)
            else:
                mask = eligibility.static_mask(pod.spec)
            return plan.fits_elsewhere(plan.shape(pod.spec), mask, plan.node_index[pod.node])

        return lambda unit: unit.job.key != job.key and unit.job.preemptible and all(movable(p) for p in unit.pods)

    def why(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], tuple[str, dict[str, int]]]:
        def why(unit: Unit) -> tuple[str, dict[str, int]]:
            # provisional: `settle` states where the pod goes once that is known
            return f"moved to make room for job {job.key}", {"requested_milli_gpu": request[0]}

        return why

    def before_place(self, job: Job, request: Vector, start: int) -> None:
        """Nothing: every victim of a consolidation is re-placed after the preemptor (`settle`)."""

    def settle(self, job: Job, start: int, request: Vector) -> bool:
        plan, state = self.plan, self.state
        evictions = [op for op in plan.operations[start:] if isinstance(op, Eviction) and not op.undone]
        jobs = {state.pods[op.pod_key].job_key for op in evictions}
        if self.budget >= 0 and len(self.moved_jobs | jobs) > self.budget:
            return False
        destinations = relocate(self.session, evictions)
        if destinations is None:
            return False
        names = plan.names
        announce = self.session.rules.move_decisions.announce
        for op, node in destinations:
            announce(op, names[node], f"moved from node {names[op.node]} to node {names[node]} "
                     f"to make room for {op.preemptor}", f"moved to make room for {op.preemptor}")
            op.numbers = {"moved_jobs": len(jobs), "moved_pods": len(evictions), "requested_milli_gpu": request[0]}
        self.moved_jobs |= jobs
        return True


def _unit_form(units: list[tuple[tuple[object, ...], Unit]]) -> list[tuple[object, ...]]:
    """What a list of keyed units says (for the verification's comparison)."""
    return [(key, unit.job.key, tuple(pod.key for pod in unit.pods), unit.surplus) for key, unit in units]


def _frees(pod: PodState, short: tuple[bool, bool, bool]) -> bool:
    requests = pod.spec.requests
    return (short[0] and pod.milli_gpu > 0) or (short[1] and requests.milli_cpu > 0) or \
        (short[2] and requests.memory_bytes > 0)
