"""Hopeless batch: what allocate does after a job at a queue's head could not be placed.

- `HopelessBatchV1` (kai-es/v1, v2): it fails, from the head of that leaf queue, the single-pod
  jobs whose outcome cannot depend on when they are tried (`after_miss`), in one batch, without
  re-ordering the queues between them. It is NOT the same as trying them one by one through the
  queue order: under KAI's order a queue's place depends on its head job, so with a hopeless
  job at its head a queue may have gone after another queue that this batch lets it precede.
  The logs of v1 and v2 record it.
- `NoHopelessBatch` (kai-es/v3 on): nothing; each job is tried through the queue order, as KAI
  does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.fairshare import pod_request
from kai_es.scheduling.session import QueueNode, _one_pod

if TYPE_CHECKING:
    from kai_es.scheduling.actions.allocate import Allocator


class HopelessBatch(Protocol):
    def after_miss(self, allocator: Allocator, leaf: QueueNode) -> None:
        """Called when the job at the head of `leaf` could not be placed."""


class NoHopelessBatch:
    __slots__ = ()

    def after_miss(self, allocator: Allocator, leaf: QueueNode) -> None:
        return None


class HopelessBatchV1:
    __slots__ = ()

    def after_miss(self, allocator: Allocator, leaf: QueueNode) -> None:
        """Fail, from the head of `leaf`, the single-pod jobs whose outcome cannot depend on when
        they are tried: their shape already failed on their nodes this cycle (`known_failure`;
        free capacity only shrinks within a cycle), no limit or quota of the leaf's chain can
        stop them first, they are not backing off and their PodGroup exists. Each gets exactly
        the reasons a try would give; in a backlogged cycle this saves re-ordering the queues
        once per pending job."""
        jobs = leaf.jobs
        state, done, plan = allocator.state, allocator.session.done, allocator.plan
        eligibility = allocator.eligibility
        while jobs:
            job = state.jobs[jobs[0].job_key]
            pods = [state.pods[e.pod_key] for e in job.pending if e.pod_key not in done]
            if not pods:
                del jobs[0]  # as Session.candidate would
                continue
            if not _one_pod(job) or (job.spec is None and not job.implicit):
                return
            pod = pods[0]
            if pod.backoff_until_ns > allocator.now_ns or pod.bind_final_message:
                return
            request = pod_request(pod.spec, allocator.session.gpu_memory_hint)
            # a one-pod job's pod is its minimum: a semi-preemptible one's counts in quota
            bound = not job.preemptible or (job.semi and allocator.session.keeps_core and job.min_member > 0)
            for q in leaf.chain:
                for r in (0, 1, 2):
                    if request[r] > 0 and (q.limit[r] >= 0 or (bound and q.quota[r] >= 0)):
                        return
            if eligibility.is_dynamic(pod.spec) or pod.spec.claims or pod.spec.config_maps:
                return
            known = plan.known_failure(pod.spec, eligibility.static_mask(pod.spec))
            if known is None:
                return
            allocator.fail_all([pod], allocator.no_fit(pod, tuple(known.rejections)))
            del jobs[0]
