"""Leaving pods: whether a pod the Plan evicts (or moves away) still satisfies the required
pod affinity of a pod placed after it in the cycle (`predicates.pod_affinity`).

- `LeavingPodsStayV3` (kai-es/v1 to v3): it does (a preemptor could be placed next to a pod
  that was leaving for it).
- `EvictedPodsLeave` (kai-es/v4 on): it does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kai_es.scheduling.predicates.eligibility import Eligibility
from kai_es.state.model import ClusterState, NodeState


class LeavingPods(Protocol):
    def eligibility(self, state: ClusterState, names: Sequence[str], nodes: Sequence[NodeState]) -> Eligibility:
        """The cycle's eligibility, judging leaving pods by this rule."""


class LeavingPodsStayV3:
    __slots__ = ()

    def eligibility(self, state: ClusterState, names: Sequence[str], nodes: Sequence[NodeState]) -> Eligibility:
        return Eligibility(state, names, nodes, leaving=False)


class EvictedPodsLeave:
    __slots__ = ()

    def eligibility(self, state: ClusterState, names: Sequence[str], nodes: Sequence[NodeState]) -> Eligibility:
        return Eligibility(state, names, nodes, leaving=True)
