"""The packer's answer when the nodes that can take a task are known to be few: computed on
those nodes with the packer's own filter, score and device choice (its Python twin,
`packing.reference`, which `tests/test_packing.py` holds equal to the C packer), instead
of a scan of every node of a 20,000-node table.

- `best_among`: the node (and devices) a scan would pick when every node outside `nodes` is
  known to fail the filter (the Plan's releasing capacity after a settled failure: only nodes
  an eviction released capacity on can fit). Rejection counts are not given.
- `on_one_node`: the whole answer, rejection counts included, on a mask that allows one node
  only (a pod's nominated node, tried first).

Contract: pure; reads the table, changes nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from .model import REASON_COUNT, GpuStrategy, PackTable, Placement, Reason, ReturnCode, Strategy, TaskShape, task_problem
from .reference import choose_devices, filter_node, score_node


def best_among(table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int],
               nodes: Iterable[int]) -> Placement:
    """The scan's node and devices for `task` on `eligible`, given that no node outside `nodes`
    (in ascending order) passes the filter: the best score, the lowest index among equals.
    NO_FIT when none passes. The rejections are empty: the caller does not read them."""
    best = -1
    best_score: tuple[int, ...] = ()
    for node in nodes:
        if filter_node(table, eligible, node, task) is None:
            score = score_node(table, node, task, strategy)
            if best < 0 or score > best_score:
                best, best_score = node, score
    if best < 0:
        return Placement(ReturnCode.NO_FIT, -1, (), ())
    return Placement(ReturnCode.OK, best, choose_devices(table, best, task, strategy), ())


def on_one_node(table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int],
                node: int) -> Placement | None:
    """The packer's answer for `task` on `eligible`, which allows `node` only, in every field
    (every other node is counted as not eligible); None when the packer itself must answer (an
    invalid task, which it reports as an error, or the fragmentation strategy, whose table
    limits it checks)."""
    if task_problem(task) is not None or strategy.gpu_strategy == GpuStrategy.FRAGMENTATION:
        return None
    rejections = [0] * REASON_COUNT
    rejections[Reason.NOT_ELIGIBLE] = len(table.free_milli_cpu) - 1
    reason = filter_node(table, eligible, node, task)
    if reason is not None:
        rejections[reason] += 1
        return Placement(ReturnCode.NO_FIT, -1, (), tuple(rejections))
    return Placement(ReturnCode.OK, node, choose_devices(table, node, task, strategy), tuple(rejections))
