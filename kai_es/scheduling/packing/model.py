"""Value types of the GPU-placement hot path: task shapes, strategies, results and the table.

Everything here is an ``int``; no floats anywhere.  The placement function itself is
specified by :mod:`kai_es.scheduling.packing.reference` (the pure-Python twin) and
implemented natively in ``csrc/packer.c``; this module holds what both share:

* the enums whose integer values are the C ABI (``csrc/packer.h``);
* :class:`TaskShape`, :class:`Strategy`, :class:`Placement`;
* the validation rules (:func:`task_problem`, :func:`strategy_problem`,
  :func:`table_problem`) -- the C side checks exactly the same conditions and answers
  ``-1`` (:attr:`ReturnCode.EINVAL`) where these return a message;
* :func:`need_milli`, the milli a shared task takes from one device;
* :class:`PackTable` (protocol) and :class:`ArrayPackTable`, the struct-of-arrays table
  whose ``array('q')`` buffers the native packer reads in place, with
  :meth:`ArrayPackTable.apply` to commit or roll back a placement incrementally.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, NoReturn, Protocol

import msgspec

from kai_es.state.quantities import gpu_memory_share

__all__ = [
    "MILLI_PER_GPU",
    "REASON_COUNT",
    "MAX_TASK_DEVICES",
    "MAX_MEMORY_MIB",
    "MAX_QUANTITY",
    "INT64_MAX",
    "SHAPE_FIELDS",
    "MAX_SHAPES",
    "MAX_TOTAL_WEIGHT",
    "MAX_NODE_DEVICES",
    "Reason",
    "ReturnCode",
    "GpuStrategy",
    "CpuStrategy",
    "DeviceStrategy",
    "TaskKind",
    "TaskShape",
    "Strategy",
    "WorkloadShape",
    "workload_problem",
    "workload_from_tasks",
    "Placement",
    "PackingError",
    "InvalidArgument",
    "UnsupportedStrategy",
    "NativePackerUnavailable",
    "ensure",
    "raise_for_code",
    "raise_for_result",
    "task_problem",
    "strategy_problem",
    "table_problem",
    "need_milli",
    "PackTable",
    "ArrayPackTable",
    "DeviceRow",
    "NodeRow",
    "Packer",
    "BoundRanking",
    "RankFn",
    "Ranking",
    "MAX_RANKED",
]

MILLI_PER_GPU = 1000
"""A whole device is 1000 milli-GPU."""
REASON_COUNT = 7
"""Length of the rejection-count vector (one slot per :class:`Reason`)."""
MAX_TASK_DEVICES = 1 << 20
"""Upper bound of ``whole_gpus`` and ``fraction_devices``."""
MAX_MEMORY_MIB = 1 << 40
"""Upper bound of ``gpu_memory_mib`` and of a device's ``total_memory_mib``."""
MAX_QUANTITY = 1 << 62
"""Upper bound of a task's ``milli_cpu`` and ``memory_bytes``."""
INT64_MAX = (1 << 63) - 1
SHAPE_FIELDS = 7
"""Integers per workload-shape row in the C ABI: the six task fields, then the weight."""
MAX_RANKED = 1024
"""Most nodes one ranking (`Packer.rank_raw`) may list."""
MAX_SHAPES = 64
"""Most shapes a workload table (:attr:`Strategy.workload`) may hold."""
MAX_TOTAL_WEIGHT = 1 << 20
"""Upper bound of the sum of the workload weights (keeps every score inside int64)."""
MAX_NODE_DEVICES = 1 << 16
"""Most devices one node may own when placing with ``GpuStrategy.FRAGMENTATION``."""


class Reason(IntEnum):
    """Why a node was rejected; the value is the slot in the rejection-count vector.

    The filter tries them in this order and a node is counted under the first that fails.
    ``GPU_SHARE`` and ``GPU_MEMORY`` are mutually exclusive (see
    :func:`kai_es.scheduling.packing.reference.filter_node`).
    """

    NOT_ELIGIBLE = 0
    PODS = 1
    CPU = 2
    MEMORY = 3
    GPU = 4
    GPU_SHARE = 5
    GPU_MEMORY = 6


class ReturnCode(IntEnum):
    """Return code of one placement call (same values as ``enum kai_pack_code``)."""

    OK = 0
    NO_FIT = 1
    EINVAL = -1
    EUNSUPPORTED = -2


class GpuStrategy(IntEnum):
    """Node-level GPU strategy.

    BINPACK / SPREAD rank nodes by the free milli-GPU left after placement (KAI
    semantics).  FRAGMENTATION ranks them by the smallest increase of the expected
    stranded GPU capacity under the workload table of the strategy
    (:attr:`Strategy.workload`); see :mod:`kai_es.scheduling.packing.reference`.
    """

    BINPACK = 0
    SPREAD = 1
    FRAGMENTATION = 2


