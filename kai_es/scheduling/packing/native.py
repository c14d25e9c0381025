"""NativePacker: a thin cffi wrapper over ``kai_pack_place`` (``csrc/packer.c``).

The wrapper validates what it can cheaply before the boundary (task and strategy,
array types and lengths -- the lengths are what keep the C code inside its buffers),
lets C validate the array *contents*, and maps negative return codes to the typed
exceptions of :mod:`.model`.  The table's ``array('q')`` buffers are handed to C
without copying; the bound ``struct kai_pack_table`` is cached per table (weakly), so
the per-call cost is a few small ``ffi.new`` calls.

The strategy's workload table (:attr:`Strategy.workload`) is flattened into one
``array('q')`` and handed to C as ``strategy->shapes``; the last one is cached (by
identity), so a cycle that reuses one ``Strategy`` pays the conversion once.

The answers are, by contract, identical to
:class:`~kai_es.scheduling.packing.reference.ReferencePacker`.
"""

from __future__ import annotations

import weakref
from array import array
from types import ModuleType
from typing import Any

from kai_es._native import load

from .model import (
    GpuStrategy,
    ArrayPackTable,
    MAX_NODE_DEVICES,
    MAX_RANKED,
    MAX_MEMORY_MIB,
    MAX_QUANTITY,
    MAX_SHAPES,
    MAX_TASK_DEVICES,
    MAX_TOTAL_WEIGHT,
    REASON_COUNT,
    SHAPE_FIELDS,
    NativePackerUnavailable,
    PackTable,
    PackingError,
    PlaceFn,
    Placement,
    BoundRanking,
    RankFn,
    Ranking,
    ReturnCode,
    Strategy,
    TaskShape,
    ensure,
    raise_for_result,
    strategy_problem,
    task_problem,
)

__all__ = ["NativePacker", "import_native", "NATIVE_MODULE", "ABI_VERSION"]

NATIVE_MODULE = "kai_es._native._packer"
ABI_VERSION = 4

_NODE_FIELDS = ("free_milli_cpu", "free_memory_bytes", "free_pods", "alloc_milli_cpu")
_DEVICE_FIELDS = ("dev_free_milli", "dev_total_memory_mib", "dev_shared")
# Order of the pointer members of struct kai_pack_table.
_TABLE_FIELDS = (*_NODE_FIELDS, "gpu_start", *_DEVICE_FIELDS, "eligible")

_ADVICE = "to use the pure-Python twin instead, set KAI_ES_PACKER=reference explicitly"


def import_native(module: ModuleType | None = None) -> ModuleType:
    """``kai_es._native._packer`` (or `module`), checked against this side's ABI version and
    constants, or raise :class:`NativePackerUnavailable`."""
    return load(NATIVE_MODULE, what="native packer", abi_function="kai_pack_abi_version",
                abi_version=ABI_VERSION, error=NativePackerUnavailable, module=module, advice=_ADVICE,
                constants={"KAI_PACK_REASON_COUNT": REASON_COUNT, "KAI_PACK_MAX_TASK_DEVICES": MAX_TASK_DEVICES,
                           "KAI_PACK_MAX_MEMORY_MIB": MAX_MEMORY_MIB, "KAI_PACK_MAX_QUANTITY": MAX_QUANTITY,
                           "KAI_PACK_SHAPE_FIELDS": SHAPE_FIELDS, "KAI_PACK_MAX_SHAPES": MAX_SHAPES,
                           "KAI_PACK_MAX_TOTAL_WEIGHT": MAX_TOTAL_WEIGHT,
                           "KAI_PACK_MAX_NODE_DEVICES": MAX_NODE_DEVICES, "KAI_PACK_MAX_RANKED": MAX_RANKED})


def _lengths_agree(arrays: tuple[array[int], ...], eligible: int) -> bool:
    """Whether a bound table's buffers (and an eligibility mask of length `eligible`) have the
    lengths `kai_pack_place` will read: the memory-safety contract of the boundary."""
    n, d = len(arrays[0]), len(arrays[5])
    return (len(arrays[1]) == n and len(arrays[2]) == n and len(arrays[3]) == n and eligible == n
            and len(arrays[4]) == n + 1 and len(arrays[6]) == d and len(arrays[7]) == d)


