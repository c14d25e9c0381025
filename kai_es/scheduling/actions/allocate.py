"""The allocate action: place pending jobs onto idle capacity (or pipeline them onto capacity
being released), a gang's minimum atomically, elastic extras one by one.

Job order (this version): higher priority first, then older, then uid — across all queues.
Fair-share queue ordering replaces it when the queue semantics land (see ARCHITECTURE.md §6).

Contract: pure. Reads the state, writes only to the Plan and the returned outcome map.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.filters import constraint_key, eligibility
from kai_es.scheduling.plan import Entry, Plan
from kai_es.state.model import ClusterState, Job, PodState
from kai_es.state.reducer import job_key_of_index


@dataclass(slots=True)
class AllocateResult:
    placed: list[Entry] = field(default_factory=list)
    unschedulable: dict[str, list[Reason]] = field(default_factory=dict)


def ordered_jobs(state: ClusterState) -> Iterator[Job]:
    """Pending jobs of every queue, by (priority desc, creation, uid)."""
    buckets = [state.pending_jobs[q] for q in sorted(state.pending_jobs)]
    for index_key in heapq.merge(*buckets):
        yield state.jobs[job_key_of_index(index_key)]


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
    return f"pod {pod.key} ({gpu}, {pod.spec.requests.milli_cpu}m CPU)"


class Allocator:
    def __init__(self, state: ClusterState, plan: Plan, now_ns: int) -> None:
        self.state = state
        self.plan = plan
        self.now_ns = now_ns
        self.result = AllocateResult()
        self._masks: dict[tuple[object, ...], array[int]] = {}

    def mask(self, pod: PodState) -> array[int]:
        key = constraint_key(pod.spec)
        m = self._masks.get(key)
        if m is None:
            m = self._masks[key] = eligibility(self.plan.nodes, pod.spec)
        return m

    def run(self) -> AllocateResult:
        for job in ordered_jobs(self.state):
            self._job(job)
        return self.result

    def _fail_all(self, pods: list[PodState], reasons: list[Reason]) -> None:
        for pod in pods:
            self.result.unschedulable[pod.key] = reasons

    def _job(self, job: Job) -> None:
        pods = [self.state.pods[entry[3]] for entry in job.pending]
        if not job.queue:
            self._fail_all(pods, [Reason(code=fw.NO_QUEUE, message=(
                f"job {job.key} names no queue (label kai.scheduler/queue or PodGroup spec.queue)"))])
            return
        if job.queue not in self.state.queues:
            self._fail_all(pods, [Reason(code=fw.QUEUE_NOT_FOUND,
                                         message=f"queue {job.queue!r} does not exist")])
            return
        if job.spec is None and not job.implicit:
            self._fail_all(pods, [Reason(code=fw.PODGROUP_NOT_FOUND,
                                         message=f"PodGroup {job.key} does not exist yet")])
            return
        waiting = [pod for pod in pods if pod.backoff_until_ns > self.now_ns]
        if waiting:
            for pod in waiting:
                self.result.unschedulable[pod.key] = [Reason(
                    code=fw.BIND_BACKOFF,
                    message=f"binding failed {pod.bind_failures} time(s); retry after back-off",
                    numbers={"failures": pod.bind_failures,
                             "retry_at_ns": pod.backoff_until_ns})]
            pods = [pod for pod in pods if pod.backoff_until_ns <= self.now_ns]
        if not self.plan.nodes:
            self._fail_all(pods, [Reason(code=fw.NO_NODES, message="the cluster has no nodes")])
            return
        need = max(0, job.min_member - job.occupying)
        if need > len(pods) + len(waiting):
            self._fail_all(pods, [Reason(
                code=fw.GANG_INCOMPLETE,
                message=f"gang needs {job.min_member} pods but only "
                        f"{job.occupying + len(pods) + len(waiting)} exist",
                numbers={"min_member": job.min_member, "existing": job.occupying + len(pods) + len(waiting)})])
            return
        if need > len(pods):
            self._fail_all(pods, [Reason(
                code=fw.GANG_UNSATISFIED,
                message=f"gang needs {need} more pods placed at once; {len(waiting)} are backing off",
                numbers={"min_member": job.min_member, "needed": need})])
            return
        cp = self.plan.checkpoint()
        gang: list[Entry] = []
        for i, pod in enumerate(pods[:need]):
            entry, answer = self.plan.place(pod.key, pod.spec, self.mask(pod))
            if entry is None:
                self.plan.rollback(cp)
                node_reason = fw.no_node_fits(answer.rejections, len(self.plan.nodes), _what(pod))
                gang_reason = Reason(
                    code=fw.GANG_UNSATISFIED,
                    message=f"gang needs {need} pods placed at once; only {i} fit",
                    numbers={"min_member": job.min_member, "needed": need, "fit": i})
                reasons = [node_reason] if need == 1 else [gang_reason, node_reason]
                self._fail_all(pods, reasons)
                return
            gang.append(entry)
        if any(e.pipelined for e in gang):
            for e in gang:
                e.pipelined = True
        self.result.placed.extend(gang)
        for pod in pods[need:]:  # elastic extras, one at a time
            entry, answer = self.plan.place(pod.key, pod.spec, self.mask(pod))
            if entry is None:
                self.result.unschedulable[pod.key] = [
                    fw.no_node_fits(answer.rejections, len(self.plan.nodes), _what(pod))]
                continue
            self.result.placed.append(entry)