class CpuStrategy(IntEnum):
    """Node-level CPU strategy: rank nodes by free milli-CPU left after placement."""

    BINPACK = 0
    SPREAD = 1


class DeviceStrategy(IntEnum):
    """Device choice for a shared (fraction / gpu-memory) task on the chosen node."""

    GPUPACK = 0
    GPUSPREAD = 1


class TaskKind(IntEnum):
    """The three kinds of task shape; see :class:`TaskShape`."""

    CPU = 0
    WHOLE = 1
    SHARED = 2


# --------------------------------------------------------------------------- errors


class PackingError(Exception):
    """Base class of every packing error."""


class InvalidArgument(PackingError, ValueError):
    """An input is out of range or inconsistent (return code -1)."""


class UnsupportedStrategy(PackingError, NotImplementedError):
    """A reserved strategy was requested (return code -2; no strategy is reserved at
    ABI version 2, the code is kept for future ones)."""


class NativePackerUnavailable(PackingError, ImportError):
    """The compiled module ``kai_es._native._packer`` is not built or does not match."""


def ensure(cond: bool, *args: object, raising: type[Exception] = InvalidArgument) -> None:
    """Raise ``raising(*args)`` unless ``cond`` (PyNaCl-style precondition check)."""
    if not cond:
        raise raising(*args)


def raise_for_code(code: int, detail: str = "") -> NoReturn:
    """Map a negative return code to its typed exception."""
    if code == ReturnCode.EUNSUPPORTED:
        raise UnsupportedStrategy(detail or "unsupported strategy")
    if code == ReturnCode.EINVAL:
        raise InvalidArgument(detail or "invalid argument")
    raise PackingError(f"unexpected return code {code}")


def raise_for_result(result: "Placement", table: "PackTable", strategy: "Strategy",
                     eligible: "array[int] | None") -> NoReturn:
    """Raise the typed error for a negative placement code, naming the bad input when it can."""
    detail = ""
    if result.code == ReturnCode.EINVAL:
        detail = table_problem(table, eligible) or ""
        if not detail and strategy.gpu_strategy == GpuStrategy.FRAGMENTATION:
            detail = f"a node owns more than {MAX_NODE_DEVICES} devices (fragmentation strategy)"
    raise_for_code(result.code, detail)


# --------------------------------------------------------------------------- task / strategy


class TaskShape(msgspec.Struct, frozen=True, gc=False, cache_hash=True):
    """What one task asks for.  Exactly one of three kinds (anything else is invalid):

    * **CPU-only** -- every GPU field is 0.
    * **WHOLE** -- ``whole_gpus >= 1`` idle devices; ``fraction_milli``,
      ``gpu_memory_mib`` and ``fraction_devices`` are 0.
    * **SHARED** -- ``whole_gpus == 0``, ``fraction_devices >= 1`` distinct devices, each
      taking a share given by exactly one of ``fraction_milli`` (1..999 milli of a device)
      or ``gpu_memory_mib`` (>= 1; converted per device by :func:`need_milli`).

    Bounds: ``0 <= milli_cpu, memory_bytes <= MAX_QUANTITY``;
    ``0 <= whole_gpus, fraction_devices <= MAX_TASK_DEVICES``;
    ``0 <= gpu_memory_mib <= MAX_MEMORY_MIB``.  The shape is not validated at
    construction; every packer validates it at its boundary (:func:`task_problem`).

    (A frozen msgspec Struct with its hash kept: a cycle looks shapes up in dicts at every
    placement, and a frozen dataclass's hash is a Python call hashing a new tuple each time.)
    """

    milli_cpu: int = 0
    memory_bytes: int = 0
    whole_gpus: int = 0
    fraction_milli: int = 0
    fraction_devices: int = 0
    gpu_memory_mib: int = 0

    @classmethod
    def cpu(cls, milli_cpu: int, memory_bytes: int = 0) -> TaskShape:
        """A CPU-only task."""
        return cls(milli_cpu=milli_cpu, memory_bytes=memory_bytes)

    @classmethod
    def whole(cls, gpus: int, milli_cpu: int = 0, memory_bytes: int = 0) -> TaskShape:
        """A task taking ``gpus`` whole (idle) devices."""
        return cls(milli_cpu=milli_cpu, memory_bytes=memory_bytes, whole_gpus=gpus)

    @classmethod
    def fraction(cls, milli: int, devices: int = 1, milli_cpu: int = 0, memory_bytes: int = 0) -> TaskShape:
        """A task taking ``milli`` (1..999) of each of ``devices`` distinct devices."""
        return cls(milli_cpu=milli_cpu, memory_bytes=memory_bytes, fraction_milli=milli, fraction_devices=devices)

    @classmethod
    def gpu_memory(cls, mib: int, devices: int = 1, milli_cpu: int = 0, memory_bytes: int = 0) -> TaskShape:
        """A task taking ``mib`` MiB of GPU memory on each of ``devices`` distinct devices."""
        return cls(milli_cpu=milli_cpu, memory_bytes=memory_bytes, gpu_memory_mib=mib, fraction_devices=devices)

    @property
    def kind(self) -> TaskKind:
        """The task kind; raises :class:`InvalidArgument` if the shape is invalid."""
        problem = task_problem(self)
        ensure(problem is None, problem)
        if self.whole_gpus > 0:
            return TaskKind.WHOLE
        if self.fraction_devices > 0:
            return TaskKind.SHARED
        return TaskKind.CPU

    @property
    def device_count(self) -> int:
        """How many devices a placement of this task names (0 for a CPU-only task)."""
        kind = self.kind
        if kind is TaskKind.WHOLE:
            return self.whole_gpus
        if kind is TaskKind.SHARED:
            return self.fraction_devices
        return 0

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        """The fields in ABI order (``struct kai_pack_task``)."""
        return (
            self.milli_cpu,
            self.memory_bytes,
            self.whole_gpus,
            self.fraction_milli,
            self.fraction_devices,
            self.gpu_memory_mib,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int)


