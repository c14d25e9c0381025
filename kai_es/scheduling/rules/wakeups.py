"""Wake-ups: the times at which a time rule (`min_runtime`, `preemption_delay`, `staleness`)
may change a cycle's decisions though nothing new was logged — a reason for the scheduler to
run a cycle then.

- `NoWakeupsV2` (kai-es/v1, v2: no time rules): none.
- `TimeRuleWakeups` (kai-es/v3 to v6): `due_times_ns`.
- `HandoverWakeups` (kai-es/v7 on): as v3, a preemption delay's end counted from the PodGroup's
  last-eviction timestamp too, and, while pods wait, the moments releasing pods become stuck
  (`rules.releasing_capacity`).
- `HoldingWakeups` (kai-es/v8 on): as v7, and, while pods wait, the moments holds of room for
  moved pods' replacements expire (`rules.move_holds`) and pending jobs' search back-offs end
  (`rules.search_backoff`).

Contract: pure functions of the folded state and the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.events.timefmt import parse_duration, parse_signed_duration
from kai_es.scheduling.rules.min_runtime import job_started_ns
from kai_es.scheduling.rules.preemption_delay import may_trigger_evictions_from_ns
from kai_es.scheduling.rules.releasing_capacity import deleting_pods
from kai_es.scheduling.rules.staleness import stale_deadline_ns
from kai_es.state.keys import job_key_of_index
from kai_es.state.model import MOVE_HOLD_NS, ClusterState

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig


class Wakeups(Protocol):
    def due_times_ns(self, state: ClusterState, config: SchedulerConfig) -> list[int]:
        """Sorted times at which a cycle may decide otherwise with nothing new logged."""


class NoWakeupsV2:
    __slots__ = ()

    def due_times_ns(self, state: ClusterState, config: SchedulerConfig) -> list[int]:
        return []


class TimeRuleWakeups:
    __slots__ = ()

    def due_times_ns(self, state: ClusterState, config: SchedulerConfig) -> list[int]:
        return due_times_ns(state, config)


class HandoverWakeups:
    __slots__ = ()

    def due_times_ns(self, state: ClusterState, config: SchedulerConfig) -> list[int]:
        return due_times_ns(state, config, v7=True)


class HoldingWakeups:
    __slots__ = ()

    def due_times_ns(self, state: ClusterState, config: SchedulerConfig) -> list[int]:
        out = due_times_ns(state, config, v7=True)
        ends: set[int] = set()
        if state.pending_jobs and state.move_holds:
            ends |= {h.decided_ns + MOVE_HOLD_NS + 1 for key in sorted(state.move_holds)
                     for h in state.move_holds[key]}  # expired once past it
        if state.pending_jobs and set(config.action_list) & {"reclaim", "preempt", "consolidation"}:
            for name in sorted(state.pending_jobs):
                for index_key in state.pending_jobs[name]:
                    retry = state.jobs[job_key_of_index(index_key)].search_retry_ns
                    if retry:
                        ends.add(retry)
        return sorted(set(out) | ends) if ends else out


def due_times_ns(state: ClusterState, config: SchedulerConfig, *, v7: bool = False) -> list[int]:
    """Sorted times at which a time rule may change a cycle's decisions though nothing new was
    logged: stale gangs' eviction deadlines (every gang in `state.gangs_below_minimum`: under
    kai-es/v4, gangs short in a leaf sub-group too); and, while pods wait, the ends of pending
    jobs' preemption delays and of running jobs' min-runtimes: every value set on the victim's
    own queue chain and the config's defaults, a superset of what either reclaim resolution
    ("lca" or "queue") and preempt can resolve, since each of them picks a value on that chain
    or a default. `v7`: delays counted from the PodGroup's last-eviction timestamp too, and the
    first moment each Running pod being deleted is stuck releasing, while pods wait."""
    out: set[int] = set()
    actions = set(config.action_list)
    if "stalegangeviction" in actions:
        for key in sorted(state.gangs_below_minimum):
            deadline = stale_deadline_ns(state, config, state.jobs[key])
            if deadline is not None:
                out.add(deadline)
    if state.pending_jobs and actions & {"reclaim", "preempt", "consolidation"}:
        defaults = (parse_signed_duration(config.min_runtime.preempt_min_runtime),
                    parse_signed_duration(config.min_runtime.reclaim_min_runtime))
        for key in sorted(state.jobs):
            job = state.jobs[key]
            if job.pending:
                start = may_trigger_evictions_from_ns(state, job, handover=v7)
                if start:
                    out.add(start)
            if job.occupying and job.preemptible:
                started = job_started_ns(state, job, 0)
                for runtime in (*defaults, *_chain_values(state, job.queue)):
                    if runtime > 0 and started > 0:
                        out.add(started + runtime)
    if v7 and state.pending_jobs:
        threshold = parse_duration(config.stuck_in_releasing_threshold)
        out.update(deleted + threshold + 1 for _, deleted in deleting_pods(state))  # stuck once past it
    return sorted(out)


def _chain_values(state: ClusterState, queue: str) -> list[int]:
    """Every min-runtime set on `queue` and its ancestors."""
    values: list[int] = []
    seen: set[str] = set()
    while queue in state.queues and queue not in seen:
        seen.add(queue)
        spec = state.queues[queue].spec
        values += [v for v in (spec.preempt_min_runtime_ns, spec.reclaim_min_runtime_ns) if v is not None]
        queue = spec.parent
    return values
