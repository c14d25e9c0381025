"""Victim eligibility across actions: on top of each action's own rule (`admit` of reclaim,
preempt and consolidation), which units no action may take in this cycle.

- `ActionRuleOnlyV3` (kai-es/v1 to v3): the action's rule alone.
- `SpareGrowingJobs` (kai-es/v4 on): a job this cycle placed pods for (restoring a gang, an
  elastic job growing, an earlier preemptor) is no victim in the same cycle, nor a pod a
  placement of this cycle needs for its required pod affinity (`PodAffinityIndex.needed`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kai_es.scheduling.session import Session
    from kai_es.scheduling.victims import Unit


class VictimEligibility(Protocol):
    def admit(self, session: Session, rule: Callable[[Unit], bool]) -> Callable[[Unit], bool]:
        """The units the search may take, given the action's own `rule`."""


class ActionRuleOnlyV3:
    __slots__ = ()

    def admit(self, session: Session, rule: Callable[[Unit], bool]) -> Callable[[Unit], bool]:
        return rule


class SpareGrowingJobs:
    __slots__ = ()

    def admit(self, session: Session, rule: Callable[[Unit], bool]) -> Callable[[Unit], bool]:
        grown, affinity = session.placed_pods, session.eligibility.affinity

        def admit(unit: Unit) -> bool:
            return rule(unit) and not any(e.pod_key in grown for e in unit.job.pending) and \
                not any(affinity.needed(pod.key) for pod in unit.pods)

        return admit