def task_problem(task: TaskShape) -> str | None:
    """Why ``task`` is invalid, or None.  Same conditions as ``task_kind()`` in packer.c."""
    names = ("milli_cpu", "memory_bytes", "whole_gpus", "fraction_milli", "fraction_devices", "gpu_memory_mib")
    bounds = (MAX_QUANTITY, MAX_QUANTITY, MAX_TASK_DEVICES, 999, MAX_TASK_DEVICES, MAX_MEMORY_MIB)
    for name, value, upper in zip(names, task.as_tuple(), bounds):
        if not _is_int(value):
            return f"task.{name} must be an int, got {type(value).__name__}"
        if not 0 <= value <= upper:
            return f"task.{name}={value} is outside 0..{upper}"
    if task.whole_gpus > 0:
        if task.fraction_milli or task.gpu_memory_mib or task.fraction_devices:
            return "a whole-GPU task cannot also set fraction_milli, gpu_memory_mib or fraction_devices"
        return None
    if task.fraction_milli == 0 and task.gpu_memory_mib == 0:
        if task.fraction_devices != 0:
            return "fraction_devices is set but neither fraction_milli nor gpu_memory_mib is"
        return None
    if task.fraction_milli and task.gpu_memory_mib:
        return "fraction_milli and gpu_memory_mib are mutually exclusive"
    if task.fraction_devices < 1:
        return "a fraction / gpu-memory task needs fraction_devices >= 1"
    return None


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """One row of the workload table: a task shape expected to arrive, with an
    integer ``weight`` (0..MAX_TOTAL_WEIGHT; e.g. how many pending or recent pods have
    this shape).  The shape must be a valid :class:`TaskShape` (any kind; CPU-only
    shapes contribute nothing to the fragmentation measure)."""

    task: TaskShape
    weight: int = 1

    def as_row(self) -> tuple[int, int, int, int, int, int, int]:
        """The row in ABI order: the six task fields, then the weight."""
        return (*self.task.as_tuple(), self.weight)


@dataclass(frozen=True, slots=True)
class Strategy:
    """Placement strategy: ``gpu_strategy`` (:class:`GpuStrategy`, 0..2),
    ``cpu_strategy`` (:class:`CpuStrategy`, 0..1), ``device_strategy``
    (:class:`DeviceStrategy`, 0..1) and the workload table ``workload`` (a tuple of
    at most MAX_SHAPES :class:`WorkloadShape`; read only by FRAGMENTATION, validated
    always).  Not validated at construction."""

    gpu_strategy: int = GpuStrategy.BINPACK
    cpu_strategy: int = CpuStrategy.BINPACK
    device_strategy: int = DeviceStrategy.GPUPACK
    workload: tuple[WorkloadShape, ...] = ()

    def as_tuple(self) -> tuple[int, int, int]:
        """The three strategy codes in ABI order (``struct kai_pack_strategy``)."""
        return (self.gpu_strategy, self.cpu_strategy, self.device_strategy)

    def workload_rows(self) -> list[int]:
        """The workload table flattened row-major (``shapes`` of the ABI)."""
        return [value for shape in self.workload for value in shape.as_row()]


