"""Victim order inside a job: which of an elastic job's running pods go first when it loses
surplus pods (and which form the gang it keeps longest).

- `NewestFirstV5` (kai-es/v1 to v5): newest pod first, then pod key.
- `ReverseTaskOrder` (kai-es/v6 on): KAI's task order reversed — lowest
  `kai.scheduler/task-priority` first, then newest, then highest uid — so the pods a job would
  place last are the first it gives up.

Contract: pure; `order` returns a new list holding exactly `pods`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kai_es.state.model import PodState


class VictimOrder(Protocol):
    def order(self, pods: Sequence[PodState]) -> list[PodState]:
        """`pods` (a job's running pods), the first to be evicted first."""


class NewestFirstV5:
    __slots__ = ()

    def order(self, pods: Sequence[PodState]) -> list[PodState]:
        return sorted(pods, key=lambda pod: (-pod.spec.created_ns, pod.key))


class ReverseTaskOrder:
    __slots__ = ()

    def order(self, pods: Sequence[PodState]) -> list[PodState]:
        by_uid = sorted(pods, key=lambda pod: (pod.spec.uid, pod.key), reverse=True)
        return sorted(by_uid, key=lambda pod: (pod.spec.task_priority, -pod.spec.created_ns))
