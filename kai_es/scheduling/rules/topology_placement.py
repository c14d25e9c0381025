"""Topology placement: whether a PodGroup's (and its sub-groups') `topologyConstraint` keeps its
pods in one domain of the required level (`kai_es.scheduling.topology.TopologyPlacer`).

- `TopologyIgnoredV4` (kai-es/v1 to v4): the constraint is read and ignored (no placer).
- `TopologyAware` (kai-es/v5 on): the placer places constrained jobs (the preferred level tried
  first, tightest domain first), reclaim, preempt and consolidation search victims within one
  domain at a time, and a moved pod of a constrained job stays in its domain.
"""

from __future__ import annotations

from typing import Protocol

from kai_es.scheduling.plan import Plan
from kai_es.scheduling.predicates.eligibility import Eligibility
from kai_es.scheduling.topology import TopologyPlacer
from kai_es.state.model import ClusterState


class TopologyPlacement(Protocol):
    def placer(self, state: ClusterState, plan: Plan, eligibility: Eligibility) -> TopologyPlacer | None:
        """The cycle's topology placer (None: constraints are ignored)."""


class TopologyIgnoredV4:
    __slots__ = ()

    def placer(self, state: ClusterState, plan: Plan, eligibility: Eligibility) -> TopologyPlacer | None:
        return None


class TopologyAware:
    __slots__ = ()

    def placer(self, state: ClusterState, plan: Plan, eligibility: Eligibility) -> TopologyPlacer | None:
        return TopologyPlacer(state, plan, eligibility)
