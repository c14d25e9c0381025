"""The pure-Python twin of ``csrc/packer.c`` -- the executable specification of placement.

One call places ONE task: every node is filtered (:func:`filter_node`), the survivors are
scored (:func:`score_node`), the best node wins (lowest index among equal scores) and its
devices are chosen (:func:`choose_devices`).  Rejected nodes are counted per
:class:`~kai_es.scheduling.packing.model.Reason`.  Integers only; ties always go to the
lowest index.  The native packer must return exactly what :meth:`ReferencePacker.place_raw`
returns, on every input, including the invalid ones.

Rules, in full
--------------

Validation (return code -1 / ``InvalidArgument``): :func:`~.model.task_problem`,
:func:`~.model.strategy_problem`, :func:`~.model.table_problem`.  Then
``gpu_strategy == FRAGMENTATION`` gives -2 / ``UnsupportedStrategy``.

Filter, first failing reason counts (see :func:`filter_node`):
NOT_ELIGIBLE, PODS, CPU, MEMORY, GPU, GPU_SHARE, GPU_MEMORY.

Score, a tuple of ints, higher is better (see :func:`score_node`):

* CPU-only task: ``(node has no device, cpu_key)``
* SHARED task: ``(chosen devices that are already shared, gpu_key, cpu_key)``
* WHOLE task: ``(gpu_key, cpu_key)``

with ``cpu_key = -cpu_left`` (binpack) or ``+cpu_left`` (spread), ``cpu_left =
free_milli_cpu - milli_cpu``; ``gpu_key = -gpu_left`` (binpack) or ``+gpu_left``
(spread), ``gpu_left`` = the node's total free milli-GPU minus the milli the chosen
devices take.

Device choice (see :func:`choose_devices`): WHOLE -- the lowest-index idle devices;
SHARED -- among devices that can take the task, GPUPACK orders by ``(not shared,
free_milli, index)``, GPUSPREAD by ``(-free_milli, index)``, and the first
``fraction_devices`` are taken.

The helper functions (:func:`filter_node`, :func:`score_node`, :func:`choose_devices`)
assume inputs that :meth:`ReferencePacker.place_raw` has already validated.
"""

from __future__ import annotations

from array import array

from .model import (
    MILLI_PER_GPU,
    REASON_COUNT,
    CpuStrategy,
    DeviceStrategy,
    GpuStrategy,
    PackTable,
    Placement,
    Reason,
    ReturnCode,
    Strategy,
    TaskKind,
    TaskShape,
    ensure,
    need_milli,
    raise_for_code,
    strategy_problem,
    table_problem,
    task_problem,
)

__all__ = ["ReferencePacker", "filter_node", "score_node", "choose_devices", "device_order_key"]


def _devices(table: PackTable, node: int) -> range:
    return range(table.gpu_start[node], table.gpu_start[node + 1])


def _kind(task: TaskShape) -> TaskKind:
    """Kind of an already-validated task (``TaskShape.kind`` re-validates on every call)."""
    if task.whole_gpus > 0:
        return TaskKind.WHOLE
    if task.fraction_devices > 0:
        return TaskKind.SHARED
    return TaskKind.CPU


def _can_take(table: PackTable, task: TaskShape, j: int) -> bool:
    """Device ``j`` can take a SHARED task: size-capable and ``free_milli >= need``."""
    need = need_milli(task, table.dev_total_memory_mib[j])
    return need is not None and table.dev_free_milli[j] >= need


