"""Queue depth: how many of a queue's waiting jobs an action considers (KAI's
`queueDepthPerAction`, a SchedulingShard and scheduler-config setting: action -> N).

- `NoQueueDepthV12` (kai-es/v1 to v12): every job; a config that sets a depth is refused (it
  would be silently ignored).
- `FirstJobsOfEachQueue` (kai-es/v13 on): an action named in the config's
  `queueDepthPerAction` considers, in each leaf queue, only the first N of its waiting jobs in
  KAI's job order (priority, a gang below its minimum first, age), as they stand when the action
  starts; a job not ready for scheduling (`rules.scheduling_readiness`, kai-es/v14 on) takes
  no place, as KAI filters such jobs out before it fills the queue. KAI bounds each queue's heap
  of jobs at N as it fills it from a Go map, so which jobs it keeps can depend on the map's
  order when more than N wait; kai-es keeps the first N, the
  ones KAI's order would try first, so the same log gives the same decisions. Allocate tells
  each job it leaves out why (`BeyondQueueDepth`, its place and the depth: KAI says nothing);
  reclaim, preempt and consolidation pass over such jobs as KAI does, and their pods keep what
  allocate told them.

Contract: pure; `limit_allocate` writes only the allocator's reasons (and marks those pods done
for the cycle's allocate); `within` filters a preemptor list, keeping its order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.session import QueueNode, Session
from kai_es.state.model import Job

if TYPE_CHECKING:
    from kai_es.scheduling.actions.allocate import Allocator


class QueueDepth(Protocol):
    #: whether a config may set `queueDepthPerAction`
    honours_depth: bool

    def limit_allocate(self, allocator: Allocator) -> None:
        """Before allocate tries anything: leave out each queue's jobs beyond its depth."""

    def within(self, session: Session, action: str, jobs: list[tuple[QueueNode, Job]]
               ) -> list[tuple[QueueNode, Job]]:
        """`jobs` (preemptors, each leaf's in its job order) without those beyond their queue's
        depth for `action`."""


class NoQueueDepthV12:
    __slots__ = ()
    honours_depth = False

    def limit_allocate(self, allocator: Allocator) -> None:
        return None

    def within(self, session: Session, action: str, jobs: list[tuple[QueueNode, Job]]
               ) -> list[tuple[QueueNode, Job]]:
        return jobs


def _depth(session: Session, action: str) -> int | None:
    config = session.config
    return None if config is None else config.queue_depth_per_action.get(action)  # type: ignore[call-overload]


class FirstJobsOfEachQueue:
    __slots__ = ()
    honours_depth = True

    def limit_allocate(self, allocator: Allocator) -> None:
        session = allocator.session
        depth = _depth(session, "allocate")
        if depth is None:
            return
        state = session.state
        ready = session.rules.scheduling_readiness.ready
        for name in sorted(session.queues):
            leaf = session.queues[name]
            if leaf.children or not leaf.jobs or len(leaf.jobs) <= depth:
                continue
            # (KAI's job order, without the jobs not ready for scheduling: they hold no place)
            seen = [key for key in dict.fromkeys(entry.job_key for entry in leaf.jobs)
                    if ready(session, state.jobs[key])]
            for place, job_key in enumerate(seen[depth:], depth + 1):
                job = state.jobs[job_key]
                reason = Reason(code=fw.BEYOND_QUEUE_DEPTH, message=(
                    f"job {job_key} is #{place} of {len(seen)} waiting in queue {name}; allocate considers the "
                    f"first {depth} of each queue (queueDepthPerAction.allocate)"),
                    numbers={"position": place, "depth": depth})
                allocator.fail_all([state.pods[e.pod_key] for e in job.pending], [reason])

    def within(self, session: Session, action: str, jobs: list[tuple[QueueNode, Job]]
               ) -> list[tuple[QueueNode, Job]]:
        depth = _depth(session, action)
        if depth is None:
            return jobs
        taken: dict[str, int] = {}
        out = []
        ready = session.rules.scheduling_readiness.ready
        for leaf, job in jobs:
            if not ready(session, job):  # (no place in the depth: KAI's job order never holds it)
                out.append((leaf, job))
                continue
            n = taken.get(leaf.name, 0)
            if n < depth:
                taken[leaf.name] = n + 1
                out.append((leaf, job))
        return out
