"""Staleness: when a running gang below its minimum is evicted whole (the stalegangeviction
action, kai-es/v3 on), and how the eviction says why.

- The staleness grace period: the PodGroup's, else its first pod's (by key) annotation, else
  the config's `defaultStalenessGracePeriod`; negative: never evicted as stale. A gang is due at
  the reducer's `stale_since_ns` + its grace period.
- `TopLevelStalenessV3` (kai-es/v3): a gang is stale while fewer than its `minMember` pods
  occupy (the reducer keeps `stale_since_ns` by that rule: `kai_es.state.versions`).
- `SubGroupStaleness` (kai-es/v4 on, KAI's `IsStale`): also while a leaf sub-group has fewer
  occupying pods than its own minMember; a gang short in sub-groups only is named by its first
  such sub-group, in spec order, with that sub-group's numbers.
- `PlacedPodsKeepTheGang` (kai-es/v10 on, KAI's `IsStale` over the session's task statuses):
  `SubGroupStaleness`, and a gang whose pods placed by this cycle's earlier actions (allocated,
  pipelined or moved) bring it, and each leaf sub-group, back to its minimum is not evicted this
  cycle: KAI counts Pipelined and Allocated tasks as active. Without it a gang that
  consolidation moves (its moved pods pipelined onto another node) reads "1 of 3 running" and,
  with a short grace period, is evicted every cycle (KAI's consolidationGang integration test).

Contract: pure functions of the folded state and the config.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Protocol

from kai_es.events.timefmt import format_duration, parse_signed_duration, rfc3339
from kai_es.scheduling.rules.preemption_delay import first_member_value
from kai_es.state.model import OCCUPYING, ClusterState, Job

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig


class Staleness(Protocol):
    #: the reducer's rule for `stale_since_ns` this rule reads (`kai_es.state.versions.FoldRules`)
    @property
    def judges_subgroups(self) -> bool: ...

    def reason(self, job: Job, occupying: int, grace_ns: int, why: str, numbers: dict[str, int]
               ) -> tuple[str, dict[str, int]]:
        """The eviction's reason for the stale gang `job` (`why`, `numbers`: the gang's own)."""

    def kept_by_plan(self, state: ClusterState, job: Job, placed: Container[str]) -> bool:
        """Whether the pods of `job` placed this cycle (`placed`: keys) keep it from being stale."""


class _NotKeptByPlan:
    __slots__ = ()

    def kept_by_plan(self, state: ClusterState, job: Job, placed: Container[str]) -> bool:
        return False


class TopLevelStalenessV3(_NotKeptByPlan):
    __slots__ = ()
    judges_subgroups = False

    def reason(self, job: Job, occupying: int, grace_ns: int, why: str, numbers: dict[str, int]
               ) -> tuple[str, dict[str, int]]:
        return why, numbers


class SubGroupStaleness(_NotKeptByPlan):
    __slots__ = ()
    judges_subgroups = True

    def reason(self, job: Job, occupying: int, grace_ns: int, why: str, numbers: dict[str, int]
               ) -> tuple[str, dict[str, int]]:
        if occupying >= job.min_member:
            return _subgroup_reason(job, occupying, grace_ns) or (why, numbers)
        return why, numbers


class PlacedPodsKeepTheGang(SubGroupStaleness):
    __slots__ = ()

    def kept_by_plan(self, state: ClusterState, job: Job, placed: Container[str]) -> bool:
        active = [pod for key in sorted(job.members)
                  if (pod := state.pods[key]).status in OCCUPYING or key in placed]
        if len(active) < job.min_member:
            return False
        groups = job.spec.subgroups if job.spec is not None else []
        if not groups:
            return True
        parents = {sg.parent for sg in groups}
        counts: dict[str, int] = {}
        for pod in active:
            counts[pod.spec.subgroup] = counts.get(pod.spec.subgroup, 0) + 1
        return all(counts.get(sg.name, 0) >= sg.min_member for sg in groups if sg.name not in parents)


def _subgroup_reason(job: Job, occupying: int, grace: int) -> tuple[str, dict[str, int]] | None:
    """Why `job`, at its own minimum, is stale: its first leaf sub-group below its minimum
    (None: none is, now)."""
    below = job.leaves_below_minimum()
    if not below:
        return None
    name, have, need = below[0]
    others = f" (and {len(below) - 1} more sub-groups below theirs)" if len(below) > 1 else ""
    why = (f"stale gang: sub-group {name} of job {job.key} has {have} of the {need} pods it needs "
           f"running{others}, and the job has been short of a minimum since {rfc3339(job.stale_since_ns)}, "
           f"at least its staleness grace period ({format_duration(grace)}); all its running pods are evicted")
    return why, {"subgroup_occupying": have, "subgroup_min_member": need, "subgroups_below": len(below),
                 "occupying": occupying, "min_member": job.min_member,
                 "stale_since_ns": job.stale_since_ns, "grace_period_ns": grace}


def staleness_grace_ns(state: ClusterState, config: SchedulerConfig, job: Job) -> int:
    spec = job.spec
    if spec is not None and spec.staleness_grace_ns is not None:
        return spec.staleness_grace_ns
    found = first_member_value(state, job, "staleness_grace_ns")
    return found if found is not None else parse_signed_duration(config.default_staleness_grace_period)


def stale_deadline_ns(state: ClusterState, config: SchedulerConfig, job: Job) -> int | None:
    """When the stale gang `job` is due for eviction (None: it is not stale, or never evicted)."""
    if not job.stale_since_ns:
        return None
    grace = staleness_grace_ns(state, config, job)
    if grace < 0:
        return None
    return job.stale_since_ns + grace
