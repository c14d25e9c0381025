"""The packer's answer for a task asked again (`RepeatedPlace`, what `bind_place` returns for
an `ArrayPackTable`): a cycle places its pods one by one, and a run of identical pods (the same
shape and eligible nodes: a job's replicas, a queue of one-GPU pods) asks the same question
after each placement. Two answers are known without a scan of the table:

- nothing changed since the task's last answer (no placement applied or undone): the same answer;
- the only change is that answer's placement, applied: under GPU binpack for a whole-GPU task,
  or CPU binpack (not fragmentation) for a CPU-only task, placing the task lowered that node's
  free GPU (or CPU) and raised its rank (binpack ranks by least left after placement), while
  every other node kept its rank. So the node it chose is chosen again if it still passes
  every filter (among equal ranks the first node wins, which it already was); if it no longer
  does, the answer is the node ranked next by the scan that gave the first answer of the run
  (`Packer.rank_raw`, its best `RANK_CAP` nodes): every node ranked between them was an answer
  of this run and fails a filter since, and no other node changed. Devices are the first idle
  ones by index, as the packer picks them; the rejection counts are the last answer's, plus
  one under the first filter the node given up now fails.

The last answer is kept per task, for the last `RUNS` tasks asked: a cycle interleaves shapes (a
queue's one-GPU pods between jobs of 8-GPU pods that fit nowhere), and an ask that places nothing
changes nothing, so the run goes on where it was. Anything else scans the table (a ranking where
the run may go on). Answers are identical to the
packer's in every field (node, devices, rejections); `tests/test_packer_repeat.py` checks them
against a fresh scan by both packers.

"The same eligible nodes" is equal contents, and comparing two masks of a 20,000-node cluster
reads 320 KB: 4.5 us, paid by every one of a cycle's thousands of placements. A caller that
passes `fixed=True` promises the mask it passes is never changed afterwards (the Plan passes its
static masks so, `Plan.place`'s `remember`, and checks the promise in verification mode): such a
mask is kept by reference, and asked again with the same object it is the same mask."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TypeAlias

from .model import (
    MILLI_PER_GPU,
    ArrayPackTable,
    CpuStrategy,
    GpuStrategy,
    Placement,
    PlaceFn,
    RankFn,
    ReturnCode,
    Strategy,
    TaskShape,
)
from .reference import filter_node

#: how many nodes a scan ranks for the answers after its first (one scan per this many nodes
#: filled by a run of identical one-GPU pods, instead of one per pod)
RANK_CAP = 128


#: how many tasks' last answers are kept (a cycle interleaves a few shapes: a run of one-GPU pods
#: asked between two 8-GPU pods that fit nowhere goes on where it was)
RUNS = 8

#: a task's last answer: (its eligible nodes (a copy, or the caller's own when fixed), whether
#: fixed, the answer, the table's `changes` then, the scan's ranked nodes, the index in them of
#: the next node to give)
_Run: TypeAlias = "tuple[array[int], bool, Placement, int, Sequence[int], int]"


class RepeatedPlace:
    """`place(task, eligible)` of a bound packer for one `ArrayPackTable` and strategy, with the
    last answer of each of the last `RUNS` tasks asked kept (see the module docstring). Call it
    as the bound function. Without `rank` a node that no longer fits ends the run (the packer is
    asked)."""

    __slots__ = ("place", "rank", "table", "whole_again", "cpu_again", "runs")

    def __init__(self, place: PlaceFn, table: ArrayPackTable, strategy: Strategy,
                 rank: RankFn | None = None) -> None:
        self.place = place
        self.rank = rank
        self.table = table
        self.whole_again = strategy.gpu_strategy == GpuStrategy.BINPACK
        self.cpu_again = strategy.gpu_strategy != GpuStrategy.FRAGMENTATION and \
            strategy.cpu_strategy == CpuStrategy.BINPACK
        #: task -> its last answer, the least recently asked first
        self.runs: dict[TaskShape, _Run] = {}

    def __call__(self, task: TaskShape, eligible: array[int] | None = None, fixed: bool = False) -> Placement:
        """The packer's answer for `task` on `eligible`; `fixed`: the caller never changes
        `eligible` afterwards (module docstring)."""
        table, runs = self.table, self.runs
        run = runs.get(task) if eligible is not None else None
        if run is not None and ((fixed and run[0] is eligible) if run[1] else run[0] == eligible):
            kept, was_fixed, answer, changes, ranked, at = run
            if fixed and not was_fixed:  # equal contents: from now on known by identity
                assert eligible is not None
                kept, was_fixed = eligible, True
                runs[task] = (kept, True, answer, changes, ranked, at)
            if table.changes == changes:
                return answer
            if table.changes == changes + 1 and answer.code == ReturnCode.OK and \
                    table.last_change == (answer.node, answer.devices, task, 1):
                again = self._again(task, kept, answer, ranked, at)
                if again is not None:
                    runs[task] = (kept, was_fixed, again[0], table.changes, ranked, again[1])
                    return again[0]
        order: Sequence[int] = ()
        if eligible is not None and self.rank is not None and self._repeats(task):
            answer, order = self.rank(task, eligible, RANK_CAP)
        else:
            answer = self.place(task, eligible)
        if eligible is not None:
            runs.pop(task, None)
            if len(runs) >= RUNS:
                del runs[next(iter(runs))]
            runs[task] = (eligible if fixed else array("q", eligible), fixed, answer, table.changes, order, 1)
        return answer

    def _repeats(self, task: TaskShape) -> bool:
        """Whether a placement of `task` only raises its node's rank (see the module docstring)."""
        if task.whole_gpus > 0:
            return self.whole_again
        return not (task.fraction_devices or task.fraction_milli or task.gpu_memory_mib) and self.cpu_again

    def _again(self, task: TaskShape, eligible: array[int], answer: Placement, ranked: Sequence[int], at: int
               ) -> tuple[Placement, int] | None:
        """The answer for `task` after `answer`'s placement and the index of the next ranked node
        after it, or None when the packer must be asked (another strategy or task kind, or the
        node no longer fits and no ranked node is left)."""
        if not self._repeats(task):
            return None
        node = answer.node
        reason = filter_node(self.table, eligible, node, task)  # (the packer's filter, in its order)
        if reason is None:
            return Placement(ReturnCode.OK, node, self._devices(task, node), answer.rejections), at
        if at >= len(ranked):
            return None
        rejections = list(answer.rejections)
        rejections[reason] += 1
        following = ranked[at]
        return Placement(ReturnCode.OK, following, self._devices(task, following), tuple(rejections)), at + 1

    def _devices(self, task: TaskShape, node: int) -> tuple[int, ...]:
        """The devices the packer gives `task` on `node` (which passes every filter): the
        first idle ones by index for a whole-GPU task, none for a CPU-only one."""
        if task.whole_gpus == 0:
            return ()
        free, start = self.table.dev_free_milli, self.table.gpu_start
        j, end, devices = start[node], start[node + 1], []
        for _ in range(task.whole_gpus):  # (array.index: the scan in C)
            j = free.index(MILLI_PER_GPU, j, end)
            devices.append(j)
            j += 1
        return tuple(devices)
