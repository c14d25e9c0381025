"""The per-cycle Session: what every action shares — the queue tree with fair shares and its
tentative accounting, the order in which pending jobs go (KAI's queue and job order), the limit
and quota checks, gang-minimum selection, eligibility masks (`predicates.eligibility`) and the
Plan with its packer tables.

Queue order: the policy version's rule (`kai_es.scheduling.rules.queue_order`), level by level
down the queue tree.
Within a leaf queue: higher job priority, jobs below their gang minimum before elastic extras,
older, then uid.

Contract:
- Pure: reads the state; writes only the Plan and its own per-cycle structures.
- The session is the Plan's accounting listener: every allocation, pipelined placement and
  eviction moves the queue accounting of its pod's queue and ancestors (eviction: down), and a
  rollback moves it back, so accounting always equals "state + the Plan's operations". Each such
  change drops the cached order keys along that queue chain (the order cache never outlives the
  accounting it was computed from).
- Non-preemptible allocation: the reducer's (non-preemptible jobs), and under a version whose
  `rules.semi_preemptible` keeps cores, each semi-preemptible job's core (the pods it needs
  for its minimum shape among those occupying on the Plan), kept up to date as the Plan
  places and evicts its pods.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from sortedcontainers import SortedList

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.fairshare import RESOURCES, cluster_capacity, gpu_memory_hint, parent_loops, pod_request
from kai_es.scheduling.gang import Minimum, minimum, surplus
from kai_es.scheduling.plan import Announced, Entry, Plan, VerificationError
from kai_es.state.keys import job_key_of_index
from kai_es.state.model import OCCUPYING, ClusterState, Job, PodState
from kai_es.state.quantities import ZERO, Vector, add, device_milli_on, scale

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig
    from kai_es.scheduling.rules import Rules
    from kai_es.scheduling.topology import TopologyPlacer
    from kai_es.scheduling.victims import SharedBuckets

Candidate = tuple["QueueNode", Job, list[PodState], Vector]


class QueuedJob(NamedTuple):
    """An entry of a leaf queue's jobs for this cycle: higher priority first, then jobs below
    their gang minimum (stage 0) before elastic extras (1), older, uid, key."""

    neg_priority: int
    stage: int
    created_ns: int
    uid: str
    job_key: str


@dataclass(slots=True)
class QueueNode:
    """A queue's tentative accounting for this cycle (parents aggregate their children)."""

    name: str
    parent: QueueNode | None
    priority: int
    created_ns: int
    quota: Vector
    limit: Vector
    allocated: Vector = ZERO
    nonpreemptible: Vector = ZERO
    fair: Vector = ZERO
    #: KAI's allocatable share per resource (`GetAllocatableShare`): max(quota, fair share)
    #: within the limit; with an unlimited quota the limit, and with neither the cluster's
    #: capacity (`rules.queue_order.AllocatableShareOrder` divides by it)
    allocatable: Vector = ZERO
    children: list[QueueNode] = field(default_factory=list)
    jobs: SortedList | None = None  # leaves: their pending jobs in order (`QueuedJob`)
    chain: tuple[QueueNode, ...] = ()  # itself, then its ancestors (set once the tree is built)
    #: whether a queue of `chain` may have a limit on some resource (`Session.limits`; set
    #: with the chain, and True until then: a node built otherwise gets every check)
    limited: bool = True
    #: (order key, candidate) of its subtree as last computed (`Session.pick`); None once a
    #: change below it may have moved either (`Session.forget_order`)
    order: tuple[tuple[object, ...] | None, Candidate | None] | None = field(default=None, repr=False, compare=False)

    def ancestry(self) -> tuple[QueueNode, ...]:
        """Itself, then its parent, up to its root."""
        out: list[QueueNode] = []
        node: QueueNode | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return tuple(out)


def allocatable_share(quota: Vector, limit: Vector, fair: Vector, capacity: Vector) -> Vector:
    """KAI's allocatable share of a queue (see `QueueNode.allocatable`); -1 is unlimited."""
    out = []
    for r in (0, 1, 2):
        if quota[r] < 0:
            a = limit[r] if limit[r] >= 0 else capacity[r]
        else:
            a = max(quota[r], fair[r])
            if limit[r] >= 0:
                a = min(a, limit[r])
        out.append(a)
    return (out[0], out[1], out[2])


