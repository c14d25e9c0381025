"""The reclaim action: a queue below its fair share takes back capacity from queues above theirs.

Whether a job may reclaim, from which queues and which victims, is the policy version's rule
(`kai_es.scheduling.rules.reclaim_victims`: kai-es/v2 to v5 the dominant-share rules, kai-es/v6
KAI's reclaim strategies and saturation bound); effort and victim choice are the shared search's
(`kai_es.scheduling.victims`). Either way reclaim is one-directional: a queue that reclaimed is
at most at its fair share, so the queue it took from cannot take it back.
"""

from __future__ import annotations

from collections.abc import Callable

from kai_es.scheduling.actions.preempting import PreemptingAction, reason_numbers
from kai_es.scheduling.rules.reclaim_victims import sides
from kai_es.scheduling.session import QueueNode, Session
from kai_es.scheduling.victims import Unit
from kai_es.state.model import Job
from kai_es.state.quantities import Vector


class Reclaim(PreemptingAction):
    name = "reclaim"

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.judge = session.rules.reclaim_victims.judge(session)

    def victim_jobs(self, leaf: QueueNode, job: Job) -> list[Job]:
        queues = self.session.queues
        return [v for v in self.occupying_jobs if v.queue != leaf.name and v.queue in queues]

    def min_runtime_protects(self, leaf: QueueNode, victim: Job, victim_leaf: QueueNode | None) -> bool:
        return self.session.rules.min_runtime.reclaim_protected(self.session, leaf, victim, victim_leaf)

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        return self.judge.may_start(leaf, job, request)

    def why_not(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return self.judge.why_not(leaf, job, request)

    def search_failed(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        message, numbers = super().search_failed(leaf, job, request)
        note = self.session.rules.replacement_order.failed_search_note(
            self.session, leaf, lambda: (queue for queue, _ in self.victim_buckets(leaf, job, request)))
        return message + note, numbers

    def no_victims(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return (f"no other queue is above its fair share or quota in what job {job.key} requests, with "
                f"preemptible jobs queue {leaf.name} may take", {"requested_milli_gpu": request[0]})

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        return self.judge.victim_buckets(leaf, job, request)

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        return self.judge.admit(leaf, job, request)

    def settle(self, job: Job, start: int, request: Vector) -> bool:
        super().settle(job, start, request)  # re-placement first: a victim put back is no victim
        leaf = self.session.queues[job.queue]
        refused = self.judge.settle(leaf, job, request, start)
        if refused is None:
            return True
        self.refuse(job, *refused)
        return False

    def why(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], tuple[str, dict[str, int]]]:
        queues = self.session.queues

        def why(unit: Unit) -> tuple[str, dict[str, int]]:
            theirs = queues[unit.job.queue]
            message = (f"reclaimed for job {job.key} of queue {leaf.name} (at {leaf.allocated[0] / 1000:g} of "
                       f"{leaf.fair[0] / 1000:g} GPU fair share): queue {theirs.name} holds "
                       f"{theirs.allocated[0] / 1000:g} GPU over its fair share {theirs.fair[0] / 1000:g}")
            found = sides(leaf, theirs) if theirs.allocated[0] <= theirs.fair[0] else None
            if found is not None and found[2].priority < found[1].priority:
                # not over its fair share: taken by queue priority (queuePriorityInQuotaReclaim)
                _, mine, side = found
                message = (f"reclaimed for job {job.key} of queue {leaf.name}, within its deserved quota: queue "
                           f"{side.name} (priority {side.priority}) is of lower priority than queue {mine.name} "
                           f"(priority {mine.priority}), so its in-quota resources may be reclaimed")
            numbers = {**reason_numbers("reclaimer_queue", leaf.allocated, leaf.fair),
                       **reason_numbers("victim_queue", theirs.allocated, theirs.fair),
                       "requested_milli_gpu": request[0]}
            return message, numbers

        return why
