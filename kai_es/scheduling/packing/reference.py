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
:func:`~.model.strategy_problem` (including the workload table,
:func:`~.model.workload_problem`), :func:`~.model.table_problem`, and -- for
FRAGMENTATION only -- no node may own more than ``MAX_NODE_DEVICES`` devices.

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

FRAGMENTATION (gpu strategy 2)
------------------------------

The strategy carries a *workload table* (:attr:`~.model.Strategy.workload`): task shapes
``m`` with integer weights ``w_m`` describing what is expected to arrive.  The
*fragmentation* of a node state is the weighted amount of its free milli-GPU that the
workload could NOT use (:func:`fragmentation`)::

    F(node) = sum over GPU shapes m of  w_m * stranded_m(node)

For one shape ``m`` (``want`` = ``whole_gpus`` or ``fraction_devices``; a device
*serves* ``m`` when it is idle (WHOLE) or can take one share of it; ``slots_j`` = how
many shares of ``m`` device ``j`` holds: 1 if it serves a WHOLE shape, ``free // need``
for a SHARED one, else 0):

* fewer than ``want`` devices serve ``m``: ``stranded_m`` = all free milli of the node;
* otherwise ``inst = sum(slots_j) // want`` instances fit the devices, ``n = min(inst,
  free_pods, free_cpu // cpu_m, free_mem // mem_m)`` fit the node (a zero cpu or memory
  request does not limit) and ``stranded_m = P + (G - P) * (inst - n) // inst``, where
  ``G`` is the node's free milli and ``P`` the free milli on the devices that do not
  serve ``m``.

So ``P`` is the FGD view (partial devices too small for ``m``), and the second term adds
the GPU capacity that the node's CPU, memory or pod slots leave unusable when it is
filled with ``m`` -- FGD only asks whether ONE instance fits, which misses GPUs stranded
by CPU; this multi-instance view is what beats it on the openb trace.  CPU-only shapes
contribute nothing.

A node that passes the filter gets ``delta = F(after) - F(before)``, "after" = the node
with the task's CPU, memory and pod slot and its devices' milli taken.  Devices: WHOLE
-- the lowest-index idle ones (as above); SHARED -- the takers in ascending
``(key_j, device_order_key)``, ``key_j`` = ``F`` of the node with the task's CPU, memory,
pod slot and only device ``j``'s share taken; the first ``fraction_devices``.  Score:

* CPU-only task: ``(node has no device, -delta, cpu_key)``;
* WHOLE and SHARED tasks: ``(-delta, -gpu_left, cpu_key)`` -- smallest fragmentation
  increase, then the least GPU left (binpack), then the cpu strategy.

With an empty workload ``delta`` is 0 and this is GPU binpack without the shared-reuse
preference.  All arithmetic is on non-negative ints (floor division); the bounds
(``MAX_SHAPES``, ``MAX_TOTAL_WEIGHT``, ``MAX_NODE_DEVICES``) keep every value inside
int64 in the C twin.

The helper functions (:func:`filter_node`, :func:`score_node`, :func:`choose_devices`)
assume inputs that :meth:`ReferencePacker.place_raw` has already validated.
"""

from __future__ import annotations

from array import array

from .model import (
    MAX_NODE_DEVICES,
    MAX_RANKED,
    MILLI_PER_GPU,
    REASON_COUNT,
    CpuStrategy,
    DeviceStrategy,
    GpuStrategy,
    PackTable,
    Placement,
    Ranking,
    Reason,
    ReturnCode,
    Strategy,
    TaskKind,
    TaskShape,
    ensure,
    need_milli,
    raise_for_result,
    strategy_problem,
    table_problem,
    task_problem,
)

__all__ = [
    "ReferencePacker",
    "filter_node",
    "score_node",
    "choose_devices",
    "device_order_key",
    "fragmentation",
    "fragmentation_placement",
]


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
    kind = _kind(task)
    if kind is TaskKind.WHOLE:
        idle = table.dev_free_milli[table.gpu_start[node]:table.gpu_start[node + 1]].count(MILLI_PER_GPU)
        if idle < task.whole_gpus:
            return Reason.GPU
        return None
    devices = _devices(table, node)
    if kind is TaskKind.SHARED:
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

    Under ``GpuStrategy.FRAGMENTATION`` the choice is :func:`fragmentation_placement`'s.
    """
    if strategy.gpu_strategy == GpuStrategy.FRAGMENTATION:
        return fragmentation_placement(table, node, task, strategy)[0]
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


# --------------------------------------------------------------------------- fragmentation


def _shape_need(shape: TaskShape, table: PackTable, j: int) -> int | None:
    """Milli one device's worth of a GPU ``shape`` takes from device ``j`` (1000 for
    WHOLE), or None if ``j`` is not size-capable."""
    if shape.whole_gpus > 0:
        return MILLI_PER_GPU
    return need_milli(shape, table.dev_total_memory_mib[j])


def _slots(shape: TaskShape, table: PackTable, j: int, free: int) -> int:
    """Shares of ``shape`` device ``j`` holds with ``free`` milli free (WHOLE: 0 or 1)."""
    need = _shape_need(shape, table, j)
    if need is None or free < need:
        return 0
    return 1 if shape.whole_gpus > 0 else free // need


