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

Contract: pure; `order(nodes, free, cheapest)` returns `nodes` reordered, where `free(n)` is a
node's free GPU capacity and `cheapest(group)` the victim-order key of each node's cheapest
movable unit (None: none), asked only for groups of nodes with equal free capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby
from typing import Protocol

Cheapest = Callable[[Sequence[int]], dict[int, tuple[object, ...] | None]]


class ConsolidationNodes(Protocol):
    def order(self, nodes: Sequence[int], free: Callable[[int], int], cheapest: Cheapest) -> list[int]: ...


class MostFreeFirstV8:
    __slots__ = ()

    def order(self, nodes: Sequence[int], free: Callable[[int], int], cheapest: Cheapest) -> list[int]:
        return sorted(nodes, key=lambda n: (-free(n), n))


class CheapestVictimBreaksTies:
    __slots__ = ()

    def order(self, nodes: Sequence[int], free: Callable[[int], int], cheapest: Cheapest) -> list[int]:
        out: list[int] = []
        for _, same in groupby(sorted(nodes, key=lambda n: (-free(n), n)), key=free):
            group = list(same)
            if len(group) > 1:
                keys = cheapest(group)
                # nodes without a movable unit last; the index breaks the remaining ties
                group.sort(key=lambda n: (keys[n] is None, keys[n] or (), n))
            out.extend(group)
        return out
