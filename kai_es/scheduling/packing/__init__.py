"""GPU placement hot path: one task -> best node and devices, with rejection counts.

Two engines give identical answers:

* ``NativePacker`` -- ``csrc/packer.c`` through cffi (``kai_es._native._packer``);
* ``ReferencePacker`` -- the pure-Python twin and executable specification.

:func:`load_packer` picks one.  The default is the native packer and it RAISES
:class:`NativePackerUnavailable` if the extension is not built; the twin is used only
when asked for explicitly (``load_packer("reference")``; the CLI also honours
``KAI_ES_PACKER=reference`` through ``kai_es.app.packer_from_env``).
"""

from __future__ import annotations

from array import array
from typing import Literal, Protocol

from .model import (
    MAX_MEMORY_MIB,
    MAX_NODE_DEVICES,
    MAX_QUANTITY,
    MAX_SHAPES,
    MAX_TASK_DEVICES,
    MAX_TOTAL_WEIGHT,
    MILLI_PER_GPU,
    REASON_COUNT,
    ArrayPackTable,
    CpuStrategy,
    DeviceRow,
    DeviceStrategy,
    GpuStrategy,
    InvalidArgument,
    NativePackerUnavailable,
    NodeRow,
    Packer,
    PackingError,
    PackTable,
    PlaceFn,
    Placement,
    BoundRanking,
    RankFn,
    Ranking,
    Reason,
    ReturnCode,
    Strategy,
    TaskKind,
    TaskShape,
    UnsupportedStrategy,
    WorkloadShape,
    ensure,
    need_milli,
    raise_for_result,
    strategy_problem,
    task_problem,
    workload_from_tasks,
    workload_problem,
)
from .native import NativePacker
from .reference import ReferencePacker
from .repeat import RepeatedPlace

__all__ = [
    "BoundPlace",
    "PlaceFn",
    "bind_place",
    "bind_rank",
    "MAX_MEMORY_MIB",
    "MAX_NODE_DEVICES",
    "MAX_QUANTITY",
    "MAX_SHAPES",
    "MAX_TASK_DEVICES",
    "MAX_TOTAL_WEIGHT",
    "MILLI_PER_GPU",
    "REASON_COUNT",
    "ArrayPackTable",
    "CpuStrategy",
    "DeviceRow",
    "DeviceStrategy",
    "GpuStrategy",
    "InvalidArgument",
    "NativePacker",
    "NativePackerUnavailable",
    "NodeRow",
    "Packer",
    "PackingError",
    "PackTable",
    "Placement",
    "BoundRanking",
    "RankFn",
    "Ranking",
    "Reason",
    "ReferencePacker",
    "ReturnCode",
    "Strategy",
    "TaskKind",
    "TaskShape",
    "UnsupportedStrategy",
    "WorkloadShape",
    "load_packer",
    "need_milli",
    "workload_from_tasks",
    "workload_problem",
]

PackerKind = Literal["native", "reference"]


def load_packer(kind: PackerKind = "native") -> Packer:
    """Return a packer.

    ``kind="native"`` -> :class:`NativePacker`; raises :class:`NativePackerUnavailable`
    (with build instructions) if ``kai_es._native._packer`` is not built -- never falls
    back.  ``kind="reference"`` -> :class:`ReferencePacker`. (Choosing from the
    environment, ``KAI_ES_PACKER``, is the shell's job: ``kai_es.app.packer_from_env``.)
    """
    if kind == "native":
        return NativePacker()
    if kind == "reference":
        return ReferencePacker()
    raise ValueError(f"unknown packer kind {kind!r}: expected 'native' or 'reference'")


class BoundPlace(Protocol):
    """`place` bound to one table and strategy (`bind_place`); `fixed`: the caller never changes
    `eligible` afterwards (`repeat.RepeatedPlace`), which changes no answer."""

    def __call__(self, task: TaskShape, eligible: array[int] | None = None, fixed: bool = False) -> Placement: ...


def bind_rank(packer: Packer, table: PackTable, strategy: Strategy) -> RankFn:
    """`packer.rank_raw` for one table and strategy, raising as `place` does for what it cannot
    place (the packer's own `bind_rank` when it has one)."""
    own = getattr(packer, "bind_rank", None)
    if own is not None:
        return own(table, strategy)  # type: ignore[no-any-return]

    def rank(task: TaskShape, eligible: array[int] | None, cap: int) -> BoundRanking:
        problem = task_problem(task) or strategy_problem(strategy)
        ensure(problem is None, problem)  # as `place` says it
        answer, ranked = packer.rank_raw(table, task, strategy, eligible, cap)
        if answer.code < 0:
            raise_for_result(answer, table, strategy, eligible)
        return answer, ranked

    return rank


def bind_place(packer: Packer, table: PackTable, strategy: Strategy) -> BoundPlace:
    """`packer.place` for one table and strategy: the packer's own `bind` when it has one
    (the native packer checks once what does not change between calls), else a plain wrapper;
    for an `ArrayPackTable`, one that knows the answer to a task asked again without a scan
    (`repeat.RepeatedPlace`, with the packer's ranking). Same answers as `packer.place` in
    every field."""
    bind = getattr(packer, "bind", None)
    fn: PlaceFn
    if bind is not None:
        fn = bind(table, strategy)
    else:
        def fn(task: TaskShape, eligible: array[int] | None = None) -> Placement:
            return packer.place(table, task, strategy, eligible)

    if isinstance(table, ArrayPackTable):
        rank = bind_rank(packer, table, strategy)
        return RepeatedPlace(fn, table, strategy, rank)

    def bound(task: TaskShape, eligible: array[int] | None = None, fixed: bool = False) -> Placement:
        return fn(task, eligible)

    return bound