def filter_node(table: PackTable, eligible: array[int], node: int, task: TaskShape) -> Reason | None:
    """The first reason ``node`` cannot host ``task``, or None if it passes.

    In order:

    1. ``NOT_ELIGIBLE`` -- ``eligible[node] == 0``.
    2. ``PODS`` -- ``free_pods < 1``.
    3. ``CPU`` -- ``free_milli_cpu < milli_cpu``.
    4. ``MEMORY`` -- ``free_memory_bytes < memory_bytes``.
    5. ``GPU`` -- WHOLE: fewer than ``whole_gpus`` devices with ``free_milli == 1000``;
       SHARED: the node owns fewer than ``fraction_devices`` devices (a CPU-only node
       owns none).
    6. ``GPU_SHARE`` -- SHARED: at least ``fraction_devices`` devices are size-capable,
       but fewer than ``fraction_devices`` can take the task (``free_milli >= need``):
       occupancy is the obstacle.
    7. ``GPU_MEMORY`` -- gpu-memory task: fewer than ``fraction_devices`` devices are
       size-capable (``0 < total_memory_mib`` and ``gpu_memory_mib <= total_memory_mib``):
       the devices fail only because their memory is unknown or too small, so the task
       would not fit even on an idle node.

    6 and 7 are mutually exclusive (every device of a fraction task is size-capable), so
    the order between them is immaterial.  A CPU-only task never fails 5..7.
    """
    if eligible[node] == 0:
        return Reason.NOT_ELIGIBLE
    if table.free_pods[node] < 1:
        return Reason.PODS
    if table.free_milli_cpu[node] < task.milli_cpu:
        return Reason.CPU
    if table.free_memory_bytes[node] < task.memory_bytes:
        return Reason.MEMORY
    devices = _devices(table, node)
    kind = _kind(task)
    if kind is TaskKind.WHOLE:
        idle = sum(1 for j in devices if table.dev_free_milli[j] == MILLI_PER_GPU)
        if idle < task.whole_gpus:
            return Reason.GPU
    elif kind is TaskKind.SHARED:
        if len(devices) < task.fraction_devices:
            return Reason.GPU
        capable = sum(1 for j in devices if need_milli(task, table.dev_total_memory_mib[j]) is not None)
        if capable < task.fraction_devices:
            return Reason.GPU_MEMORY
        takers = sum(1 for j in devices if _can_take(table, task, j))
        if takers < task.fraction_devices:
            return Reason.GPU_SHARE
    return None


def device_order_key(table: PackTable, j: int, device_strategy: int) -> tuple[int, ...]:
    """Sort key of device ``j`` for a SHARED task (ascending = preferred).

    GPUPACK: ``(0 if shared else 1, free_milli, j)`` -- already-shared devices first,
    then the fullest.  GPUSPREAD: ``(-free_milli, j)`` -- the emptiest first.
    """
    free = table.dev_free_milli[j]
    if device_strategy == DeviceStrategy.GPUSPREAD:
        return (-free, j)
    return (0 if table.dev_shared[j] else 1, free, j)


def choose_devices(table: PackTable, node: int, task: TaskShape, strategy: Strategy) -> tuple[int, ...]:
    """The devices ``task`` gets on ``node`` (which passed :func:`filter_node`).

    * CPU-only: none.
    * WHOLE: the ``whole_gpus`` lowest-index devices with ``free_milli == 1000``.
    * SHARED: the devices that can take the task, sorted by :func:`device_order_key`;
      the first ``fraction_devices`` of them.
    """
    devices = _devices(table, node)
    kind = _kind(task)
    if kind is TaskKind.WHOLE:
        idle = [j for j in devices if table.dev_free_milli[j] == MILLI_PER_GPU]
        return tuple(idle[: task.whole_gpus])
    if kind is TaskKind.SHARED:
        takers = [j for j in devices if _can_take(table, task, j)]
        takers.sort(key=lambda j: device_order_key(table, j, strategy.device_strategy))
        return tuple(takers[: task.fraction_devices])
    return ()


def _taken_milli(table: PackTable, task: TaskShape, chosen: tuple[int, ...]) -> int:
    """Milli-GPU the chosen devices give up: 1000 each (WHOLE) or ``need_milli`` each."""
    if _kind(task) is TaskKind.WHOLE:
        return MILLI_PER_GPU * len(chosen)
    total = 0
    for j in chosen:
        need = need_milli(task, table.dev_total_memory_mib[j])
        assert need is not None
        total += need
    return total


