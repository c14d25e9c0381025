"""The allocate action: place pending jobs onto idle capacity (or pipeline them onto capacity
being released); a gang's minimum atomically, elastic extras one at a time, interleaved with
other queues. Which job goes next, and the limit and quota rules, are the Session's
(`kai_es.scheduling.session`).

Rules enforced before a job is tried: it may not take its queue or any ancestor over its limit
(any job), nor over its quota (non-preemptible jobs, counting only non-preemptible usage).

Contract: pure. Reads the state, writes only to the Session's Plan and the returned result.
"""

from __future__ import annotations

from dataclasses import dataclass

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.packing import PackingError
from kai_es.scheduling.plan import Entry
from kai_es.scheduling.session import QueuedJob, QueueNode, Session, _what
from kai_es.scheduling.topology import INVALID_TOPOLOGY_CONSTRAINT, constrained
from kai_es.state.keys import job_key_of_index
from kai_es.state.model import ClusterState, Job, PodState
from kai_es.state.quantities import Vector


def nominated_jobs(state: ClusterState) -> list[Job]:
    """The pending jobs with a pending pod nominated to a node (pipelined there by an earlier
    cycle, or holding the room kept for a moved pod), in the order allocate tries them first:
    higher priority, older, uid. Found from `state.nominated`, not from every pending pod."""
    jobs: dict[str, Job] = {}
    for key in sorted(state.nominated):
        pod = state.pods[key]
        if pod.pending_key is not None:  # (a pod in its job's pending pods: the job is pending)
            job = state.jobs[pod.job_key]
            jobs[job.key] = job
    return [jobs[k] for k in sorted(jobs, key=lambda k: (-jobs[k].priority, jobs[k].created_ns, jobs[k].uid, k))]