def _check_buffer(name: str, value: object) -> array[int]:
    if not isinstance(value, array) or value.typecode != "q":
        raise TypeError(f"{name} must be array('q'), got {type(value).__name__}")
    return value


_OK = ReturnCode.OK
#: where the devices start in a task's output buffer: node, then the rejection counts
_DEVICES_AT = 1 + REASON_COUNT


class _Bound:
    """A table's arrays, their cffi views and the filled ``kai_pack_table`` struct; `checked`:
    whether `kai_pack_table_check` accepted the table (`_Calls`), by whether the strategy is
    FRAGMENTATION (which checks each node's device count too)."""

    __slots__ = ("arrays", "views", "struct", "checked")

    def __init__(self, arrays: tuple[array[int], ...], views: list[Any], struct: Any) -> None:
        self.arrays = arrays
        self.views = views  # keeps the buffer exports (and so the memory) alive
        self.struct = struct
        self.checked: dict[bool, bool] = {}


class NativePacker:
    """Placement through the compiled ``kai_pack_place``."""

    __slots__ = ("_module", "_ffi", "_lib", "_bound", "_workload", "_valid_tasks", "_valid_strategy",
                 "_c_tasks", "_c_strategy", "_elig", "_outs")

    def __init__(self, module: ModuleType | None = None) -> None:
        mod = import_native(module)
        self._module = mod
        self._ffi: Any = mod.ffi
        self._lib: Any = mod.lib
        self._bound: weakref.WeakKeyDictionary[Any, _Bound] = weakref.WeakKeyDictionary()
        # (workload tuple, its flattened array, the cffi view) of the last call
        self._workload: tuple[object, array[int], Any] | None = None
        # Per-call costs that do not change between calls are paid once. C still checks every
        # value on every call; these caches only skip repeated Python-side work.
        self._valid_tasks: set[TaskShape] = set()
        self._valid_strategy: Strategy | None = None
        self._c_tasks: dict[TaskShape, tuple[Any, Any, int]] = {}
        self._c_strategy: tuple[Strategy, Any, int, Any] | None = None
        self._elig: tuple[array[int], Any] | None = None
        self._outs: dict[int, Any] = {}

    @property
    def kind(self) -> str:
        return "native"

    @property
    def module(self) -> ModuleType:
        """The loaded extension module (``kai_es._native._packer``)."""
        return self._module

    @property
    def lib(self) -> Any:
        return self._lib

    @property
    def ffi(self) -> Any:
        return self._ffi

    # ----------------------------------------------------------------- binding

    def _bind(self, table: PackTable) -> _Bound:
        try:
            cached = self._bound.get(table)
        except TypeError:  # not weak-referenceable: bind every call
            cached = None
        if cached is not None:
            for name, a in zip(_TABLE_FIELDS, cached.arrays):
                if getattr(table, name) is not a:
                    break
            else:
                return cached
        arrays = tuple(_check_buffer(name, getattr(table, name)) for name in _TABLE_FIELDS)
        ffi = self._ffi
        views = [ffi.from_buffer("int64_t[]", a) for a in arrays]
        struct = ffi.new("kai_pack_table *")
        struct.n_nodes = len(arrays[0])
        struct.n_devices = len(arrays[5])
        (struct.free_milli_cpu, struct.free_memory_bytes, struct.free_pods, struct.alloc_milli_cpu,
         struct.gpu_start, struct.dev_free_milli, struct.dev_total_memory_mib, struct.dev_shared) = views[:8]
        bound = _Bound(arrays, views, struct)
        try:
            self._bound[table] = bound
        except TypeError:
            pass
        return bound

    def _shapes(self, strategy: Strategy) -> tuple[int, Any] | None:
        """(n_shapes, pointer) of the strategy's workload, or None if it cannot be
        handed to C (not a tuple of WorkloadShape, too long, or not int64)."""
        workload = strategy.workload
        cached = self._workload
        if cached is not None and cached[0] is workload:
            return len(cached[1]) // SHAPE_FIELDS, cached[2]
        if not isinstance(workload, tuple) or len(workload) > MAX_SHAPES:
            return None
        if not workload:
            return 0, self._ffi.NULL
        try:
            flat = array("q", strategy.workload_rows())
        except (AttributeError, OverflowError, TypeError):
            return None
        view = self._ffi.from_buffer("int64_t[]", flat)
        self._workload = (workload, flat, view)
        return len(workload), view

    # ----------------------------------------------------------------- placement

    def place(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None = None
    ) -> Placement:
        """Place ``task``; returns a :class:`Placement` with code OK or NO_FIT.

        Raises :class:`InvalidArgument` (bad task, strategy, workload or table) or
        ``TypeError`` (a table buffer that is not ``array('q')``).
        """
        if task not in self._valid_tasks:
            problem = task_problem(task)
            ensure(problem is None, problem)
            if len(self._valid_tasks) < 4096:
                self._valid_tasks.add(task)
        if strategy is not self._valid_strategy:
            problem = strategy_problem(strategy)
            ensure(problem is None, problem)
            self._valid_strategy = strategy
        result = self.place_raw(table, task, strategy, eligible)
        if result.code < 0:
            raise_for_result(result, table, strategy, eligible)
        return result

    def bind(self, table: PackTable, strategy: Strategy) -> PlaceFn:
        """`place` for one table and strategy, with every per-call check that cannot change
        between calls done now: a cycle's plan places hundreds of tasks on the same two tables.
        The returned function answers exactly as `place(table, task, strategy, eligible)` would,
        provided the table's buffers are not replaced or resized while it is used (an
        `ArrayPackTable` never resizes them; a `Plan` never replaces them)."""
        return _Calls(self, table, strategy, reuse_check=True).place

    def bind_rank(self, table: PackTable, strategy: Strategy) -> RankFn:
        """`rank_raw` for one table and strategy, checked once as `bind` is; raises
        `InvalidArgument` for a cap outside 1..MAX_RANKED."""
        return _Calls(self, table, strategy, reuse_check=True).rank

    def rank_raw(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None, cap: int
    ) -> Ranking:
        """Call ``kai_pack_rank`` (`Packer.rank_raw`); negative codes are returned, not raised."""
        if not isinstance(cap, int) or not 1 <= cap <= MAX_RANKED:
            return Placement.failure(ReturnCode.EINVAL), ()
        try:
            answer, ranked = _Calls(self, table, strategy).rank(task, eligible, cap)
            return answer, tuple(ranked)
        except (PackingError, OverflowError, TypeError):
            return Placement.failure(ReturnCode.EINVAL), ()

    def _task_c(self, task: TaskShape) -> tuple[Any, Any, int]:
        """(`kai_pack_task`, output buffer, devices wanted) for `task`, made once per shape (the
        output buffer is shared by shapes that want as many devices: it is read before the next
        call). Raises OverflowError or TypeError for values C cannot hold."""
        c = self._c_tasks.get(task)
        if c is None:
            c_task = self._ffi.new("kai_pack_task *", task.as_tuple())
            want = c_task.whole_gpus if c_task.whole_gpus > 0 else c_task.fraction_devices
            want = min(max(want, 0), MAX_TASK_DEVICES)
            out = self._outs.get(want)
            if out is None:
                out = self._outs[want] = self._ffi.new("int64_t[]", 1 + REASON_COUNT + want)
            c = (c_task, out, want)
            if len(self._c_tasks) < 4096:
                self._c_tasks[task] = c
        return c

    def place_raw(
        self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None = None
    ) -> Placement:
        """Call ``kai_pack_place`` and return its answer as a :class:`Placement`
        (negative codes included, nothing raised for invalid values)."""
        ffi = self._ffi
        bound = self._bind(table)
        arrays = bound.arrays
        cached_elig = self._elig
        if eligible is None:
            elig = bound.arrays[8]
        elif cached_elig is not None and cached_elig[0] is eligible:
            elig = eligible
        else:
            elig = _check_buffer("eligible", eligible)
        if not _lengths_agree(arrays, len(elig)):
            return Placement.failure(ReturnCode.EINVAL)
        shapes = self._shapes(strategy)
        if shapes is None:
            return Placement.failure(ReturnCode.EINVAL)
        try:
            c_task, out, want = self._task_c(task)
            cs = self._c_strategy
            if cs is not None and cs[0] is strategy and cs[2] == shapes[0]:
                c_strategy = cs[1]
            else:
                c_strategy = ffi.new("kai_pack_strategy *", (*strategy.as_tuple(), *shapes))
                self._c_strategy = (strategy, c_strategy, shapes[0], shapes[1])
        except (OverflowError, TypeError):
            return Placement.failure(ReturnCode.EINVAL)
        if eligible is None:
            c_elig = bound.views[8]
        elif cached_elig is not None and cached_elig[0] is eligible:
            c_elig = cached_elig[1]
        else:
            c_elig = ffi.from_buffer("int64_t[]", elig)
            self._elig = (eligible, c_elig)
        code = int(
            self._lib.kai_pack_place(
                bound.struct, c_elig, c_task, c_strategy,
                out, out + 1 + REASON_COUNT, want, out + 1, REASON_COUNT,
            )
        )
        if code < 0:
            return Placement.failure(ReturnCode(code))
        reasons = tuple(ffi.unpack(out + 1, REASON_COUNT))
        if code == 0:
            return Placement(_OK, int(out[0]), tuple(ffi.unpack(out + 1 + REASON_COUNT, want)), reasons)
        return Placement(ReturnCode(code), -1, (), reasons)


