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
  is min-runtime, as in KAI). Units, order and effort are the shared search's
  (`kai_es.scheduling.victims`) but for one thing: since every moved pod is re-placed, a gang
  keeps its members however many of them move, so of the units the search chose only the pods
  on nodes the preemptor uses move; the others stay where they run.
- A unit with a pod that fits on no other node's idle capacity now (static eligibility) is not
  taken: it could not move.
- Once the search has placed the preemptor, every victim pod it kept is re-placed, largest
  request first, on idle capacity (never pipelined, never on the node it leaves), within its
  own eligibility; if one cannot be, the whole attempt is rolled back. A re-placement is an
  `Entry` with `moved_from` set: it holds the capacity for the rest of the cycle and is
  announced in the pod's eviction (its reason names both nodes), not as a placement.
- At most `maxConsolidationPreemptees` jobs (default 16; -1: no limit; 0: the action is off)
  are moved per cycle; an attempt that would move more is rolled back.
- A preemptor for whom moving every movable pod would make room on no node is passed over
  silently (no VictimsCannotMakeRoom: its NoNodeFits says enough).
- Off when a placement strategy is `spread` (GPU or CPU), as in KAI: packing pods tighter would
  work against it.
- Pure: reads the state; writes only the Session's Plan and the returned result.
"""

from __future__ import annotations

from collections.abc import Callable

from kai_es.scheduling.actions.allocate import AllocateResult
from kai_es.scheduling.actions.preempting import PreemptingAction
from kai_es.scheduling.fairshare import pod_request
from kai_es.scheduling.plan import Eviction
from kai_es.scheduling.session import QueueNode, Session, Vector
from kai_es.scheduling.victims import Unit, free_capacity
from kai_es.state.model import Job, PodState

NAME = "consolidation"


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

    def run(self) -> AllocateResult:
        config = self.session.config
        if config is None or self.budget == 0 or "spread" in (
                config.placement_strategy.gpu, config.placement_strategy.cpu):
            return self.result
        return super().run()

    def preemptors(self) -> list[tuple[QueueNode, Job]]:
        """Reclaim's and preempt's, without the non-preemptible jobs and the jobs whose every
        pending pod requests more of some resource than the cluster has free: what a job places
        now is one pending pod or more, so it could not fit (`may_start` checks the request
        itself)."""
        free = free_capacity(self.session, None)
        self._free_at, self._free = len(self.plan.operations), free
        hint = self.session.gpu_memory_hint
        out = []
        for leaf, job in super().preemptors():
            if not job.preemptible:
                continue
            smallest = [min(pod_request(self.state.pods[e[3]].spec, hint)[r] for e in job.pending) for r in (0, 1, 2)]
            if all(need <= have for need, have in zip(smallest, free)):
                out.append((leaf, job))
        return out

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        if not job.preemptible or (self.budget >= 0 and len(self.moved_jobs) >= self.budget):
            return False
        # moves keep the cluster's free capacity as it is and the job takes `request` of it: a
        # cluster with less free in some resource has no room to make (a full one: no search)
        length = len(self.plan.operations)
        if self._free_at != length:
            self._free_at, self._free = length, free_capacity(self.session, None)
        return all(need <= have for need, have in zip(request, self._free))

    def victim_jobs(self, leaf: QueueNode, job: Job) -> list[Job]:
        queues = self.session.queues
        return [v for v in self.occupying_jobs if v.key != job.key and v.queue in queues]

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        found, queues = self.state.victim_jobs, self.session.queues
        return [(name, priority) for name in sorted(found) if name in queues for priority in sorted(found[name])]

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        """Another job's preemptible unit whose every pod fits, now, on idle capacity of some
        node other than its own (within its static eligibility): a pod that fits nowhere else
        cannot move, so a unit with one is not taken. During a search idle capacity does not
        change (evictions free capacity only once released), so the answers are kept per
        (shape, eligible nodes) for the search: the first node that fits, and whether another
        one does."""
        plan, eligibility = self.plan, self.session.eligibility
        fits: dict[tuple[int, int], tuple[int, bool]] = {}

        def movable(pod: PodState) -> bool:
            shape, mask = plan.shape(pod.spec), eligibility.static_mask(pod.spec)
            key = (id(shape), id(mask))
            found = fits.get(key)
            if found is None:
                first = plan.packer.place(plan.idle, shape, plan.strategy, mask)
                if not first.placed:
                    found = (-1, False)
                else:
                    others = mask[:]
                    others[first.node] = 0
                    found = (first.node, plan.packer.place(plan.idle, shape, plan.strategy, others).placed)
                fits[key] = found
            node, another = found
            return node >= 0 and (another or node != plan.node_index[pod.node])

        return lambda unit: unit.job.key != job.key and unit.job.preemptible and all(movable(p) for p in unit.pods)

    def _cannot_make_room(self, pods: list[PodState], buckets: tuple[tuple[str, int], ...]) -> None:
        """Silent: a move that cannot help is no news to a pod that fits nowhere (its NoNodeFits
        says why); the actions that take resources explain their own refusals."""

    def why(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], tuple[str, dict[str, int]]]:
        def why(unit: Unit) -> tuple[str, dict[str, int]]:
            # provisional: `settle` states where the pod goes once that is known
            return f"consolidation: moved to make room for job {job.key}", {"requested_milli_gpu": request[0]}

        return why

    def settle(self, job: Job, start: int, request: Vector) -> bool:
        plan, state = self.plan, self.state
        evictions = [op for op in plan.operations[start:] if isinstance(op, Eviction)]
        jobs = {state.pods[op.pod_key].job_key for op in evictions}
        if self.budget >= 0 and len(self.moved_jobs | jobs) > self.budget:
            return False
        eligibility = self.session.eligibility

        def size(op: Eviction) -> tuple[int, int, int, str]:
            pod = state.pods[op.pod_key]
            return (-pod.milli_gpu, -pod.spec.requests.milli_cpu, -pod.spec.requests.memory_bytes, op.pod_key)

        destinations: list[tuple[Eviction, int]] = []
        for op in sorted(evictions, key=size):
            pod = state.pods[op.pod_key]
            mask, _ = eligibility.mask(pod.spec)
            elsewhere = mask[:]
            elsewhere[op.node] = 0
            entry, _ = plan.place(pod.key, pod.spec, elsewhere, remember=False, pipeline=False,
                                  levels=eligibility.levels(pod.spec, elsewhere))
            if entry is None:
                return False
            entry.moved_from = op.node
            destinations.append((op, entry.node))
        names = plan.names
        for op, node in destinations:
            op.reason = (f"consolidation: moved from node {names[op.node]} to node {names[node]} "
                         f"to make room for {op.preemptor}")
            op.numbers = {"moved_jobs": len(jobs), "moved_pods": len(evictions), "requested_milli_gpu": request[0]}
        self.moved_jobs |= jobs
        return True
