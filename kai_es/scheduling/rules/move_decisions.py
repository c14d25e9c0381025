"""Move decisions: how a running pod re-placed on another node (a consolidation move, or a
victim of reclaim or preempt moved rather than evicted) is announced.

- `MoveInReasonV5` (kai-es/v4, v5): as an eviction from its node whose reason text names the new
  node ("moved from node a to node b ..."): an audit consumer has to read English to learn it.
- `MoveAsDecision` (kai-es/v6 on): one decision with both nodes as fields — the eviction's `node`
  and its `to_node` (EvictionDecided schema version 3) — and a reason that says why, not where.

Contract: pure; `announce` writes only the eviction it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kai_es.scheduling.plan import Eviction


class MoveDecisions(Protocol):
    def announce(self, op: Eviction, to_node: str, worded: str, reason: str) -> None:
        """`op` is a move to node `to_node`: `worded` is its reason with both nodes in the
        text (kai-es/v5's), `reason` the same without them."""


class MoveInReasonV5:
    __slots__ = ()

    def announce(self, op: Eviction, to_node: str, worded: str, reason: str) -> None:
        op.reason = worded


class MoveAsDecision:
    __slots__ = ()

    def announce(self, op: Eviction, to_node: str, worded: str, reason: str) -> None:
        op.reason, op.to_node = reason, to_node
