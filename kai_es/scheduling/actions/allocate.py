"""The allocate action: place pending jobs onto idle capacity (or pipeline them onto capacity
being released); a gang's minimum atomically, elastic extras one at a time, interleaved with
other queues.

Which job goes next (KAI's order, level by level down the queue tree; first difference decides):
  1. queues not over their fair share in every resource before those that are;
  2. queues that stay within quota with the candidate job before those that would not;
  3. higher queue priority;
  4. smaller dominant-resource share including the candidate job (DRF: max over resources of
     (allocated + candidate) / fair share, as an integer in units of 1e-12);
  5. older queue, then name.
Within a leaf queue: higher job priority, jobs below their gang minimum before elastic extras,
older, then uid.

Rules enforced before a job is tried: it may not take its queue or any ancestor over its limit
(any job), nor over its quota (non-preemptible jobs, counting only non-preemptible usage).

Contract: pure. Reads the state, writes only to the Plan and the returned result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedList

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.fairshare import RESOURCES, shares_for_state
from kai_es.scheduling.fairshare import pod_request
from kai_es.scheduling.predicates.eligibility import Eligibility
from kai_es.scheduling.gang import Minimum, minimum
from kai_es.scheduling.plan import Entry, Plan
from kai_es.state.model import OCCUPYING, ClusterState, Job, PodState
from kai_es.state.reducer import device_milli_on, job_key_of_index

Vector = tuple[int, int, int]  # (milli-GPU, milli-CPU, bytes), in RESOURCES order
Candidate = tuple["QueueNode", Job, list[PodState], Vector]
ZERO: Vector = (0, 0, 0)
#: DRF shares are compared as floor(used * SHARE_SCALE / fair share): integers, exact to 1e-12
SHARE_SCALE = 10**12
INFINITE = 10**40


def _add(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


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


@dataclass(slots=True)
class AllocateResult:
    placed: list[Entry] = field(default_factory=list)
    unschedulable: dict[str, list[Reason]] = field(default_factory=dict)
    fair_shares: dict[str, Vector] = field(default_factory=dict)


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


class Allocator:
    def __init__(self, state: ClusterState, plan: Plan, now_ns: int) -> None:
        self.state = state
        self.plan = plan
        self.now_ns = now_ns
        self.result = AllocateResult()
        self.eligibility = Eligibility(state, plan.names, plan.nodes)
        plan.listeners.append(self.eligibility)
        self.gpu_memory_hint = max((n.spec.gpu_memory_mib for n in plan.nodes), default=0)
        self.queues: dict[str, QueueNode] = {}
        self.roots: list[QueueNode] = []
        self._build_queues()

    # -- setup ------------------------------------------------------------------------------

    def _build_queues(self) -> None:
        st = self.state
        for name in sorted(st.queues):
            spec = st.queues[name].spec
            self.queues[name] = QueueNode(
                name=name, parent=None, priority=spec.priority, created_ns=spec.created_ns,
                quota=(spec.gpu.quota, spec.cpu.quota, spec.memory.quota),
                limit=(spec.gpu.limit, spec.cpu.limit, spec.memory.limit))
        for name in sorted(self.queues):
            node = self.queues[name]
            parent = self.queues.get(st.queues[name].spec.parent)
            if parent is not None and parent is not node and not _is_descendant(parent, node, st):
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
        shares = shares_for_state(st)
        for name, node in self.queues.items():
            node.fair = (shares["gpu"][name].fair_share, shares["cpu"][name].fair_share,
                         shares["memory"][name].fair_share)
            self.result.fair_shares[name] = node.fair

    def _no_fit(self, pod: PodState, answer_rejections: tuple[int, ...]) -> list[Reason]:
        """Why `pod` fits no node: NoNodeFits with per-cause node counts, then one detail
        reason per predicate beyond stage 1 that excluded nodes."""
        what = _what(pod)
        nodes = len(self.plan.nodes)
        if not answer_rejections[0] or not _has_later_predicates(pod):
            return [fw.no_node_fits(answer_rejections, nodes, what)]
        stage1, extra, details = self.eligibility.explain(pod.spec)
        rejections = (stage1, *answer_rejections[1:])
        return [fw.no_node_fits(rejections, nodes, what, tuple(extra)), *details]

    # -- order ------------------------------------------------------------------------------

    def _candidate(self, leaf: QueueNode) -> tuple[Job, list[PodState], Vector] | None:
        """The leaf's next job with the pods it would place now and their total request."""
        while leaf.jobs:
            key = leaf.jobs[0][4]
            job = self.state.jobs[key]
            pods = [self.state.pods[e[3]] for e in job.pending if e[3] not in self._done]
            if not pods:
                leaf.jobs.pop(0)
                continue
            if _one_pod(job):
                # a job of one pod: its minimum is that pod (the common case, kept cheap)
                self._gang[key] = need = Minimum(tuple(pods))
                return job, pods, pod_request(pods[0].spec, self.gpu_memory_hint)
            occupying = [self.state.pods[m] for m in sorted(job.members)
                         if self.state.pods[m].status in OCCUPYING or m in self._placed_pods]
            need = minimum(job, pods, occupying)
            self._gang[key] = need
            chosen = list(need.pods) if (need.pods or need.problem is not None) else pods[:1]
            if not chosen:
                chosen = pods[:1]
            request = ZERO
            for pod in chosen:
                request = _add(request, pod_request(pod.spec, self.gpu_memory_hint))
            return job, chosen, request
        return None

    def _key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
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
        return (over_all, over_quota, -q.priority, share, q.created_ns, q.name)

    def _pick(self, nodes: list[QueueNode]) -> Candidate | None:
        """The best (leaf, job, pods, request) below `nodes`. A queue's key and candidate depend
        only on its own subtree, so they are cached until a try below it changes something."""
        best: Candidate | None = None
        best_key: tuple[object, ...] | None = None
        for q in nodes:
            cand: Candidate | None
            cached = self._cache.get(q.name)
            if cached is None:
                if q.children:
                    cand = self._pick(q.children)
                elif q.jobs:
                    c = self._candidate(q)
                    cand = (q, *c) if c is not None else None
                else:
                    cand = None
                key = self._key(q, cand[3]) if cand is not None else None
                self._cache[q.name] = cached = (key, cand)
            key, cand = cached
            if cand is None:
                continue
            if best_key is None or key < best_key:  # type: ignore[operator]
                best, best_key = cand, key
        return best

    # -- run --------------------------------------------------------------------------------

    def run(self) -> AllocateResult:
        self._done: set[str] = set()
        self._placed_pods: set[str] = set()
        self._gang: dict[str, Minimum] = {}
        self._unqueued()
        if not self.plan.nodes:
            for name in sorted(self.state.pending_jobs):
                for index_key in self.state.pending_jobs[name]:
                    job = self.state.jobs[job_key_of_index(index_key)]
                    self._fail_all([self.state.pods[e[3]] for e in job.pending],
                                   [Reason(code=fw.NO_NODES, message="the cluster has no nodes")])
            return self.result
        self._cache: dict[str, tuple[tuple[object, ...] | None, Candidate | None]] = {}
        while True:
            pick = self._pick(self.roots)
            if pick is None:
                break
            leaf, job, pods, request = pick
            if not self._try(leaf, job, pods, request):
                self._drop_hopeless(leaf)
            for q in leaf.chain:
                self._cache.pop(q.name, None)
        return self.result

    def _drop_hopeless(self, leaf: QueueNode) -> None:
        """Fail, from the head of `leaf`, the single-pod jobs whose outcome cannot depend on when
        they are tried: their shape already failed on their nodes this cycle (`known_failure`;
        free capacity only shrinks within a cycle), no limit or quota of the leaf's chain can
        stop them first, they are not backing off and their PodGroup exists. Tried one by one
        through the queue order, each would get exactly these reasons and change nothing; in a
        backlogged cycle this saves re-ordering the queues once per pending job."""
        jobs = leaf.jobs
        state, done, plan = self.state, self._done, self.plan
        while jobs:
            job = state.jobs[jobs[0][4]]
            pods = [state.pods[e[3]] for e in job.pending if e[3] not in done]
            if not pods:
                del jobs[0]  # as _candidate would
                continue
            if not _one_pod(job) or (job.spec is None and not job.implicit):
                return
            pod = pods[0]
            if pod.backoff_until_ns > self.now_ns:
                return
            request = pod_request(pod.spec, self.gpu_memory_hint)
            for q in leaf.chain:
                for r in (0, 1, 2):
                    if request[r] > 0 and (q.limit[r] >= 0 or (not job.preemptible and q.quota[r] >= 0)):
                        return
            if self.eligibility.is_dynamic(pod.spec) or pod.spec.claims or pod.spec.config_maps:
                return
            known = plan.known_failure(pod.spec, self.eligibility.static_mask(pod.spec))
            if known is None:
                return
            self._fail_all([pod], self._no_fit(pod, tuple(known.rejections)))
            del jobs[0]

    def _unqueued(self) -> None:
        """Jobs whose queue is missing or not a leaf: Pending, with the reason."""
        for name in sorted(self.state.pending_jobs):
            leaf = self.queues.get(name)
            if leaf is not None and not leaf.children:
                continue
            for index_key in self.state.pending_jobs[name]:
                job = self.state.jobs[job_key_of_index(index_key)]
                pods = [self.state.pods[e[3]] for e in job.pending]
                if not job.queue:
                    reason = Reason(code=fw.NO_QUEUE, message=(
                        f"job {job.key} names no queue (label kai.scheduler/queue or PodGroup spec.queue)"))
                elif leaf is None:
                    reason = Reason(code=fw.QUEUE_NOT_FOUND, message=f"queue {job.queue!r} does not exist")
                else:
                    reason = Reason(code=fw.QUEUE_NOT_LEAF,
                                    message=f"queue {job.queue!r} is a parent queue; only leaf queues hold jobs")
                self._fail_all(pods, [reason])

    def _fail_all(self, pods: list[PodState], reasons: list[Reason]) -> None:
        for pod in pods:
            self._done.add(pod.key)
            self.result.unschedulable[pod.key] = reasons

    def _drop_job(self, leaf: QueueNode, job: Job, reasons: list[Reason]) -> None:
        """The job can do nothing more this cycle: every remaining pending pod gets `reasons`."""
        self._fail_all([self.state.pods[e[3]] for e in job.pending if e[3] not in self._done], reasons)

    def _limits(self, leaf: QueueNode, job: Job, request: Vector) -> list[Reason]:
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

    def _commit(self, leaf: QueueNode, job: Job, entries: list[Entry]) -> None:
        total = ZERO
        for e in entries:
            spec = self.state.pods[e.pod_key].spec
            # placed: the GPU share is known exactly, as the reducer will count it
            used: Vector = (device_milli_on(self.plan.nodes[e.node].spec, spec.gpu) * len(e.devices),
                            spec.requests.milli_cpu, spec.requests.memory_bytes)
            total = _add(total, used)
            self._done.add(e.pod_key)
            self._placed_pods.add(e.pod_key)
        for q in leaf.chain:
            q.allocated = _add(q.allocated, total)
            if not job.preemptible:
                q.nonpreemptible = _add(q.nonpreemptible, total)
        self.result.placed.extend(entries)

    def _requeue(self, leaf: QueueNode, job: Job) -> None:
        """After progress, the job competes again for its remaining pods as an elastic job."""
        assert leaf.jobs is not None
        jobs = leaf.jobs
        if jobs and jobs[0][4] == job.key:  # the job just tried is the head (see _candidate)
            del jobs[0]
        else:
            for stage in (0, 1):
                jobs.discard((-job.priority, stage, job.created_ns, job.uid, job.key))
        done = self._done
        for e in job.pending:
            if e[3] not in done:
                jobs.add((-job.priority, 1, job.created_ns, job.uid, job.key))
                break

    def _try(self, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector) -> bool:
        """Place the job's pods now, all or none; False (and reasons recorded) if it cannot."""
        assert leaf.jobs is not None
        need = self._gang[job.key]
        gang_stage = bool(need.pods) or need.problem is not None
        if job.spec is None and not job.implicit:
            self._drop_job(leaf, job, [Reason(code=fw.PODGROUP_NOT_FOUND,
                                              message=f"PodGroup {job.key} does not exist yet")])
            return False
        waiting = [pod for pod in pods if pod.backoff_until_ns > self.now_ns]
        if waiting:
            for pod in waiting:
                self._done.add(pod.key)
                self.result.unschedulable[pod.key] = [Reason(
                    code=fw.BIND_BACKOFF, message=f"binding failed {pod.bind_failures} time(s); retry after back-off",
                    numbers={"failures": pod.bind_failures, "retry_at_ns": pod.backoff_until_ns})]
            if gang_stage:
                self._drop_job(leaf, job, [Reason(
                    code=fw.GANG_UNSATISFIED, message=f"gang needs {len(pods)} pods placed at once; "
                    f"{len(waiting)} are backing off after failed binds",
                    numbers={"min_member": job.min_member, "backing_off": len(waiting)})])
            return False
        if need.problem is not None:
            self._drop_job(leaf, job, [need.problem])
            return False
        limit_reasons = self._limits(leaf, job, request)
        if limit_reasons:
            self._drop_job(leaf, job, limit_reasons)
            return False
        for pod in pods:
            problem = self.eligibility.pod_problem(pod.spec)
            if problem is not None:
                self._drop_job(leaf, job, [problem])
                return False
        cp = self.plan.checkpoint()
        entries: list[Entry] = []
        eligibility = self.eligibility
        for i, pod in enumerate(pods):
            mask, dynamic = eligibility.mask(pod.spec)
            levels = eligibility.levels(pod.spec, mask) if (
                pod.spec.preferred_affinity or pod.spec.preferred_pod_affinity
                or pod.spec.preferred_pod_anti_affinity or eligibility.affinity.has_holders()) else None
            entry, answer = self.plan.place(pod.key, pod.spec, mask, settled=not entries,
                                            remember=not dynamic, levels=levels)
            if entry is None:
                node_reasons = self._no_fit(pod, tuple(answer.rejections))
                self.plan.rollback(cp)
                if gang_stage and len(pods) > 1:
                    reasons = [Reason(code=fw.GANG_UNSATISFIED,
                                      message=f"gang needs {len(pods)} pods placed at once; only {i} fit",
                                      numbers={"min_member": job.min_member, "needed": len(pods), "fit": i}),
                               *node_reasons]
                else:
                    reasons = node_reasons
                self._drop_job(leaf, job, reasons)
                return False
            entries.append(entry)
        if gang_stage and any(e.pipelined for e in entries):
            for e in entries:
                e.pipelined = True
        self._commit(leaf, job, entries)
        self._requeue(leaf, job)
        return True


def _has_later_predicates(pod: PodState) -> bool:
    """Whether a predicate beyond stage 1 (see `kai_es.scheduling.predicates`) may have
    excluded nodes for this pod."""
    spec = pod.spec
    return bool(spec.claims or spec.scalar_requests or spec.host_ports or spec.pod_affinity
                or spec.pod_anti_affinity or spec.labels)


def _is_descendant(candidate: QueueNode, node: QueueNode, state: ClusterState) -> bool:
    """Whether `candidate` (a prospective parent) lies below `node` (a cycle in parentQueue)."""
    seen = set()
    name = candidate.name
    while name and name not in seen:
        if name == node.name:
            return True
        seen.add(name)
        q = state.queues.get(name)
        name = q.spec.parent if q is not None else ""
    return False
