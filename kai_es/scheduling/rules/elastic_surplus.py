"""Elastic surplus: which of a running victim job's pods reclaim, preempt and consolidation may
take one at a time (its surplus) before the job's gang goes as one unit, and what the job is
counted to hold when its victims are put back.

- `SurplusAboveMinMemberV9` (kai-es/v1-v9): the surplus is the job's pods above its `minMember`
  (newest first, by `rules.victim_order`), counted over its pods occupying a node and not
  evicted by this Plan; sub-groups are not looked at, and pods this cycle placed do not count.
- `SurplusAboveEachSubGroup` (kai-es/v10 on, KAI's elastic victims per pod set): the surplus is
  what the job can lose and keep its minimum shape (`kai_es.scheduling.gang.surplus`: at least
  `minMember` in all and each leaf sub-group's own minimum), counting the pods this cycle's
  earlier actions placed (KAI's session holds them Allocated or Pipelined): a job whose pending
  sub-group allocate just filled offers the pods above its other sub-groups' minimums, instead of
  one pod and then the gang (KAI's "Elastic eviction from PodSet above minAvailable" cases).
  Re-placement (`rules.replacement`) counts those placed pods too when it asks whether a victim
  job was taken below its minimum.

Contract: `split(session, job, ordered, held)` is (surplus pods, the rest) of `ordered` (the
job's running pods a search may take, the first to go first), `held` the job's pods occupying
on the Plan; `held(session, job)` the pods counted as the job's when its victims are put back.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.gang import surplus
from kai_es.state.model import Job, PodState

if TYPE_CHECKING:
    from kai_es.scheduling.session import Session


class ElasticSurplus(Protocol):
    def split(self, session: Session, job: Job, ordered: Sequence[PodState], held: Sequence[PodState]
              ) -> tuple[list[PodState], list[PodState]]: ...

    def held(self, session: Session, job: Job) -> list[PodState]: ...


class SurplusAboveMinMemberV9:
    """kai-es/v1-v9 (module docstring)."""

    __slots__ = ()

    def split(self, session: Session, job: Job, ordered: Sequence[PodState], held: Sequence[PodState]
              ) -> tuple[list[PodState], list[PodState]]:
        n = max(0, len(held) - job.min_member)
        return list(ordered[:n]), list(ordered[n:])

    def held(self, session: Session, job: Job) -> list[PodState]:
        return session.occupying_on_plan(job)


class SurplusAboveEachSubGroup:
    """kai-es/v10 on (module docstring)."""

    __slots__ = ()

    def split(self, session: Session, job: Job, ordered: Sequence[PodState], held: Sequence[PodState]
              ) -> tuple[list[PodState], list[PodState]]:
        placed = session.placed_pods
        counted = list(held)
        if placed:
            have = {pod.key for pod in held}
            pods = session.state.pods
            counted += [pods[k] for k in sorted(job.members) if k in placed and k not in have]
        extra = surplus(job, ordered, counted)
        taken = {pod.key for pod in extra}
        return extra, [pod for pod in ordered if pod.key not in taken]

    def held(self, session: Session, job: Job) -> list[PodState]:
        return session.occupying_on_plan(job, session.placed_pods)
