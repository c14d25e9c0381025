"""Consolidation's node order: which of the nodes whose movable pods could make room for a
pending job is tried first (`Consolidation.bounded_search` tries them one by one).

- `MostFreeFirstV8` (kai-es/v4 to v8): the most free GPU capacity (once released) first, then
  the node's index (the order the nodes were first observed).
- `CheapestVictimBreaksTies` (kai-es/v9 on): the most free GPU capacity first; among nodes with
  as much, the one holding the cheapest movable unit in the victim order (lower job priority,
  newer job, then uid: `victims.keyed_units`) first, then the index. KAI's consolidation takes
  its victims in that order across the cluster, so with two nodes alike it frees the node of its
  first victim (KAI's consolidation integration test "1 train job of 1 GPU running on node0, 1
  train job of 1 GPU running on node 1, 1 pending job of 2 GPUs - consolidate": the newer job
  moves); v4-v8 freed the first node observed.

Contract: pure. The action lists the nodes that could take the job with their movable pods
gone, by most free GPU capacity then index, keeping at most `MAX_NODES` — and, for a rule that
`breaks_ties`, the rest of the last kept node's group of equal free capacity; `order(nodes, free,
cheapest)` then returns the order to try them in, where `free[n]` is a node's free GPU capacity
and `cheapest[n]` the victim-order key of its cheapest movable unit (None: none offered); the
action keeps the first `MAX_NODES`. `key(node, free, cheapest)` is the same order as a key
(the walk's order, most free first then index, is `(-free, node)`): `order` sorts by it, and a
node's key depends only on its own free capacity and cheapest unit, which is what lets
`consolidation_views.NodeViews` keep a search's ordered nodes and re-key only those that changed.
For a rule that `breaks_ties`, `key(node, free, cheapest)` is never below (-free, False, least,
node), `least` the `victims.job_order` of the cheapest unit's job (a cheapest unit's key starts
with it): `consolidation_bounds` ranks nodes by that bound to look at the few that can come first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Protocol


class ConsolidationNodes(Protocol):
    #: whether nodes of equal free GPU capacity are ordered by their cheapest victim
    breaks_ties: bool

    def order(self, nodes: Sequence[int], free: Mapping[int, int],
              cheapest: Mapping[int, tuple[object, ...] | None]) -> list[int]: ...

    def key(self, node: int, free: int, cheapest: tuple[object, ...] | None) -> tuple[object, ...]:
        """Where `node` goes in `order`: listed nodes sorted by it are `order`'s answer."""


class MostFreeFirstV8:
    __slots__ = ()
    breaks_ties = False

    def order(self, nodes: Sequence[int], free: Mapping[int, int],
              cheapest: Mapping[int, tuple[object, ...] | None]) -> list[int]:
        return list(nodes)  # as listed: most free first, then index

    def key(self, node: int, free: int, cheapest: tuple[object, ...] | None) -> tuple[object, ...]:
        return (-free, node)


class CheapestVictimBreaksTies:
    __slots__ = ()
    breaks_ties = True

    def order(self, nodes: Sequence[int], free: Mapping[int, int],
              cheapest: Mapping[int, tuple[object, ...] | None]) -> list[int]:
        out: list[int] = []
        for _, same in groupby(nodes, key=lambda n: free[n]):
            # nodes without a unit on offer last; the index breaks the remaining ties
            out.extend(sorted(same, key=lambda n: (cheapest[n] is None, cheapest[n] or (), n)))
        return out

    def key(self, node: int, free: int, cheapest: tuple[object, ...] | None) -> tuple[object, ...]:
        return (-free, cheapest is None, cheapest or (), node)