class _Calls:
    """`kai_pack_place` and `kai_pack_rank` bound to one table and strategy: the checks that
    cannot change between calls made once (`NativePacker.bind`).

    An `ArrayPackTable` that `kai_pack_table_check` accepts when bound is kept valid by its own
    writers (`apply` checks what it writes; `apply_placed` writes a placement the packer
    answered on it, or undoes one; nothing writes its `FIXED` buffers, `gpu_start` among
    them): its calls go to the `_trusting` entry points, which do not check every node and
    device again (on every call that cost about what the scan does). A mask is checked to be
    all 0 and 1 the first time it is seen (as `kai_pack_place` would refuse it otherwise).
    Any other table is checked on every call."""

    __slots__ = ("packer", "table", "strategy", "struct", "c_strategy", "keep", "n", "c_tasks",
                 "c_eligible", "ranked", "trusting", "place_c", "rank_c", "unpack")

    def __init__(self, packer: NativePacker, table: PackTable, strategy: Strategy,
                 reuse_check: bool = False) -> None:
        problem = strategy_problem(strategy)
        ensure(problem is None, problem)
        bound = packer._bind(table)
        arrays = bound.arrays
        if not _lengths_agree(arrays, len(arrays[8])):
            raise_for_result(Placement.failure(ReturnCode.EINVAL), table, strategy, None)
        shapes = packer._shapes(strategy)
        if shapes is None:
            raise_for_result(Placement.failure(ReturnCode.EINVAL), table, strategy, None)
        assert shapes is not None
        self.packer, self.table, self.strategy = packer, table, strategy
        self.struct = bound.struct
        self.c_strategy = packer._ffi.new("kai_pack_strategy *", (*strategy.as_tuple(), *shapes))
        self.keep = (bound, shapes)  # alive as long as the calls
        self.n = len(arrays[0])
        #: the tasks checked valid: (`kai_pack_task`, output buffer, devices wanted)
        self.c_tasks: dict[TaskShape, tuple[Any, Any, int]] = {}
        #: id(eligible) -> (eligible, its cffi view)
        self.c_eligible: dict[int, tuple[array[int], Any]] = {}
        #: cap -> (ranked rows buffer, count buffer)
        self.ranked: dict[int, tuple[Any, Any]] = {}
        lib = packer._lib
        self.trusting = isinstance(table, ArrayPackTable) and self._checked(bound, strategy, reuse_check)
        # looked up once: every placement a cycle asks comes through here
        if self.trusting:
            self.place_c, self.rank_c = lib.kai_pack_place_trusting, lib.kai_pack_rank_trusting
        else:
            self.place_c, self.rank_c = lib.kai_pack_place, lib.kai_pack_rank
        self.unpack = packer._ffi.unpack

    def _checked(self, bound: _Bound, strategy: Strategy, reuse: bool) -> bool:
        """Whether `kai_pack_table_check` accepts the bound table. With `reuse` (`bind` and
        `bind_rank`: a Plan binds each of its tables three times), an answer already given for
        the table (and kind of strategy) stands: an `ArrayPackTable`'s writers keep it as it was
        checked. A one-off call (`place`, `rank_raw`) checks it again."""
        fragmentation = strategy.gpu_strategy == GpuStrategy.FRAGMENTATION
        ok = bound.checked.get(fragmentation) if reuse else None
        if ok is None:
            ok = bound.checked[fragmentation] = self.packer._lib.kai_pack_table_check(
                bound.struct, bound.views[8], self.c_strategy) == 0
        return ok

    def _task(self, task: TaskShape) -> tuple[Any, Any, int]:
        c = self.c_tasks.get(task)
        if c is None:
            problem = task_problem(task)
            ensure(problem is None, problem)
            c = self.c_tasks[task] = self.packer._task_c(task)
        return c

    def _eligible(self, eligible: array[int] | None) -> Any:
        if eligible is None:
            return self.keep[0].views[8]
        e = self.c_eligible.get(id(eligible))
        if e is None or e[0] is not eligible:
            if len(_check_buffer("eligible", eligible)) != self.n or (
                    self.trusting and eligible.count(0) + eligible.count(1) != self.n):
                raise_for_result(Placement.failure(ReturnCode.EINVAL), self.table, self.strategy, eligible)
            e = self.c_eligible[id(eligible)] = (eligible, self.packer._ffi.from_buffer("int64_t[]", eligible))
        return e[1]

    def place(self, task: TaskShape, eligible: array[int] | None = None) -> Placement:
        c_task, out, want = self._task(task)
        code = self.place_c(self.struct, self._eligible(eligible), c_task, self.c_strategy,
                            out, out + _DEVICES_AT, want, out + 1, REASON_COUNT)
        unpack = self.unpack
        if code == 0:
            return Placement(_OK, out[0], tuple(unpack(out + _DEVICES_AT, want)),
                             tuple(unpack(out + 1, REASON_COUNT)))
        if code < 0:
            raise_for_result(Placement.failure(ReturnCode(code)), self.table, self.strategy, eligible)
        return Placement(ReturnCode(code), -1, (), tuple(unpack(out + 1, REASON_COUNT)))

    def rank(self, task: TaskShape, eligible: array[int] | None, cap: int) -> BoundRanking:
        ensure(isinstance(cap, int) and 1 <= cap <= MAX_RANKED, f"cap {cap!r}: expected 1..{MAX_RANKED}")
        c_task, out, want = self._task(task)
        buffers = self.ranked.get(cap)
        ffi = self.packer._ffi
        if buffers is None:
            buffers = self.ranked[cap] = (ffi.new("int64_t[]", 4 * cap), ffi.new("int64_t *"))
        rows, count = buffers
        code = self.rank_c(self.struct, self._eligible(eligible), c_task, self.c_strategy,
                           rows, cap, count, out + _DEVICES_AT, want, out + 1, REASON_COUNT)
        if code < 0:
            raise_for_result(Placement.failure(ReturnCode(code)), self.table, self.strategy, eligible)
        unpack = self.unpack
        reasons = tuple(unpack(out + 1, REASON_COUNT))
        if code != 0:
            return Placement(ReturnCode(code), -1, (), reasons), ()
        listed = array("q")
        listed.frombytes(ffi.buffer(rows, 32 * count[0]))  # (rows of 4 int64: the node first)
        ranked = listed[::4]
        return Placement(_OK, ranked[0], tuple(unpack(out + _DEVICES_AT, want)), reasons), ranked