def workload_problem(workload: object) -> str | None:
    """Why a workload table is invalid (return code -1), or None.  Same conditions as
    ``workload_valid()`` in packer.c: at most MAX_SHAPES rows, each a valid task shape
    with an int weight in 0..MAX_TOTAL_WEIGHT, the weights summing to at most
    MAX_TOTAL_WEIGHT."""
    if not isinstance(workload, tuple):
        return f"strategy.workload must be a tuple, got {type(workload).__name__}"
    if len(workload) > MAX_SHAPES:
        return f"strategy.workload has {len(workload)} shapes, at most {MAX_SHAPES} allowed"
    total = 0
    for m, shape in enumerate(workload):
        if not isinstance(shape, WorkloadShape) or not isinstance(shape.task, TaskShape):
            return f"strategy.workload[{m}] must be a WorkloadShape of a TaskShape"
        problem = task_problem(shape.task)
        if problem is not None:
            return f"strategy.workload[{m}]: {problem}"
        if not _is_int(shape.weight) or not 0 <= shape.weight <= MAX_TOTAL_WEIGHT:
            return f"strategy.workload[{m}].weight={shape.weight!r} is outside 0..{MAX_TOTAL_WEIGHT}"
        total += shape.weight
    if total > MAX_TOTAL_WEIGHT:
        return f"strategy.workload weights sum to {total}, more than {MAX_TOTAL_WEIGHT}"
    return None