class Allocator:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.state = session.state
        self.plan = session.plan
        self.now_ns = session.now_ns
        self.eligibility = session.eligibility
        self.result = fw.ActionResult()

    def no_fit(self, pod: PodState, answer_rejections: tuple[int, ...]) -> list[Reason]:
        """Why `pod` fits no node: NoNodeFits with per-cause node counts, then one detail
        reason per predicate beyond stage 1 that excluded nodes (inside a topology domain: the
        nodes outside it counted as such, without the detail reasons)."""
        what = _what(pod)
        nodes = len(self.plan.nodes)
        restriction = self.eligibility.restriction
        if restriction is not None:  # kai-es/v5: placed inside one topology domain
            outside = nodes - sum(restriction)
            inside = (answer_rejections[0] - outside, *answer_rejections[1:])
            return [fw.no_node_fits(inside, nodes, what, (("outside_domain", "outside the topology domain tried",
                                                          outside),))]
        if not answer_rejections[0] or not _has_later_predicates(pod):
            return [fw.no_node_fits(answer_rejections, nodes, what)]
        stage1, extra, details = self.eligibility.explain(pod.spec)
        rejections = (stage1, *answer_rejections[1:])
        return [fw.no_node_fits(rejections, nodes, what, tuple(extra)), *details]

    # -- run --------------------------------------------------------------------------------

    def run(self) -> fw.ActionResult:
        session = self.session
        self._done = session.done
        self._unqueued()
        if not self.plan.nodes:
            for name in sorted(self.state.pending_jobs):
                for index_key in self.state.pending_jobs[name]:
                    job = self.state.jobs[job_key_of_index(index_key)]
                    self.fail_all([self.state.pods[e.pod_key] for e in job.pending],
                                   [Reason(code=fw.NO_NODES, message="the cluster has no nodes")])
            return self.result
        session.rules.queue_depth.limit_allocate(self)
        self._nominated()
        session.rules.gang_restoration.restore(self)
        after_miss = session.rules.hopeless_batch.after_miss
        while True:
            pick = session.pick(session.roots)
            if pick is None:
                break
            leaf, job, pods, request = pick
            if not self._try(leaf, job, pods, request):
                after_miss(self, leaf)
            session.forget_order(leaf)
        return self.result

    def _nominated(self) -> None:
        """Jobs with a pod pipelined by an earlier cycle go first, onto the node reserved for it
        (KAI's nominated node): the capacity its victims released is not given to anyone else."""
        for job in nominated_jobs(self.state):
            self.try_ahead(job)

    def try_ahead(self, job: Job) -> None:
        """Try `job` ahead of the queue order (its leaf queue's limits and quota still hold)."""
        session = self.session
        leaf = session.queues.get(job.queue)
        if leaf is None or leaf.children or leaf.jobs is None:
            return
        picked = session.job_candidate(job)
        if picked is not None:
            self._try(leaf, job, *picked)

    def _unqueued(self) -> None:
        """Jobs whose queue is missing or not a leaf: Pending, with the reason."""
        for name in sorted(self.state.pending_jobs):
            leaf = self.session.queues.get(name)
            if leaf is not None and not leaf.children:
                continue
            for index_key in self.state.pending_jobs[name]:
                job = self.state.jobs[job_key_of_index(index_key)]
                pods = [self.state.pods[e.pod_key] for e in job.pending]
                loop = self.session.looping.get(name)
                if not job.queue:
                    reason = Reason(code=fw.NO_QUEUE, message=(
                        f"job {job.key} names no queue (label kai.scheduler/queue or PodGroup spec.queue)"))
                elif loop is not None:
                    reason = Reason(code=fw.QUEUE_LOOP, message=(
                        f"queue {job.queue!r} never reaches a root queue: parentQueue {' -> '.join(loop)}"))
                elif leaf is None:
                    reason = Reason(code=fw.QUEUE_NOT_FOUND, message=f"queue {job.queue!r} does not exist")
                else:
                    reason = Reason(code=fw.QUEUE_NOT_LEAF,
                                    message=f"queue {job.queue!r} is a parent queue; only leaf queues hold jobs")
                self.fail_all(pods, [reason])

    def fail_all(self, pods: list[PodState], reasons: list[Reason]) -> None:
        for pod in pods:
            self._done.add(pod.key)
            self.result.unschedulable[pod.key] = reasons

    def _drop_job(self, leaf: QueueNode, job: Job, reasons: list[Reason]) -> None:
        """The job can do nothing more this cycle: every remaining pending pod gets `reasons`."""
        self.fail_all([self.state.pods[e.pod_key] for e in job.pending if e.pod_key not in self._done], reasons)

    def _commit(self, entries: list[Entry]) -> None:
        """The job's placements stand (the queue accounting already follows the Plan)."""
        placed = self.session.placed_pods
        for e in entries:
            self._done.add(e.pod_key)
            placed.add(e.pod_key)
        self.result.placed.extend(entries)

    def _requeue(self, leaf: QueueNode, job: Job) -> None:
        """After progress, the job competes again for its remaining pods as an elastic job."""
        assert leaf.jobs is not None
        jobs = leaf.jobs
        if jobs and jobs[0].job_key == job.key:  # the job just tried is the head (see _candidate)
            del jobs[0]
        else:
            for stage in (0, 1):
                jobs.discard(QueuedJob(-job.priority, stage, job.created_ns, job.uid, job.key))
        done = self._done
        for e in job.pending:
            if e.pod_key not in done:
                jobs.add(QueuedJob(-job.priority, 1, job.created_ns, job.uid, job.key))
                break

    def _try(self, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector) -> bool:
        """Place the job's pods now, all or none; False (and reasons recorded) if it cannot."""
        assert leaf.jobs is not None
        need = self.session.gang[job.key]
        if need.problem is None or need.problem.code != fw.NOT_READY:
            self.session.tried.setdefault(job.key)  # (a job not ready is not in KAI's job order)
        gang_stage = bool(need.pods) or need.problem is not None
        if job.spec is None and not job.implicit:
            self._drop_job(leaf, job, [Reason(code=fw.PODGROUP_NOT_FOUND,
                                              message=f"PodGroup {job.key} does not exist yet")])
            return False
        waiting = [pod for pod in pods if pod.backoff_until_ns > self.now_ns or pod.bind_final_message]
        if waiting:
            for pod in waiting:
                self._done.add(pod.key)
                self.result.unschedulable[pod.key] = [Reason(
                    code=fw.BIND_FAILED_PERMANENTLY, message=(
                        f"binding failed {pod.bind_failures} time(s) and the binder gave up: "
                        f"{pod.bind_final_message} (retried when the pod changes or is recreated)"),
                    numbers={"failures": pod.bind_failures})] if pod.bind_final_message else [Reason(
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
        limit_reasons = self.session.limits(leaf, job, request)
        if limit_reasons:
            self._drop_job(leaf, job, limit_reasons)
            return False
        for pod in pods:
            problem = self.eligibility.pod_problem(pod.spec)
            if problem is not None:
                self._drop_job(leaf, job, [problem])
                return False
        cp = self.plan.checkpoint()
        topology = self.session.topology
        if topology is not None and constrained(job.spec):
            def flat(group: list[PodState], explain: bool) -> tuple[list[Entry] | None, list[Reason]]:
                got = self._place_each(group, cp, explain, as_gang=False)
                return (None, got.reasons) if isinstance(got, _Miss) else (got, [])

            placed, reasons = topology.place(job, pods, flat, self.session.request_of)
            if placed is None:
                self.plan.rollback(cp)
                if gang_stage and len(pods) > 1 and reasons[0].code != INVALID_TOPOLOGY_CONSTRAINT:
                    reasons = [Reason(code=fw.GANG_UNSATISFIED, message=(
                        f"gang needs {len(pods)} pods placed at once within its topology constraints"),
                        numbers={"min_member": job.min_member, "needed": len(pods)}), *reasons]
                self._drop_job(leaf, job, reasons)
                return False
            entries = placed
        else:
            miss = self._place_each(pods, cp)
            if isinstance(miss, _Miss):
                self.plan.rollback(cp)
                self._drop_job(leaf, job, miss.reasons)
                return False
            entries = miss
        if gang_stage and any(e.pipelined for e in entries):
            for e in entries:
                e.gang_pipelined = True  # announced as pipelined; its capacity stays held
        self._commit(entries)
        self._requeue(leaf, job)
        return True

    def _place_each(self, pods: list[PodState], cp: int, explain: bool = True, as_gang: bool = True
                    ) -> list[Entry] | _Miss:
        """Place `pods` one by one on the masks the eligibility hands out now (idle capacity
        first, else pipelined): their entries, or the miss with its reasons (rendered before
        the caller rolls the Plan back to `cp`, when `explain`; placements after `cp` count as
        tentative). `as_gang`: `pods` are the job's whole try, whose gang reason leads."""
        entries: list[Entry] = []
        eligibility = self.eligibility
        job_pods = len(pods)
        for i, pod in enumerate(pods):
            mask, dynamic = eligibility.mask(pod.spec)
            levels = eligibility.levels(pod.spec, mask) if (
                pod.spec.preferred_affinity or pod.spec.preferred_pod_affinity
                or pod.spec.preferred_pod_anti_affinity or eligibility.affinity.has_holders()) else None
            if pod.nominated_node:
                levels = self.plan.nominated_first(pod.nominated_node, mask, levels)
            try:
                entry, answer = self.plan.place(pod.key, pod.spec, mask, settled=self.plan.checkpoint() == cp,
                                                remember=not dynamic, levels=levels)
            except PackingError as exc:  # a request the packer cannot represent: this job only
                return _Miss([Reason(code=fw.INVALID_REQUEST,
                                     message=f"pod {pod.key} cannot be placed as requested: {exc}")])
            if entry is None:
                if not explain:
                    return _Miss([])
                node_reasons = self.no_fit(pod, tuple(answer.rejections))
                job = self.state.jobs[pod.job_key]
                need = self.session.gang[job.key]
                if as_gang and (bool(need.pods) or need.problem is not None) and job_pods > 1:
                    return _Miss([Reason(code=fw.GANG_UNSATISFIED,
                                         message=f"gang needs {job_pods} pods placed at once; only {i} fit",
                                         numbers={"min_member": job.min_member, "needed": job_pods, "fit": i}),
                                  *node_reasons])
                return _Miss(node_reasons)
            entries.append(entry)
        return entries


@dataclass(slots=True)
class _Miss:
    """A placement that failed, with the reasons for the pods (empty when not explained)."""

    reasons: list[Reason]


def _has_later_predicates(pod: PodState) -> bool:
    """Whether a predicate beyond stage 1 (see `kai_es.scheduling.predicates`) may have
    excluded nodes for this pod."""
    spec = pod.spec
    return bool(spec.claims or spec.scalar_requests or spec.host_ports or spec.pod_affinity
                or spec.pod_anti_affinity or spec.labels)


