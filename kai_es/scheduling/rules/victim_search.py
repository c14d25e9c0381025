"""Victim search: which victims a preemptor's search (reclaim, preempt, consolidation) tries,
over which nodes, and when it tries a placement (`kai_es.scheduling.victims.search`).

- `UnboundedSearchV2` (kai-es/v1, v2): every occupying preemptible job the action allows, its
  units cheapest first, over every node; a placement is tried once the victims alone free the
  preemptor's whole request; a failed search is remembered by (queue, request, Plan length) for
  single pods without pod (anti-)affinity.
- `BoundedSearchV3` (kai-es/v3): victims come from the reducer's index (`state.victim_jobs`)
  through the buckets the action allows, only on the nodes the per-node bound leaves
  (`PreemptingAction.bounded_search`; none: VictimsCannotMakeRoom), a job whose eviction the
  binder refused lately is no victim, and a failed search is remembered by its scenario.
- `BoundedSearch` (kai-es/v4 on): v3's, and the search counts capacity free already towards the
  request, and tries a placement only after an eviction that leaves a node able to take one of
  the preemptor's tasks.

Contract: pure; the search's effort is bounded by counts (`victims.MAX_*`), never by time.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.packing import TaskShape
from kai_es.scheduling.session import QueueNode
from kai_es.scheduling.victims import Unit, free_capacity
from kai_es.state.model import Job, PodState
from kai_es.state.quantities import Vector

if TYPE_CHECKING:
    from kai_es.scheduling.actions.preempting import PreemptingAction

#: what a search covers: the nodes it may take from (None: all), its units in order, and what
#: it is remembered by when it fails
Search = tuple[set[int] | None, Iterable[Unit], Hashable]


class VictimSearch(Protocol):
    def plan(self, action: PreemptingAction, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector,
             shapes: list[tuple[TaskShape, array[int]]]) -> Search | None:
        """What the search for `job` covers, or None when it need not run."""

    def failed(self, action: PreemptingAction, memo: Hashable) -> None:
        """Remember that the search `plan` described by `memo` found nothing."""

    def free(self, action: PreemptingAction, on_nodes: set[int] | None) -> Callable[[], Vector] | None:
        """The free capacity the search counts towards the request (None: none)."""

    def fits_on(self, node_fits: Callable[[int], bool]) -> Callable[[int], bool] | None:
        """The gate on placement tries (None: tried once the freed capacity adds up)."""


class UnboundedSearchV2:
    __slots__ = ()

    def plan(self, action: PreemptingAction, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector,
             shapes: list[tuple[TaskShape, array[int]]]) -> Search | None:
        memo = (leaf.name, request, len(action.plan.operations))
        if memo in action.failed_searches and len(pods) == 1 and not pods[0].spec.pod_affinity \
                and not pods[0].spec.pod_anti_affinity:
            return None
        return None, action.victim_units(leaf, job), memo

    def failed(self, action: PreemptingAction, memo: Hashable) -> None:
        action.failed_searches.add(memo)

    def free(self, action: PreemptingAction, on_nodes: set[int] | None) -> Callable[[], Vector] | None:
        return None

    def fits_on(self, node_fits: Callable[[int], bool]) -> Callable[[int], bool] | None:
        return None


class BoundedSearchV3:
    __slots__ = ()

    def plan(self, action: PreemptingAction, leaf: QueueNode, job: Job, pods: list[PodState], request: Vector,
             shapes: list[tuple[TaskShape, array[int]]]) -> Search | None:
        return action.bounded_search(leaf, job, pods, request, shapes)

    def failed(self, action: PreemptingAction, memo: Hashable) -> None:
        action.failed_scenarios.add(memo)

    def free(self, action: PreemptingAction, on_nodes: set[int] | None) -> Callable[[], Vector] | None:
        return None

    def fits_on(self, node_fits: Callable[[int], bool]) -> Callable[[int], bool] | None:
        return None


class BoundedSearch(BoundedSearchV3):
    __slots__ = ()

    def free(self, action: PreemptingAction, on_nodes: set[int] | None) -> Callable[[], Vector] | None:
        session = action.session
        return lambda: free_capacity(session, on_nodes)

    def fits_on(self, node_fits: Callable[[int], bool]) -> Callable[[int], bool] | None:
        return node_fits
