"""Preemption delay: a pending job may make room for itself by evicting others only once its
delay has passed since it was created or last evicted.

- `NoPreemptionDelayV2` (kai-es/v1, v2): no delay.
- `PodGroupPreemptionDelay` (kai-es/v3 on): the PodGroup's `preemptionDelay` (or annotation),
  else its first pod's (by key) annotation, else 0; the job may trigger evictions from
  max(created, last evicted) + delay (times from the log).
- `HandoverPreemptionDelay` (kai-es/v7 on): as v3, and the PodGroup's
  `kai.scheduler/last-eviction-timestamp` (written by KAI, or by kai-es's status writer) counts
  as a last eviction too, so the window KAI re-armed before handing the job over still holds.

Contract: pure functions of the folded state and the cycle's "now".
"""

from __future__ import annotations

from typing import Protocol

from kai_es.state.model import ClusterState, Job


class PreemptionDelay(Protocol):
    def delayed_until_ns(self, state: ClusterState, job: Job, now_ns: int) -> int:
        """The time from which `job` may trigger evictions, when that is still to come (else 0)."""

    def delay_ns(self, state: ClusterState, job: Job) -> int:
        """The job's preemption delay (0: none)."""


class NoPreemptionDelayV2:
    __slots__ = ()

    def delayed_until_ns(self, state: ClusterState, job: Job, now_ns: int) -> int:
        return 0

    def delay_ns(self, state: ClusterState, job: Job) -> int:
        return 0


class PodGroupPreemptionDelay:
    __slots__ = ()

    def delayed_until_ns(self, state: ClusterState, job: Job, now_ns: int) -> int:
        start = may_trigger_evictions_from_ns(state, job)
        return start if start > now_ns else 0

    def delay_ns(self, state: ClusterState, job: Job) -> int:
        return preemption_delay_ns(state, job)


def first_member_value(state: ClusterState, job: Job, field: str) -> int | None:
    """The first value of `field` set on the job's pods' specs, by pod key (None: none)."""
    for key in sorted(job.members):
        value = getattr(state.pods[key].spec, field)
        if value is not None:
            return int(value)
    return None


def preemption_delay_ns(state: ClusterState, job: Job) -> int:
    spec = job.spec
    if spec is not None and spec.preemption_delay_ns is not None:
        return spec.preemption_delay_ns
    found = first_member_value(state, job, "preemption_delay_ns")
    return found if found is not None else 0


class HandoverPreemptionDelay:
    __slots__ = ()

    def delayed_until_ns(self, state: ClusterState, job: Job, now_ns: int) -> int:
        start = may_trigger_evictions_from_ns(state, job, handover=True)
        return start if start > now_ns else 0

    def delay_ns(self, state: ClusterState, job: Job) -> int:
        return preemption_delay_ns(state, job)


def may_trigger_evictions_from_ns(state: ClusterState, job: Job, *, handover: bool = False) -> int:
    """The earliest time `job` may make room for itself by evicting others (`handover`: the
    PodGroup's last-eviction timestamp is a last eviction too)."""
    delay = preemption_delay_ns(state, job)
    if delay <= 0:
        return 0
    anchor = max(job.created_ns, job.last_evicted_ns)
    stamp = job.spec.last_eviction_timestamp_ns if handover and job.spec is not None else None
    if stamp is not None:
        anchor = max(anchor, stamp)
    return anchor + delay