def queued_job(job: Job) -> QueuedJob:
    """`job`'s place in its leaf queue's order (the cycle takes a queue's jobs in this order)."""
    stage = 0 if job.occupying < job.min_member else 1
    # (tuple.__new__: without the NamedTuple's Python-level __new__, once per pending job)
    return tuple.__new__(QueuedJob, (-job.priority, stage, job.created_ns, job.uid, job.key))


def _one_pod(job: Job) -> bool:
    """A job of exactly one pod and no gang structure: its minimum is that pod."""
    return len(job.members) == 1 and job.min_member <= 1 and (job.spec is None or not job.spec.subgroups)


def _what(pod: PodState) -> str:
    g = pod.spec.gpu
    if g.whole:
        gpu = f"{g.whole} GPU"
    elif g.fraction_milli:
        gpu = f"{g.fraction_milli}m GPU x{g.fraction_devices}"
    elif g.gpu_memory_mib:
        gpu = f"{g.gpu_memory_mib}MiB GPU memory x{g.fraction_devices}"
    else:
        gpu = "no GPU"
    return f"{gpu}, {pod.spec.requests.milli_cpu}m CPU"


def format_quantity(resource: str, amount: int) -> str:
    """`amount` of `resource` ("gpu" in milli-GPU, "cpu" in milli-CPU, "memory" in bytes) as a person reads it."""
    if resource == "gpu":
        return f"{amount / 1000:g} GPU"
    if resource == "cpu":
        return f"{amount}m CPU"
    return f"{amount // 2**20}Mi memory"