def fragmentation(
    table: PackTable, node: int, strategy: Strategy, cpu: int, mem: int, pods: int, free: dict[int, int]
) -> int:
    """``F`` of ``node`` in the state given by ``cpu``, ``mem``, ``pods`` (free
    quantities) and ``free`` (device -> free milli); see the module docstring."""
    devices = _devices(table, node)
    gpu_free = sum(free[j] for j in devices)
    total = 0
    for shape in strategy.workload:
        m = shape.task
        if shape.weight == 0 or _kind(m) is TaskKind.CPU:
            continue
        want = m.whole_gpus if m.whole_gpus > 0 else m.fraction_devices
        slots = [_slots(m, table, j, free[j]) for j in devices]
        if sum(1 for c in slots if c > 0) < want:
            stranded = gpu_free
        else:
            partial = sum(free[j] for j, c in zip(devices, slots) if c == 0)
            inst = sum(slots) // want
            n = min(inst, pods)
            if m.milli_cpu > 0:
                n = min(n, cpu // m.milli_cpu)
            if m.memory_bytes > 0:
                n = min(n, mem // m.memory_bytes)
            stranded = partial + (gpu_free - partial) * (inst - n) // inst
        total += shape.weight * stranded
    return total


def _device_take(table: PackTable, task: TaskShape, j: int) -> int:
    """Milli the task takes from device ``j`` (1000 for WHOLE, ``need_milli`` for SHARED)."""
    if _kind(task) is TaskKind.WHOLE:
        return MILLI_PER_GPU
    need = need_milli(task, table.dev_total_memory_mib[j])
    assert need is not None
    return need


def fragmentation_placement(
    table: PackTable, node: int, task: TaskShape, strategy: Strategy
) -> tuple[tuple[int, ...], int, int]:
    """FRAGMENTATION on ``node`` (which passed :func:`filter_node`):
    ``(devices, delta, taken)`` -- the chosen devices, ``F(after) - F(before)`` and the
    milli the devices give up."""
    devices = _devices(table, node)
    free = {j: table.dev_free_milli[j] for j in devices}
    cpu, mem, pods = table.free_milli_cpu[node], table.free_memory_bytes[node], table.free_pods[node]
    before = fragmentation(table, node, strategy, cpu, mem, pods, free)
    cpu, mem, pods = cpu - task.milli_cpu, mem - task.memory_bytes, pods - 1
    kind = _kind(task)
    chosen: tuple[int, ...] = ()
    if kind is TaskKind.WHOLE:
        chosen = tuple([j for j in devices if free[j] == MILLI_PER_GPU][: task.whole_gpus])
    elif kind is TaskKind.SHARED:

        def key(j: int) -> tuple[int, tuple[int, ...]]:
            alone = {**free, j: free[j] - _device_take(table, task, j)}
            return (fragmentation(table, node, strategy, cpu, mem, pods, alone),
                    device_order_key(table, j, strategy.device_strategy))

        takers = sorted((j for j in devices if _can_take(table, task, j)), key=key)
        chosen = tuple(takers[: task.fraction_devices])
    after = dict(free)
    taken = 0
    for j in chosen:
        take = _device_take(table, task, j)
        after[j] -= take
        taken += take
    delta = fragmentation(table, node, strategy, cpu, mem, pods, after) - before
    return chosen, delta, taken


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

    FRAGMENTATION (``delta`` from :func:`fragmentation_placement`): CPU-only task
    ``(1 if the node owns no device else 0, -delta, cpu_key)``; WHOLE and SHARED tasks
    ``(-delta, -gpu_left, cpu_key)``.
    """
    cpu_left = table.free_milli_cpu[node] - task.milli_cpu
    cpu_key = cpu_left if strategy.cpu_strategy == CpuStrategy.SPREAD else -cpu_left
    devices = _devices(table, node)
    kind = _kind(task)
    if strategy.gpu_strategy == GpuStrategy.FRAGMENTATION:
        _, delta, taken = fragmentation_placement(table, node, task, strategy)
        if kind is TaskKind.CPU:
            return (1 if len(devices) == 0 else 0, -delta, cpu_key)
        gpu_left = sum(table.dev_free_milli[j] for j in devices) - taken
        return (-delta, -gpu_left, cpu_key)
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

        Raises :class:`InvalidArgument` (bad task, strategy, workload or table).
        """
        problem = task_problem(task) or strategy_problem(strategy)
        ensure(problem is None, problem)
        result = self.place_raw(table, task, strategy, eligible)
        if result.code < 0:
            raise_for_result(result, table, strategy, eligible)
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
            gs = table.gpu_start
            if any(gs[i + 1] - gs[i] > MAX_NODE_DEVICES for i in range(len(gs) - 1)):
                return Placement.failure(ReturnCode.EINVAL)

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

    def rank_raw(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None, cap: int
    ) -> Ranking:
        """`place_raw`'s answer and the best `cap` nodes that passed the filter, best first:
        by score descending, equal scores by ascending index -- the exact counterpart of
        ``kai_pack_rank``."""
        if not isinstance(cap, int) or not 1 <= cap <= MAX_RANKED:
            return Placement.failure(ReturnCode.EINVAL), ()
        placement = self.place_raw(table, task, strategy, eligible)
        if placement.code != ReturnCode.OK:
            return placement, ()
        elig = table.eligible if eligible is None else eligible
        passed = [node for node in range(len(table.free_milli_cpu))
                  if filter_node(table, elig, node, task) is None]
        scores = {node: score_node(table, node, task, strategy) for node in passed}
        ranked = sorted(passed, key=lambda node: (tuple(-k for k in scores[node]), node))
        return placement, tuple(ranked[:cap])