def workload_from_tasks(
    tasks: Iterable[TaskShape], *, max_shapes: int = MAX_SHAPES, coverage_pct: int = 100
) -> tuple[WorkloadShape, ...]:
    """A valid workload table from observed task shapes (e.g. a cycle's pending pods).

    CPU-only and invalid shapes are skipped (they strand no GPU); equal shapes are
    counted; the most frequent come first (ties by ``as_tuple()``), at most
    ``max_shapes`` (<= MAX_SHAPES) of them, stopping once they cover ``coverage_pct`` %
    of the GPU tasks; the counts are divided by the smallest integer that brings their
    sum within MAX_TOTAL_WEIGHT.  Deterministic for a given multiset of shapes.
    """
    counts: dict[TaskShape, int] = {}
    for task in tasks:
        if task_problem(task) is None and (task.whole_gpus > 0 or task.fraction_devices > 0):
            counts[task] = counts.get(task, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].as_tuple()))
    need = sum(counts.values()) * coverage_pct
    chosen: list[tuple[TaskShape, int]] = []
    covered = 0
    for task, count in ranked[: min(max_shapes, MAX_SHAPES)]:
        if covered * 100 >= need:
            break
        chosen.append((task, count))
        covered += count
    total = sum(count for _, count in chosen)
    scale = max(1, -(-total // MAX_TOTAL_WEIGHT))
    return tuple(WorkloadShape(task, count // scale) for task, count in chosen)


def strategy_problem(strategy: Strategy) -> str | None:
    """Why ``strategy`` is out of range (return code -1), or None: a code out of range
    or an invalid workload table (:func:`workload_problem`)."""
    names = ("gpu_strategy", "cpu_strategy", "device_strategy")
    for name, value, upper in zip(names, strategy.as_tuple(), (2, 1, 1)):
        if not _is_int(value):
            return f"strategy.{name} must be an int, got {type(value).__name__}"
        if not 0 <= value <= upper:
            return f"strategy.{name}={value} is outside 0..{upper}"
    return workload_problem(strategy.workload)


# --------------------------------------------------------------------------- result


class Placement(msgspec.Struct, frozen=True, gc=False):
    """The answer of one placement call. (A msgspec Struct, not a frozen dataclass: a cycle
    builds one per placement, and a Struct is several times cheaper to construct.)

    ``code``: :class:`ReturnCode` value (``place`` only ever returns OK or NO_FIT; the
    raw entry points may return the negative codes).  ``node``: chosen node or -1.
    ``devices``: chosen device indices (empty unless placed; WHOLE: ascending; SHARED: in
    device-strategy order).  ``rejections``: per-:class:`Reason` counts of rejected nodes
    (all zero for a negative code).
    """

    code: int
    node: int
    devices: tuple[int, ...]
    rejections: tuple[int, ...] = (0,) * REASON_COUNT

    @property
    def placed(self) -> bool:
        return self.code == ReturnCode.OK

    def rejected(self, reason: Reason) -> int:
        """How many nodes were rejected for ``reason``."""
        return self.rejections[reason]

    @classmethod
    def failure(cls, code: int) -> Placement:
        """The result for a negative return code."""
        return cls(code=code, node=-1, devices=(), rejections=(0,) * REASON_COUNT)


# --------------------------------------------------------------------------- device need


def need_milli(task: TaskShape, total_memory_mib: int) -> int | None:
    """The milli-GPU a SHARED ``task`` takes from a device of ``total_memory_mib``.

    * fraction task: ``fraction_milli`` on every device.
    * gpu-memory task: ``None`` if the device is not *size-capable* -- its memory is
      unknown (``total_memory_mib == 0``) or smaller than ``gpu_memory_mib``;
      otherwise ``ceil(gpu_memory_mib * 1000 / total_memory_mib)``, computed in integers
      as ``(gpu_memory_mib * 1000 + total - 1) // total``; this lies in 1..1000, and
      1000 means the task needs an idle device.

    A device *can take* the task iff this is not None and ``free_milli >= need``.
    """
    if task.fraction_milli:
        return task.fraction_milli
    return gpu_memory_share(task.gpu_memory_mib, total_memory_mib)  # the one conversion


# --------------------------------------------------------------------------- table


class PackTable(Protocol):
    """The struct-of-arrays cluster table one scheduling cycle places into.

    Every array is ``array('q')`` (int64), so the native packer reads it in place.
    n nodes, d devices; node ``i`` owns devices ``[gpu_start[i], gpu_start[i+1])``.

    * node arrays (length n): ``free_milli_cpu``, ``free_memory_bytes``, ``free_pods``,
      ``alloc_milli_cpu`` (allocatable; carried, not used by binpack/spread),
      ``eligible`` (0/1 -- default per-task eligibility; a packer call may override it);
    * ``gpu_start`` (length n+1): ``gpu_start[0] == 0``, non-decreasing,
      ``gpu_start[n] == d``;
    * device arrays (length d): ``dev_free_milli`` (0..1000), ``dev_total_memory_mib``
      (0 = unknown, <= MAX_MEMORY_MIB), ``dev_shared`` (0/1), ``dev_frac_holders``
      (number of fractional allocations on the device; ``dev_shared[j] ==
      (dev_frac_holders[j] > 0)``; not read by the packers).
    """

    @property
    def free_milli_cpu(self) -> array[int]: ...
    @property
    def free_memory_bytes(self) -> array[int]: ...
    @property
    def free_pods(self) -> array[int]: ...
    @property
    def alloc_milli_cpu(self) -> array[int]: ...
    @property
    def eligible(self) -> array[int]: ...
    @property
    def gpu_start(self) -> array[int]: ...
    @property
    def dev_free_milli(self) -> array[int]: ...
    @property
    def dev_total_memory_mib(self) -> array[int]: ...
    @property
    def dev_shared(self) -> array[int]: ...
    @property
    def dev_frac_holders(self) -> array[int]: ...

    def apply(self, node: int, devices: Sequence[int], task: TaskShape, sign: int = 1) -> None: ...


def table_problem(table: PackTable, eligible: array[int] | None = None) -> str | None:
    """Why ``table`` (with ``eligible``, default ``table.eligible``) is invalid, or None.

    Same conditions as ``table_valid()`` in packer.c, plus the array lengths (which the
    native wrapper checks before the boundary).  ``dev_frac_holders`` is not checked
    here (the packers never read it); :meth:`ArrayPackTable.problem` checks it.
    """
    elig = table.eligible if eligible is None else eligible
    n = len(table.free_milli_cpu)
    for name in ("free_memory_bytes", "free_pods", "alloc_milli_cpu"):
        if len(getattr(table, name)) != n:
            return f"{name} has length {len(getattr(table, name))}, expected {n}"
    if len(elig) != n:
        return f"eligible has length {len(elig)}, expected {n}"
    if len(table.gpu_start) != n + 1:
        return f"gpu_start has length {len(table.gpu_start)}, expected {n + 1}"
    d = len(table.dev_free_milli)
    for name in ("dev_total_memory_mib", "dev_shared"):
        if len(getattr(table, name)) != d:
            return f"{name} has length {len(getattr(table, name))}, expected {d}"
    gs = table.gpu_start
    if gs[0] != 0 or gs[n] != d:
        return f"gpu_start must start at 0 and end at {d}"
    for i in range(n):
        if gs[i + 1] < gs[i]:
            return f"gpu_start decreases at node {i}"
        if table.free_milli_cpu[i] < 0 or table.free_memory_bytes[i] < 0 or table.free_pods[i] < 0:
            return f"node {i} has a negative free quantity"
        if table.alloc_milli_cpu[i] < 0:
            return f"node {i} has negative alloc_milli_cpu"
        if elig[i] not in (0, 1):
            return f"eligible[{i}]={elig[i]} is not 0/1"
    for j in range(d):
        if not 0 <= table.dev_free_milli[j] <= MILLI_PER_GPU:
            return f"dev_free_milli[{j}]={table.dev_free_milli[j]} is outside 0..1000"
        if not 0 <= table.dev_total_memory_mib[j] <= MAX_MEMORY_MIB:
            return f"dev_total_memory_mib[{j}] is outside 0..{MAX_MEMORY_MIB}"
        if table.dev_shared[j] not in (0, 1):
            return f"dev_shared[{j}]={table.dev_shared[j]} is not 0/1"
    return None


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """One device, for :meth:`ArrayPackTable.from_rows`.  ``frac_holders`` defaults to
    ``shared`` (one holder if shared)."""

    free_milli: int = MILLI_PER_GPU
    total_memory_mib: int = 0
    shared: int = 0
    frac_holders: int | None = None


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node, for :meth:`ArrayPackTable.from_rows`.  ``alloc_milli_cpu`` defaults to
    ``free_milli_cpu``."""

    free_milli_cpu: int = 0
    free_memory_bytes: int = 0
    free_pods: int = 110
    devices: tuple[DeviceRow, ...] = ()
    eligible: int = 1
    alloc_milli_cpu: int | None = None


def _int64_array(values: Iterable[int]) -> array[int]:
    return array("q", values)


#: shapes already validated by `ArrayPackTable.apply` (bounded; a cache, not state)
_VALID_TASKS: set[TaskShape] = set()


class ArrayPackTable:
    """The concrete :class:`PackTable`: ten ``array('q')`` buffers, updated in place.

    Build it once per scheduling cycle (constructor or :meth:`from_rows`), place with a
    packer, then :meth:`apply` each placement (``sign=+1``) and roll a plan back with
    ``sign=-1``.  The buffers are never resized, so the native packer can read them
    without copying.
    """

    #: the buffers, in ABI order
    ARRAYS: ClassVar[tuple[str, ...]] = (
        "free_milli_cpu",
        "free_memory_bytes",
        "free_pods",
        "alloc_milli_cpu",
        "eligible",
        "gpu_start",
        "dev_free_milli",
        "dev_total_memory_mib",
        "dev_shared",
        "dev_frac_holders",
    )
    #: the buffers nothing writes once the table is built (placements change the others)
    FIXED: ClassVar[frozenset[str]] = frozenset({"alloc_milli_cpu", "eligible", "gpu_start", "dev_total_memory_mib"})
    #: ``changes``: how many placements were applied or undone since the table was built;
    #: ``last_change``: the last one, ``(node, devices, task, sign)`` (None before any)
    __slots__ = (*ARRAYS, "changes", "last_change", "__weakref__")

    def __init__(
        self,
        *,
        free_milli_cpu: Iterable[int],
        free_memory_bytes: Iterable[int],
        free_pods: Iterable[int],
        gpu_start: Iterable[int],
        dev_free_milli: Iterable[int],
        alloc_milli_cpu: Iterable[int] | None = None,
        eligible: Iterable[int] | None = None,
        dev_total_memory_mib: Iterable[int] | None = None,
        dev_shared: Iterable[int] | None = None,
        dev_frac_holders: Iterable[int] | None = None,
    ) -> None:
        try:
            self.free_milli_cpu = _int64_array(free_milli_cpu)
            self.free_memory_bytes = _int64_array(free_memory_bytes)
            self.free_pods = _int64_array(free_pods)
            n = len(self.free_milli_cpu)
            self.alloc_milli_cpu = (
                _int64_array(self.free_milli_cpu) if alloc_milli_cpu is None else _int64_array(alloc_milli_cpu)
            )
            self.eligible = _int64_array([1] * n) if eligible is None else _int64_array(eligible)
            self.gpu_start = _int64_array(gpu_start)
            self.dev_free_milli = _int64_array(dev_free_milli)
            d = len(self.dev_free_milli)
            self.dev_total_memory_mib = (
                _int64_array([0] * d) if dev_total_memory_mib is None else _int64_array(dev_total_memory_mib)
            )
            self.dev_shared = _int64_array([0] * d) if dev_shared is None else _int64_array(dev_shared)
            self.dev_frac_holders = (
                _int64_array(self.dev_shared) if dev_frac_holders is None else _int64_array(dev_frac_holders)
            )
        except (OverflowError, TypeError) as exc:
            raise InvalidArgument(f"table values must be int64: {exc}") from exc
        self.changes = 0
        self.last_change: tuple[int, Sequence[int], TaskShape, int] | None = None
        problem = self.problem()
        ensure(problem is None, problem)

    @classmethod
    def from_rows(cls, rows: Iterable[NodeRow]) -> ArrayPackTable:
        """Build a table from per-node rows (convenient for tests and tools)."""
        node_rows = list(rows)
        gpu_start = [0]
        devices: list[DeviceRow] = []
        for row in node_rows:
            devices.extend(row.devices)
            gpu_start.append(len(devices))
        return cls(
            free_milli_cpu=[r.free_milli_cpu for r in node_rows],
            free_memory_bytes=[r.free_memory_bytes for r in node_rows],
            free_pods=[r.free_pods for r in node_rows],
            alloc_milli_cpu=[r.free_milli_cpu if r.alloc_milli_cpu is None else r.alloc_milli_cpu for r in node_rows],
            eligible=[r.eligible for r in node_rows],
            gpu_start=gpu_start,
            dev_free_milli=[dv.free_milli for dv in devices],
            dev_total_memory_mib=[dv.total_memory_mib for dv in devices],
            dev_shared=[dv.shared for dv in devices],
            dev_frac_holders=[dv.shared if dv.frac_holders is None else dv.frac_holders for dv in devices],
        )

    # ----------------------------------------------------------------- inspection

    @property
    def n_nodes(self) -> int:
        return len(self.free_milli_cpu)

    @property
    def n_devices(self) -> int:
        return len(self.dev_free_milli)

    def devices_of(self, node: int) -> range:
        """The device indices node ``node`` owns."""
        return range(self.gpu_start[node], self.gpu_start[node + 1])

    def problem(self) -> str | None:
        """:func:`table_problem` plus the ``dev_frac_holders`` invariant."""
        problem = table_problem(self)
        if problem is not None:
            return problem
        if len(self.dev_frac_holders) != self.n_devices:
            return f"dev_frac_holders has length {len(self.dev_frac_holders)}, expected {self.n_devices}"
        for j, holders in enumerate(self.dev_frac_holders):
            if holders < 0:
                return f"dev_frac_holders[{j}] is negative"
            if self.dev_shared[j] != (1 if holders > 0 else 0):
                return f"dev_shared[{j}] disagrees with dev_frac_holders[{j}]"
        return None

    def snapshot(self) -> tuple[tuple[int, ...], ...]:
        """An immutable copy of every array (for equality checks)."""
        return tuple(tuple(getattr(self, name)) for name in self.ARRAYS)

    def copy(self) -> ArrayPackTable:
        """A copy that placements on either table leave the other unchanged: the buffers a
        placement writes (`apply_placed`) are copied, the others (`FIXED`: what a node is,
        not what it has free) shared. A Plan copies two tables a cycle; at 20,000 nodes the
        shared ones are 1.8 MB a table that never needed copying."""
        new = ArrayPackTable.__new__(ArrayPackTable)
        fixed = self.FIXED
        for name in self.ARRAYS:
            value = getattr(self, name)
            setattr(new, name, value if name in fixed else array("q", value))
        new.changes, new.last_change = 0, None
        return new

    # ----------------------------------------------------------------- mutation

    def apply(self, node: int, devices: Sequence[int], task: TaskShape, sign: int = 1) -> None:
        """Commit (``sign=+1``) or roll back (``sign=-1``) placing ``task`` on ``node``.

        * node: ``free_milli_cpu -= sign*milli_cpu``, ``free_memory_bytes -=
          sign*memory_bytes``, ``free_pods -= sign``;
        * WHOLE task: each device's ``free_milli -= sign*1000`` (so +1 needs an idle
          device and -1 a fully taken one);
        * SHARED task: each device's ``free_milli -= sign*need_milli(task, total)``,
          ``frac_holders += sign`` and ``shared = 1 if frac_holders > 0 else 0``.

        ``devices`` must be ``task.device_count`` distinct devices owned by ``node``.
        Everything is checked before anything is written (free quantities stay >= 0 and
        int64, ``free_milli`` within 0..1000, holders >= 0); a violation raises
        :class:`InvalidArgument` and leaves the table unchanged.  Applying then
        un-applying the same placement restores every array exactly.
        """
        ensure(sign in (1, -1), f"sign must be +1 or -1, got {sign!r}")
        if task not in _VALID_TASKS:
            problem = task_problem(task)
            ensure(problem is None, problem)
            if len(_VALID_TASKS) < 4096:
                _VALID_TASKS.add(task)
        ensure(0 <= node < self.n_nodes, f"node {node} is out of range")
        devs = tuple(devices)
        count = task.whole_gpus if task.whole_gpus > 0 else task.fraction_devices
        ensure(len(devs) == count, f"expected {count} devices, got {len(devs)}")
        ensure(len(set(devs)) == len(devs), f"devices {devs} are not distinct")
        owned = self.devices_of(node)
        for j in devs:
            ensure(j in owned, f"device {j} is not owned by node {node}")

        cpu = self.free_milli_cpu[node] - sign * task.milli_cpu
        mem = self.free_memory_bytes[node] - sign * task.memory_bytes
        pods = self.free_pods[node] - sign
        for name, value in (("free_milli_cpu", cpu), ("free_memory_bytes", mem), ("free_pods", pods)):
            ensure(0 <= value <= INT64_MAX, f"node {node}: {name} would become {value}")

        shared_task = task.whole_gpus == 0 and task.fraction_devices > 0
        updates: list[tuple[int, int, int]] = []
        for j in devs:
            holders = self.dev_frac_holders[j]
            if shared_task:
                need = need_milli(task, self.dev_total_memory_mib[j])
                ensure(need is not None, f"device {j} cannot hold {task.gpu_memory_mib} MiB")
                assert need is not None
                holders += sign
                ensure(holders >= 0, f"device {j} has no fractional holder to remove")
            else:
                need = MILLI_PER_GPU
            free = self.dev_free_milli[j] - sign * need
            ensure(0 <= free <= MILLI_PER_GPU, f"device {j}: free_milli would become {free}")
            updates.append((j, free, holders))

        self.changes += 1
        self.last_change = (node, devs, task, sign)
        self.free_milli_cpu[node] = cpu
        self.free_memory_bytes[node] = mem
        self.free_pods[node] = pods
        for j, free, holders in updates:
            self.dev_free_milli[j] = free
            self.dev_frac_holders[j] = holders
            self.dev_shared[j] = 1 if holders > 0 else 0


    def can_take(self, node: int, devices: Sequence[int], task: TaskShape) -> bool:
        """Whether `apply_placed(node, devices, task, +1)` keeps every free quantity >= 0 (for
        a placement chosen on another table, e.g. idle capacity checked against future)."""
        if (self.free_milli_cpu[node] < task.milli_cpu or self.free_memory_bytes[node] < task.memory_bytes
                or self.free_pods[node] < 1):
            return False
        for j in devices:
            need = MILLI_PER_GPU if task.whole_gpus > 0 else need_milli(task, self.dev_total_memory_mib[j])
            if need is None or self.dev_free_milli[j] < need:
                return False
        return True

    def apply_placed(self, node: int, devices: Sequence[int], task: TaskShape, sign: int = 1) -> None:
        """`apply` without the checks, for a placement a packer has just answered on this very
        table (sign=+1) or for undoing one such placement (sign=-1): those are valid by
        construction. Anything else must use `apply`."""
        self.changes += 1
        self.last_change = (node, devices, task, sign)
        self.free_milli_cpu[node] -= sign * task.milli_cpu
        self.free_memory_bytes[node] -= sign * task.memory_bytes
        self.free_pods[node] -= sign
        if task.whole_gpus > 0:
            for j in devices:
                self.dev_free_milli[j] -= sign * MILLI_PER_GPU
            return
        for j in devices:
            need = need_milli(task, self.dev_total_memory_mib[j])
            assert need is not None
            holders = self.dev_frac_holders[j] + sign
            self.dev_free_milli[j] -= sign * need
            self.dev_frac_holders[j] = holders
            self.dev_shared[j] = 1 if holders > 0 else 0


# --------------------------------------------------------------------------- packer protocol


#: `place` bound to one table and strategy: (task, eligible) -> Placement (see `Packer.bind`)
PlaceFn = Callable[["TaskShape", "array[int] | None"], "Placement"]

#: A placement and the nodes that passed the filter, best first, at most the cap asked for:
#: `ranked[0]` is the placement's node. Every node not listed ranks after the last listed one
#: (a lower score, or the same score and a higher index). Empty when nothing fits.
Ranking = tuple["Placement", tuple[int, ...]]

#: `Ranking` from a `RankFn`: the nodes as any sequence (the native engine's is an
#: `array('q')`, copied from its buffer: turning 128 ranked rows into Python ints cost ~5 us a call)
BoundRanking = tuple["Placement", Sequence[int]]

#: `rank_raw` bound to one table and strategy: (task, eligible, cap) -> BoundRanking
RankFn = Callable[["TaskShape", "array[int] | None", int], BoundRanking]



class Packer(Protocol):
    """A placement engine.  :class:`~kai_es.scheduling.packing.reference.ReferencePacker`
    (the specification) and :class:`~kai_es.scheduling.packing.native.NativePacker`
    (the C hot path) give identical answers."""

    @property
    def kind(self) -> str: ...

    def place(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None = None
    ) -> Placement: ...

    def place_raw(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None = None
    ) -> Placement: ...

    def rank_raw(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None, cap: int
    ) -> Ranking:
        """`place_raw`'s answer and the best `cap` (1..MAX_RANKED) nodes that passed the filter,
        best first (`Ranking`). A `cap` out of range is EINVAL."""
        ...
