"""The preempt action: within one queue, a job displaces preemptible jobs of strictly lower
priority. Victim choice and effort are the shared search's (`kai_es.scheduling.victims`); since
a victim's priority is always strictly lower, two jobs can never preempt each other."""

from __future__ import annotations

from collections.abc import Callable

from kai_es.scheduling.actions.preempting import PreemptingAction
from kai_es.scheduling.session import QueueNode
from kai_es.scheduling.victims import Unit
from kai_es.state.model import Job
from kai_es.state.quantities import Vector


class Preempt(PreemptingAction):
    name = "preempt"

    def victim_jobs(self, leaf: QueueNode, job: Job) -> list[Job]:
        return [v for v in self.occupying_jobs if v.queue == leaf.name and v.priority < job.priority]

    def min_runtime_protects(self, leaf: QueueNode, victim: Job, victim_leaf: QueueNode | None) -> bool:
        return self.session.rules.min_runtime.preempt_protected(self.session, victim, victim_leaf)

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        buckets = self.state.victim_jobs.get(leaf.name, {})
        return [(leaf.name, priority) for priority in sorted(buckets) if priority < job.priority]

    def no_victims(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return (f"no preemptible job of lower priority than {job.priority} runs in queue {leaf.name}",
                {"preemptor_priority": job.priority})

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        return lambda unit: unit.job.queue == leaf.name and unit.job.preemptible and unit.job.priority < job.priority

    def why(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], tuple[str, dict[str, int]]]:
        def why(unit: Unit) -> tuple[str, dict[str, int]]:
            return (f"preempted in queue {leaf.name} by job {job.key} (priority {job.priority} > {unit.job.priority})",
                    {"preemptor_priority": job.priority, "victim_priority": unit.job.priority,
                     "requested_milli_gpu": request[0]})

        return why
