"""The per-cycle Session: what every action shares — the queue tree with fair shares and its
tentative accounting, the order in which pending jobs go (KAI's queue and job order), the limit
and quota checks, gang-minimum selection, eligibility masks (`predicates.eligibility`) and the
Plan with its packer tables.

Queue order (level by level down the queue tree; first difference decides):
  1. queues not over their fair share in every resource before those that are;
  2. queues that stay within quota with the candidate job before those that would not;
  3. higher queue priority;
  4. (kai-es/v2, as KAI) a queue that would use a resource in which its fair share is zero goes
     after one that would not;
  5. smaller dominant-resource share including the candidate job (DRF: max over resources of
     (allocated + candidate) / fair share, as an integer in units of 1e-12);
  6. (kai-es/v2) smaller dominant-resource share without the candidate job;
  7. (kai-es/v2) a queue whose fair share is smaller in at least one resource and larger in
     none goes first;
  8. older queue, then name.
Within a leaf queue: higher job priority, jobs below their gang minimum before elastic extras,
older, then uid.

Contract:
- Pure: reads the state; writes only the Plan and its own per-cycle structures.
- The session is the Plan's accounting listener: every allocation, pipelined placement and
  eviction moves the queue accounting of its pod's queue and ancestors (eviction: down), and a
  rollback moves it back, so accounting always equals "state + the Plan's operations". Each such
  change drops the cached order keys along that queue chain (the order cache never outlives the
  accounting it was computed from).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.fairshare import RESOURCES, TimeBased, Usage, parent_loops, pod_request, shares_for_state
from kai_es.scheduling.gang import Minimum, minimum
from kai_es.scheduling.plan import Entry, Operation, Plan
from kai_es.scheduling.predicates.eligibility import Eligibility
from kai_es.scheduling.topology import TopologyPlacer
from kai_es.state.model import OCCUPYING, ClusterState, Job, PodState
from kai_es.state.reducer import device_milli_on, job_key_of_index

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig
    from kai_es.scheduling.policy import Policy

Vector = tuple[int, int, int]  # (milli-GPU, milli-CPU, bytes), in RESOURCES order
Candidate = tuple["QueueNode", Job, list[PodState], Vector]
ZERO: Vector = (0, 0, 0)
#: DRF shares are compared as floor(used * SHARE_SCALE / fair share): integers, exact to 1e-12
SHARE_SCALE = 10**12
INFINITE = 10**40


def _add(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _scale(a: Vector, k: int) -> Vector:
    return (a[0] * k, a[1] * k, a[2] * k)


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
    children: list[QueueNode] = field(default_factory=list)
    jobs: SortedList | None = None  # leaves: (-priority, stage, created, uid, job key)
    chain: tuple[QueueNode, ...] = ()  # itself, then its ancestors (set once the tree is built)

    def ancestry(self) -> tuple[QueueNode, ...]:
        """Itself, then its parent, up to its root."""
        out: list[QueueNode] = []
        node: QueueNode | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return tuple(out)


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


def _fmt(resource: str, amount: int) -> str:
    if resource == "gpu":
        return f"{amount / 1000:g} GPU"
    if resource == "cpu":
        return f"{amount}m CPU"
    return f"{amount // 2**20}Mi memory"


class FairShareOrder:
    """KAI's tie-break on fair shares: a queue whose fair share is smaller in at least one
    resource and not larger in any goes first. Two shares neither of which is smaller that way
    compare equal, so the order falls through to the next key (creation time)."""

    __slots__ = ("fair",)

    def __init__(self, fair: Vector) -> None:
        self.fair = fair

    def __lt__(self, other: FairShareOrder) -> bool:
        a, b = self.fair, other.fair
        return a != b and a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]

    def __eq__(self, other: object) -> bool:
        # neither is smaller (a hot path of queue ordering: comparisons written out)
        if not isinstance(other, FairShareOrder):
            return False
        a, b = self.fair, other.fair
        if a == b:
            return True
        return not (a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]) and \
            not (b[0] <= a[0] and b[1] <= a[1] and b[2] <= a[2])

    def __hash__(self) -> int:
        return 0


class Session:
    """One cycle's shared view (see module docstring)."""

    def __init__(self, state: ClusterState, plan: Plan, now_ns: int, policy: Policy | None = None,
                 config: SchedulerConfig | None = None, usage: Mapping[str, Usage] | None = None) -> None:
        self.state = state
        self.plan = plan
        self.now_ns = now_ns
        #: the policy version's semantic switches (None: kai-es/v1's)
        self.gpu_share_unit = policy.gpu_share_unit if policy is not None else 1
        self.kai_queue_order = policy.kai_queue_order if policy is not None else False
        self.batch_hopeless = policy.batch_hopeless if policy is not None else True
        #: the config in force, when the policy's time rules apply (`kai_es.scheduling.times`)
        self.config = config if policy is not None and policy.time_rules else None
        #: time-based fair share: each queue's usage share (None: off)
        self.usage = usage
        self.bounded_victims = policy.bounded_victims if policy is not None else False
        self.search_counts_free = policy.search_counts_free if policy is not None else False
        self.restore_gangs_first = policy.restore_gangs_first if policy is not None else False
        self.spare_growing_jobs = policy.spare_growing_jobs if policy is not None else False
        self.victims_move = policy.victims_move if policy is not None else False
        self.node_gated_tries = policy.node_gated_tries if policy is not None else False
        #: (shape id, static mask id) -> whether it fit idle capacity when first asked; a False
        #: stays true for the cycle (see `preempting.move_victims`); True is asked again there
        self.idle_fits: dict[tuple[int, int], bool] = {}
        self.subgroup_stale_gangs = policy.subgroup_stale_gangs if policy is not None else False
        self.eligibility = Eligibility(state, plan.names, plan.nodes,
                                       leaving=policy is not None and policy.evicted_pods_leave)
        plan.listeners.append(self.eligibility)
        plan.listeners.append(self)
        #: kai-es/v5: topology-aware placement (None: constraints are ignored)
        self.topology: TopologyPlacer | None = None
        if policy is not None and policy.topology:
            self.topology = TopologyPlacer(state, plan, self.eligibility)
            plan.listeners.append(self.topology)
        self.gpu_memory_hint = max((n.spec.gpu_memory_mib for n in plan.nodes), default=0)
        self.queues: dict[str, QueueNode] = {}
        self.roots: list[QueueNode] = []
        self.fair_shares: dict[str, Vector] = {}
        #: pods decided this cycle (placed, or given their reasons), and pods placed
        self.done: set[str] = set()
        self.placed_pods: set[str] = set()
        #: the gang minimum chosen for each job when it was last a candidate
        self.gang: dict[str, Minimum] = {}
        #: pods an action of this cycle left waiting, with the reasons (the cycle keeps it)
        self.unschedulable: dict[str, list[Reason]] = {}
        #: queue name -> (order key, candidate) for its subtree; see `pick`
        self.order_cache: dict[str, tuple[tuple[object, ...] | None, Candidate | None]] = {}
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
        jobs = st.jobs
        for name in sorted(st.pending_jobs):
            leaf = self.queues.get(name)
            if leaf is None:
                continue
            entries = []
            for index_key in st.pending_jobs[name]:
                job = jobs[job_key_of_index(index_key)]
                stage = 0 if job.occupying < job.min_member else 1
                entries.append((-job.priority, stage, job.created_ns, job.uid, job.key))
            leaf.jobs = SortedList(entries)
        for name, node in self.queues.items():
            q = st.queues[name]
            own = (q.allocated_milli_gpu, q.allocated_milli_cpu, q.allocated_memory_bytes)
            np = (q.nonpreemptible_milli_gpu, q.nonpreemptible_milli_cpu, q.nonpreemptible_memory_bytes)
            for anc in node.chain:
                anc.allocated = _add(anc.allocated, own)
                anc.nonpreemptible = _add(anc.nonpreemptible, np)
        time_based = None
        if self.usage is not None and self.config is not None:
            time_based = TimeBased(self.usage, self.config.fairshare.k)
        shares = shares_for_state(st, self.gpu_share_unit, time_based)
        for name, node in self.queues.items():
            node.fair = (shares["gpu"][name].fair_share, shares["cpu"][name].fair_share,
                         shares["memory"][name].fair_share)
            self.fair_shares[name] = node.fair

    # -- accounting (the Plan's listener) -----------------------------------------------------

    def on_operation(self, op: Operation, sign: int) -> None:
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
        delta = _scale(used, sign)
        cache = self.order_cache
        for q in leaf.chain:
            q.allocated = _add(q.allocated, delta)
            if not job.preemptible:
                q.nonpreemptible = _add(q.nonpreemptible, delta)
            cache.pop(q.name, None)

    # -- order ------------------------------------------------------------------------------

    def candidate(self, leaf: QueueNode) -> tuple[Job, list[PodState], Vector] | None:
        """The leaf's next job with the pods it would place now and their total request."""
        while leaf.jobs:
            key = leaf.jobs[0][4]
            job = self.state.jobs[key]
            pods = [self.state.pods[e[3]] for e in job.pending if e[3] not in self.done]
            if not pods:
                leaf.jobs.pop(0)
                continue
            if _one_pod(job):
                # a job of one pod: its minimum is that pod (the common case, kept cheap)
                self.gang[key] = Minimum(tuple(pods))
                return job, pods, pod_request(pods[0].spec, self.gpu_memory_hint)
            _, chosen = self._minimum_of(job, pods)
            return job, chosen, self.request_of(chosen)
        return None

    def job_candidate(self, job: Job, exclude: set[str] | None = None
                      ) -> tuple[list[PodState], Vector] | None:
        """The pods of `job` to place now (its gang minimum, else one elastic pod) among its
        pending pods not in `exclude` (default: those decided this cycle) and their request, or
        None when it has nothing to place or its minimum cannot exist (recorded in `gang`)."""
        skip = self.done if exclude is None else exclude
        pods = [self.state.pods[e[3]] for e in job.pending if e[3] not in skip]
        if not pods:
            return None
        need, chosen = self._minimum_of(job, pods)
        if need.problem is not None:
            return None
        return chosen, self.request_of(chosen)

    def _minimum_of(self, job: Job, pending: list[PodState]) -> tuple[Minimum, list[PodState]]:
        """The job's gang minimum among `pending` (recorded in `gang`) and the pods to try now:
        the minimum, or one pod when the job is at its minimum."""
        occupying = [self.state.pods[m] for m in sorted(job.members)
                     if self.state.pods[m].status in OCCUPYING or m in self.placed_pods]
        need = minimum(job, pending, occupying)
        self.gang[job.key] = need
        return need, list(need.pods) or pending[:1]

    def request_of(self, pods: list[PodState]) -> Vector:
        """What `pods` would add to their queue (gpu-memory counted against the largest GPU)."""
        request = ZERO
        for pod in pods:
            request = _add(request, pod_request(pod.spec, self.gpu_memory_hint))
        return request

    def key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
        allocated, fair, quota = q.allocated, q.fair, q.quota
        over_all = allocated[0] > fair[0] and allocated[1] > fair[1] and allocated[2] > fair[2]
        over_quota = False
        share = 0
        for r in (0, 1, 2):
            need = request[r]
            used = allocated[r] + need
            if need > 0 and 0 <= quota[r] < used:
                over_quota = True
            if used > 0:
                s = used * SHARE_SCALE // fair[r] if fair[r] > 0 else INFINITE
                if s > share:
                    share = s
        if not self.kai_queue_order:
            return (over_all, over_quota, -q.priority, share, q.created_ns, q.name)
        zero_fair = False
        share_without = 0
        for r in (0, 1, 2):
            if fair[r] == 0 and allocated[r] + request[r] > 0:
                zero_fair = True
            if allocated[r] > 0:
                s = allocated[r] * SHARE_SCALE // fair[r] if fair[r] > 0 else INFINITE
                if s > share_without:
                    share_without = s
        return (over_all, over_quota, -q.priority, zero_fair, share, share_without, FairShareOrder(fair),
                q.created_ns, q.name)

    def pick(self, nodes: list[QueueNode]) -> Candidate | None:
        """The best (leaf, job, pods, request) below `nodes`. A queue's key and candidate depend
        only on its own subtree, so they are cached until a try below it changes something."""
        best: Candidate | None = None
        best_key: tuple[object, ...] | None = None
        for q in nodes:
            cand: Candidate | None
            cached = self.order_cache.get(q.name)
            if cached is None:
                if q.children:
                    cand = self.pick(q.children)
                elif q.jobs:
                    c = self.candidate(q)
                    cand = (q, *c) if c is not None else None
                else:
                    cand = None
                key = self.key(q, cand[3]) if cand is not None else None
                self.order_cache[q.name] = cached = (key, cand)
            key, cand = cached
            if cand is None:
                continue
            if best_key is None or key < best_key:  # type: ignore[operator]
                best, best_key = cand, key
        return best

    # -- rules ------------------------------------------------------------------------------

    def limits(self, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]:
        for q in leaf.chain:
            for r, resource in enumerate(RESOURCES):
                if request[r] <= 0:
                    continue
                if q.limit[r] >= 0 and q.allocated[r] + request[r] > q.limit[r]:
                    return [Reason(code=fw.QUEUE_LIMIT, message=(
                        f"queue {q.name} would exceed its {resource} limit: requested "
                        f"{_fmt(resource, request[r])}, allocated {_fmt(resource, q.allocated[r])}, "
                        f"limit {_fmt(resource, q.limit[r])}"),
                        numbers={"requested": request[r], "allocated": q.allocated[r], "limit": q.limit[r]})]
                if not job.preemptible and q.quota[r] >= 0 and q.nonpreemptible[r] + request[r] > q.quota[r]:
                    return [Reason(code=fw.NON_PREEMPTIBLE_OVER_QUOTA, message=(
                        f"non-preemptible job may not take queue {q.name} over its {resource} quota: "
                        f"requested {_fmt(resource, request[r])}, non-preemptible allocated "
                        f"{_fmt(resource, q.nonpreemptible[r])}, quota {_fmt(resource, q.quota[r])}"),
                        numbers={"requested": request[r], "allocated": q.nonpreemptible[r], "quota": q.quota[r]})]
        return []
