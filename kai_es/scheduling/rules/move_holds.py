"""Move holds: whether the room a consolidation move made stays held for the moved pod's
replacement in the cycles after the move.

- `NoMoveHoldsV7` (kai-es/v1 to v7): the room is the moved pod's only in the cycle that moved
  it; its replacement, created by its controller, competes for it like any pending pod.
- `HoldMovedRoom` (kai-es/v8 on): until the replacement arrives (then it is nominated to the
  node: `kai_es.state.handlers.move_holds`) or the hold expires (`MOVE_HOLD_NS` after the
  move), each live hold's room is kept used on its node, so nothing else is placed there. From
  kai-es/v11 the fold drops the holds of a move whose eviction failed (fold rule
  `releases_failed_moves`), so they hold nothing.

Contract: a pure function of the folded state and the cycle's time; it changes only the
cycle's Plan, before any operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.events import payloads as p
from kai_es.state.model import ClusterState

if TYPE_CHECKING:
    from kai_es.scheduling.plan import Plan


class MoveHolds(Protocol):
    def reserve(self, state: ClusterState, plan: Plan, now_ns: int) -> None:
        """Hold in `plan` the room kept for moved pods' replacements."""


class NoMoveHoldsV7:
    __slots__ = ()

    def reserve(self, state: ClusterState, plan: Plan, now_ns: int) -> None:
        return None


class HoldMovedRoom:
    __slots__ = ()

    def reserve(self, state: ClusterState, plan: Plan, now_ns: int) -> None:
        for key in sorted(state.move_holds):
            namespace = key.split("/", 1)[0]
            for hold in state.move_holds[key]:
                if not hold.live(now_ns):
                    continue
                # the shape is all a reservation needs of the pod to come
                spec = p.PodObserved(namespace=namespace, name=hold.pod.split("/", 1)[1], uid="", podgroup="",
                                     requests=hold.requests, gpu=hold.gpu, scalar_requests=hold.scalar_requests)
                plan.reserve(spec, hold.node)  # (room taken meanwhile: nothing to hold)