class Session:
    """One cycle's shared view (see module docstring)."""

    def __init__(self, state: ClusterState, plan: Plan, now_ns: int, rules: Rules,
                 config: SchedulerConfig | None = None) -> None:
        self.state = state
        self.plan = plan
        self.now_ns = now_ns
        #: the policy version's rule objects (`kai_es.scheduling.rules`)
        self.rules = rules
        self._queue_key = rules.queue_order.key
        #: the config in force (None: a session built without one, as in tests)
        self.config = config
        #: (shape id, static mask id) -> whether it fit idle capacity when first asked; a False
        #: stays true for the cycle (see `rules.replacement.relocate`); True is asked again there
        self.idle_fits: dict[tuple[int, int], bool] = {}
        self.eligibility = rules.leaving_pods.eligibility(state, plan.names, plan.nodes)
        self.eligibility.verify = plan.verify
        plan.listeners.append(self.eligibility)
        plan.listeners.append(self)
        #: the topology placer (None: constraints are ignored), `rules.topology_placement`
        self.topology: TopologyPlacer | None = rules.topology_placement.placer(state, plan, self.eligibility)
        if self.topology is not None:
            plan.listeners.append(self.topology)
        self.gpu_memory_hint = gpu_memory_hint(state)  # (over the tables' nodes: every node)
        self.queues: dict[str, QueueNode] = {}
        self.roots: list[QueueNode] = []
        self.fair_shares: dict[str, Vector] = {}
        #: pods decided this cycle (placed, or given their reasons), and pods placed
        self.done: set[str] = set()
        self.placed_pods: set[str] = set()
        #: the pending pods of leaf queues, sorted, as the cycle starts (`rules.preemptors.PendingPods`)
        self.leaf_pending_pods: list[str] | None = None
        #: the jobs allocate tried, each at its first try, in order (`rules.tried_order`)
        self.tried: dict[str, None] = {}
        #: the gang minimum chosen for each job when it was last a candidate
        self.gang: dict[str, Minimum] = {}
        #: job key -> until when its preemption delay holds it (0: it does not), as the
        #: version's rule answered it (`PreemptingAction.preemptors`: the state holds still
        #: during a cycle, so each preempting action need not ask again)
        self.delayed_until: dict[str, int] = {}
        #: pods an action of this cycle left waiting, with the reasons (the cycle keeps it)
        self.unschedulable: dict[str, list[Reason]] = {}
        #: whether semi-preemptible jobs keep a non-preemptible core (`rules.semi_preemptible`);
        #: then each such job's core as counted in its queues, and what each of their pods
        #: placed by the Plan holds
        self.keeps_core = rules.semi_preemptible.keeps_core
        #: whether a pod this Plan evicted still counts as its job's (`occupying_on_plan`): until
        #: kai-es/v7 it does; kai-es/v8, which brought the kept cores, counts the Plan's evictions
        self.counts_evictions = self.keeps_core
        self.cores: dict[str, Vector] = {}
        self._placed_use: dict[str, Vector] = {}
        #: what the cycle's actions share (`victims.SharedBuckets`), built by the first that needs it
        self.shared_buckets: SharedBuckets | None = None
        self._build_queues()

    # -- setup ------------------------------------------------------------------------------

    def _build_queues(self) -> None:
        st = self.state
        #: queues whose parentQueue chain loops: not part of the tree; their jobs wait with the
        #: chain as the reason (`kai_es.scheduling.fairshare.parent_loops`)
        self.looping = parent_loops({name: q.spec.parent for name, q in st.queues.items()})
        for name in sorted(st.queues):
            if name in self.looping:
                continue
            spec = st.queues[name].spec
            self.queues[name] = QueueNode(
                name=name, parent=None, priority=spec.priority, created_ns=spec.created_ns,
                quota=(spec.gpu.quota, spec.cpu.quota, spec.memory.quota),
                limit=(spec.gpu.limit, spec.cpu.limit, spec.memory.limit))
        for name in sorted(self.queues):
            node = self.queues[name]
            parent = self.queues.get(st.queues[name].spec.parent)
            if parent is not None:
                node.parent = parent
                parent.children.append(node)
            else:
                self.roots.append(node)
        for node in self.queues.values():
            node.chain = node.ancestry()
            node.limited = any(r >= 0 for q in node.chain for r in q.limit)
        jobs = st.jobs
        for name in sorted(st.pending_jobs):
            leaf = self.queues.get(name)
            if leaf is None:
                continue
            entries = []
            for index_key in st.pending_jobs[name]:
                entries.append(queued_job(jobs[job_key_of_index(index_key)]))
            leaf.jobs = SortedList(entries)
        for name, node in self.queues.items():
            q = st.queues[name]
            own = (q.allocated_milli_gpu, q.allocated_milli_cpu, q.allocated_memory_bytes)
            np = (q.nonpreemptible_milli_gpu, q.nonpreemptible_milli_cpu, q.nonpreemptible_memory_bytes)
            for anc in node.chain:
                anc.allocated = add(anc.allocated, own)
                anc.nonpreemptible = add(anc.nonpreemptible, np)
        if self.keeps_core:
            for key in sorted(st.semi_jobs):
                self._recount_core(st.jobs[key])
        shares = self.rules.fair_share_division.shares(st, self.config, self.now_ns)
        for name, node in self.queues.items():
            node.fair = (shares["gpu"][name].fair_share, shares["cpu"][name].fair_share,
                         shares["memory"][name].fair_share)
            self.fair_shares[name] = node.fair
        capacity = cluster_capacity(st)
        for node in self.queues.values():
            node.allocatable = allocatable_share(node.quota, node.limit, node.fair, capacity)

    def close(self) -> None:
        """The cycle is over: the queue tree is unlinked (a node holds its parent, its children
        and itself in its chain), so reference counting frees it with the session."""
        for node in self.queues.values():
            node.parent, node.children, node.chain, node.order = None, [], (), None

    # -- accounting (the Plan's listener) -----------------------------------------------------

    def on_operation(self, op: Announced, sign: int) -> None:
        pod = self.state.pods[op.pod_key]
        spec = pod.spec
        job = self.state.jobs[pod.job_key]
        leaf = self.queues.get(job.queue)
        if leaf is None:
            return
        if isinstance(op, Entry):
            # placed: the GPU share is known exactly, as the reducer will count it
            used: Vector = (device_milli_on(self.plan.nodes[op.node].spec, spec.gpu) * len(op.devices),
                            spec.requests.milli_cpu, spec.requests.memory_bytes)
        else:
            sign = -sign  # an eviction gives its pod's allocation back
            used = (pod.milli_gpu, spec.requests.milli_cpu, spec.requests.memory_bytes)
        g, c, m = used[0] * sign, used[1] * sign, used[2] * sign  # (written out: every operation)
        nonpreemptible = not job.preemptible
        for q in leaf.chain:
            a = q.allocated
            q.allocated = (a[0] + g, a[1] + c, a[2] + m)
            if nonpreemptible:
                a = q.nonpreemptible
                q.nonpreemptible = (a[0] + g, a[1] + c, a[2] + m)
            q.order = None
        if job.semi and self.keeps_core:
            if isinstance(op, Entry):
                if sign > 0:
                    self._placed_use[op.pod_key] = used
                else:
                    self._placed_use.pop(op.pod_key, None)
            self._recount_core(job)

    def _recount_core(self, job: Job) -> None:
        """Bring `job`'s core (`rules.semi_preemptible`) in its queues' non-preemptible
        allocation up to date with the Plan: its occupying pods not evicted, and those placed."""
        leaf = self.queues.get(job.queue)
        if leaf is None:
            return
        placed = self._placed_use
        occupying = self.occupying_on_plan(job, placed)
        extras = {pod.key for pod in surplus(job, self.rules.victim_order.order(occupying), occupying)}
        core = ZERO
        for pod in occupying:
            if pod.key in extras:
                continue
            use = placed.get(pod.key)
            if use is None:
                use = (pod.milli_gpu, pod.spec.requests.milli_cpu, pod.spec.requests.memory_bytes)
            core = add(core, use)
        before = self.cores.get(job.key, ZERO)
        if core == before:
            return
        self.cores[job.key] = core
        delta = add(core, scale(before, -1))
        for q in leaf.chain:
            q.nonpreemptible = add(q.nonpreemptible, delta)
            q.order = None

    # -- order ------------------------------------------------------------------------------

    def candidate(self, leaf: QueueNode) -> tuple[Job, list[PodState], Vector] | None:
        """The leaf's next job with the pods it would place now and their total request."""
        done = self.done
        while leaf.jobs:
            key = leaf.jobs[0].job_key
            job = self.state.jobs[key]
            pending = job.pending
            if len(pending) == 1:  # (most jobs: no comprehension's frame)
                pod_key = pending[0].pod_key
                pods = [] if pod_key in done else [self.state.pods[pod_key]]
            else:
                pods = [self.state.pods[e.pod_key] for e in pending if e.pod_key not in done]
            if not pods:
                leaf.jobs.pop(0)
                continue
            if _one_pod(job):  # (its pod is pending and not done, so not placed)
                return job, pods, self._one_pod_request(job, pods)
            _, chosen = self._minimum_of(job, pods)
            return job, chosen, self.request_of(chosen)
        return None

    def job_candidate(self, job: Job, exclude: set[str] | None = None
                      ) -> tuple[list[PodState], Vector] | None:
        """The pods of `job` to place now (its gang minimum, else one elastic pod) among its
        pending pods not in `exclude` (default: those decided this cycle) and their request, or
        None when it has nothing to place or its minimum cannot exist (recorded in `gang`)."""
        skip = self.done if exclude is None else exclude
        pods = [self.state.pods[e.pod_key] for e in job.pending if e.pod_key not in skip]
        if not pods:
            return None
        if _one_pod(job) and pods[0].key not in self.placed_pods:
            return pods, self._one_pod_request(job, pods)
        need, chosen = self._minimum_of(job, pods)
        if need.problem is not None:
            return None
        return chosen, self.request_of(chosen)

    def occupying_on_plan(self, job: Job, placed: Container[str] = ()) -> list[PodState]:
        """`job`'s pods that hold a place, by key: occupying in the state — and, when
        `counts_evictions` (kai-es/v8 on), not evicted by this Plan — or in `placed`."""
        pods = self.state.pods
        evicted: Container[str] = self.plan.evicted_pods if self.counts_evictions else ()
        return [pods[k] for k in sorted(job.members)
                if (pods[k].status in OCCUPYING and k not in evicted) or k in placed]

    def _one_pod_request(self, job: Job, pods: list[PodState]) -> Vector:
        """The request of `pods`, the one pending pod of a `_one_pod` job, not placed (the common
        case: cheap); the job's gang minimum recorded as `_minimum_of` finds it, without its
        steps. Nothing of the job occupies, so no readiness rule finds it short (its pod is
        alive), and its minimum is the pod when minMember is 1, none when 0 (an observable
        difference in neither case: a one-pod job is never told it is a gang, and a minMember 0
        job has no minimum for `quota_bound`)."""
        need = self.gang[job.key] = Minimum(tuple(pods) if job.min_member >= 1 else ())
        request = pod_request(pods[0].spec, self.gpu_memory_hint)
        if self.plan.verify:
            full, chosen = self._minimum_of(job, pods)
            self.gang[job.key] = need
            if (full, chosen, self.request_of(chosen)) != (need, pods, request):
                raise VerificationError(f"job {job.key}: one pod's candidate {need} {request}, "
                                        f"the full rule's {full} {self.request_of(chosen)}")
        return request

    def _minimum_of(self, job: Job, pending: list[PodState]) -> tuple[Minimum, list[PodState]]:
        """The job's gang minimum among `pending` (recorded in `gang`) and the pods to try now:
        the minimum, or one pod when the job is at its minimum."""
        occupying = self.occupying_on_plan(job, self.placed_pods)
        problem = self.rules.scheduling_readiness.problem(self, job, occupying)
        need = minimum(job, pending, occupying) if problem is None else Minimum((), problem)
        self.gang[job.key] = need
        return need, list(need.pods) or pending[:1]

    def request_of(self, pods: list[PodState]) -> Vector:
        """What `pods` would add to their queue (gpu-memory counted against the largest GPU)."""
        request = ZERO
        for pod in pods:
            request = add(request, pod_request(pod.spec, self.gpu_memory_hint))
        return request

    def key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
        """The queue order key of `q` with a candidate requesting `request` (the version's rule)."""
        return self._queue_key(q, request)

    def pick(self, nodes: list[QueueNode]) -> Candidate | None:
        """The best (leaf, job, pods, request) below `nodes`. A queue's key and candidate depend
        only on its own subtree, so each node keeps them (`QueueNode.order`) until a try below
        it changes something (`forget_order`)."""
        best: Candidate | None = None
        best_key: tuple[object, ...] | None = None
        for q in nodes:
            cached = q.order
            if cached is None:
                cand: Candidate | None
                if q.children:
                    cand = self.pick(q.children)
                elif q.jobs:
                    c = self.candidate(q)
                    cand = (q, *c) if c is not None else None
                else:
                    cand = None
                cached = q.order = (self._queue_key(q, cand[3]) if cand is not None else None, cand)
            key, cand = cached
            if cand is None:
                continue
            if best_key is None or key < best_key:  # type: ignore[operator]
                best, best_key = cand, key
        return best

    @staticmethod
    def forget_order(leaf: QueueNode) -> None:
        """A try in `leaf` may have changed its candidate: its chain's kept orders are dropped."""
        for q in leaf.chain:
            q.order = None

    # -- rules ------------------------------------------------------------------------------

    def quota_bound(self, job: Job) -> bool:
        """Whether what `job` places now must fit its queues' quotas (non-preemptible
        allocation): a non-preemptible job's pods, and (`rules.semi_preemptible`) a
        semi-preemptible job's pods that restore its minimum shape — its gang minimum as last
        chosen (`gang`), where it has one — not its extras."""
        if not job.preemptible:
            return True
        if not (job.semi and self.keeps_core):
            return False
        need = self.gang.get(job.key)
        has_minimum = job.min_member > 0 or bool(job.spec is not None and job.spec.subgroups)
        return need is not None and bool(need.pods) and has_minimum

    def limits(self, leaf: QueueNode, job: Job, request: Vector, quotas_only: bool = False) -> list[Reason]:
        """Why `request` of `job` may not be placed in `leaf` now: the first queue from the leaf
        up whose limit it would exceed (unless `quotas_only`), or whose quota, for a
        quota-bound job (`quota_bound`), its non-preemptible allocation would; [] when none."""
        bound = self.quota_bound(job)
        if not bound and (quotas_only or not leaf.limited):
            return []  # (most tries: nothing below can apply)
        for q in leaf.chain:
            for r in (0, 1, 2):
                if request[r] <= 0:
                    continue
                resource = RESOURCES[r]
                if not quotas_only and q.limit[r] >= 0 and q.allocated[r] + request[r] > q.limit[r]:
                    return [Reason(code=fw.QUEUE_LIMIT, message=(
                        f"queue {q.name} would exceed its {resource} limit: requested "
                        f"{format_quantity(resource, request[r])}, allocated {format_quantity(resource, q.allocated[r])}, "
                        f"limit {format_quantity(resource, q.limit[r])}"),
                        numbers={"requested": request[r], "allocated": q.allocated[r], "limit": q.limit[r]})]
                if bound and q.quota[r] >= 0 and q.nonpreemptible[r] + request[r] > q.quota[r]:
                    what = "non-preemptible job" if not job.preemptible else "semi-preemptible job's minimum"
                    return [Reason(code=fw.NON_PREEMPTIBLE_OVER_QUOTA, message=(
                        f"{what} may not take queue {q.name} over its {resource} quota: "
                        f"requested {format_quantity(resource, request[r])}, non-preemptible allocated "
                        f"{format_quantity(resource, q.nonpreemptible[r])}, quota {format_quantity(resource, q.quota[r])}"),
                        numbers={"requested": request[r], "allocated": q.nonpreemptible[r], "quota": q.quota[r]})]
        return []
