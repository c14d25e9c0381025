"""The packer's answer for a task asked again (`RepeatedPlace`, what `bind_place` returns for
an `ArrayPackTable`): a cycle places its pods one by one, and a run of identical pods (the same
shape and eligible nodes: a job's replicas, a queue of one-GPU pods) asks the same question
after each placement. Two answers are known without a scan of the table:

- nothing changed since the last answer (no placement applied or undone): the same answer;
- the only change is that answer's placement, applied: under GPU binpack for a whole-GPU task,
  or CPU binpack (not fragmentation) for a CPU-only task, the node it chose is chosen again if
  it still passes every filter. Placing the task lowered that node's free GPU (or CPU) and
  raised its rank (binpack ranks by least left after placement), while every other node kept
  its rank, and among equal ranks the first node wins, which it already was. Its devices are
  the first idle ones by index, as the packer picks them, and the rejection counts are the last
  answer's: every other node is rejected or not as before, and this one is not.

Anything else asks the packer. Answers are identical to the packer's in every field (node,
devices, rejections); `tests/test_packer_repeat.py` checks them against a fresh scan."""

from __future__ import annotations

from array import array

from .model import (
    MILLI_PER_GPU,
    ArrayPackTable,
    CpuStrategy,
    GpuStrategy,
    Placement,
    PlaceFn,
    ReturnCode,
    Strategy,
    TaskShape,
)


class RepeatedPlace:
    """`place(task, eligible)` of a bound packer for one `ArrayPackTable` and strategy, with the
    last answer kept (see the module docstring). Call it as the bound function."""

    __slots__ = ("place", "table", "whole_again", "cpu_again", "last")

    def __init__(self, place: PlaceFn, table: ArrayPackTable, strategy: Strategy) -> None:
        self.place = place
        self.table = table
        self.whole_again = strategy.gpu_strategy == GpuStrategy.BINPACK
        self.cpu_again = strategy.gpu_strategy != GpuStrategy.FRAGMENTATION and \
            strategy.cpu_strategy == CpuStrategy.BINPACK
        #: (task, a copy of its eligible nodes, the answer, the table's `changes` then)
        self.last: tuple[TaskShape, array[int], Placement, int] | None = None

    def __call__(self, task: TaskShape, eligible: array[int] | None = None) -> Placement:
        table, last = self.table, self.last
        if last is not None and eligible is not None and last[0] == task and last[1] == eligible:
            _, kept, answer, changes = last
            if table.changes == changes:
                return answer
            if table.changes == changes + 1 and answer.code == ReturnCode.OK and \
                    table.last_change == (answer.node, answer.devices, task, 1):
                again = self._again(task, answer)
                if again is not None:
                    self.last = (task, kept, again, table.changes)
                    return again
        answer = self.place(task, eligible)
        if eligible is not None:
            self.last = (task, array("q", eligible), answer, table.changes)
        return answer

    def _again(self, task: TaskShape, answer: Placement) -> Placement | None:
        """The same node for `task` after `answer`'s placement, or None when the packer must
        be asked (another strategy or task kind, or the node no longer passes a filter)."""
        table, node = self.table, answer.node
        whole = task.whole_gpus > 0
        if whole:
            if not self.whole_again:
                return None
        elif task.fraction_devices or task.fraction_milli or task.gpu_memory_mib or not self.cpu_again:
            return None
        if table.free_pods[node] < 1 or table.free_milli_cpu[node] < task.milli_cpu or \
                table.free_memory_bytes[node] < task.memory_bytes:
            return None
        if not whole:
            return Placement(ReturnCode.OK, node, (), answer.rejections)
        free = table.dev_free_milli
        devices = [j for j in range(table.gpu_start[node], table.gpu_start[node + 1]) if free[j] == MILLI_PER_GPU]
        if len(devices) < task.whole_gpus:
            return None
        return Placement(ReturnCode.OK, node, tuple(devices[:task.whole_gpus]), answer.rejections)