def score_node(table: PackTable, node: int, task: TaskShape, strategy: Strategy) -> tuple[int, ...]:
    """Score of ``node`` (which passed :func:`filter_node`); higher is better.

    * ``cpu_left = free_milli_cpu - milli_cpu``;
      ``cpu_key = -cpu_left`` for CPU BINPACK, ``+cpu_left`` for CPU SPREAD.
    * ``gpu_left = sum(free_milli of the node's devices) - taken`` where ``taken`` is
      1000 per chosen device (WHOLE) or the sum of ``need_milli`` over the chosen devices
      (SHARED); ``gpu_key = -gpu_left`` for GPU BINPACK, ``+gpu_left`` for GPU SPREAD.

    CPU-only task: ``(1 if the node owns no device else 0, cpu_key)``.
    SHARED task: ``(number of chosen devices with shared == 1, gpu_key, cpu_key)``.
    WHOLE task: ``(gpu_key, cpu_key)``.
    """
    cpu_left = table.free_milli_cpu[node] - task.milli_cpu
    cpu_key = cpu_left if strategy.cpu_strategy == CpuStrategy.SPREAD else -cpu_left
    devices = _devices(table, node)
    kind = _kind(task)
    if kind is TaskKind.CPU:
        return (1 if len(devices) == 0 else 0, cpu_key)
    chosen = choose_devices(table, node, task, strategy)
    gpu_left = sum(table.dev_free_milli[j] for j in devices) - _taken_milli(table, task, chosen)
    gpu_key = gpu_left if strategy.gpu_strategy == GpuStrategy.SPREAD else -gpu_left
    if kind is TaskKind.SHARED:
        reuse = sum(1 for j in chosen if table.dev_shared[j])
        return (reuse, gpu_key, cpu_key)
    return (gpu_key, cpu_key)


class ReferencePacker:
    """Pure-Python placement; the specification the native packer is tested against."""

    @property
    def kind(self) -> str:
        return "reference"

    def place(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None = None
    ) -> Placement:
        """Place ``task``; returns a :class:`Placement` with code OK or NO_FIT.

        Raises :class:`InvalidArgument` (bad task, strategy or table) or
        :class:`UnsupportedStrategy` (``GpuStrategy.FRAGMENTATION``).
        """
        problem = task_problem(task) or strategy_problem(strategy)
        ensure(problem is None, problem)
        result = self.place_raw(table, task, strategy, eligible)
        if result.code < 0:
            detail = table_problem(table, eligible) if result.code == ReturnCode.EINVAL else ""
            raise_for_code(result.code, detail or "")
        return result

    def place_raw(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None = None
    ) -> Placement:
        """Like :meth:`place` but reports invalid input as a negative ``code`` instead
        of raising -- the exact counterpart of ``kai_pack_place``."""
        elig = table.eligible if eligible is None else eligible
        if task_problem(task) or strategy_problem(strategy) or table_problem(table, elig):
            return Placement.failure(ReturnCode.EINVAL)
        if strategy.gpu_strategy == GpuStrategy.FRAGMENTATION:
            return Placement.failure(ReturnCode.EUNSUPPORTED)

        rejections = [0] * REASON_COUNT
        best_node = -1
        best_score: tuple[int, ...] = ()
        for node in range(len(table.free_milli_cpu)):
            reason = filter_node(table, elig, node, task)
            if reason is not None:
                rejections[reason] += 1
                continue
            score = score_node(table, node, task, strategy)
            if best_node < 0 or score > best_score:  # strict: the lowest index keeps ties
                best_node, best_score = node, score
        if best_node < 0:
            return Placement(ReturnCode.NO_FIT, -1, (), tuple(rejections))
        devices = choose_devices(table, best_node, task, strategy)
        return Placement(ReturnCode.OK, best_node, devices, tuple(rejections))

