"""A table checked once (csrc/packer.h, "A TABLE CHECKED ONCE"): `kai_pack_table_check` makes
exactly the content checks `kai_pack_place` makes on every call; the `_trusting` entry points
answer as the checked ones on a valid table and still refuse everything else that is wrong;
the native wrapper trusts only an `ArrayPackTable` the check accepted when bound, and refuses a
mask that is not all 0 and 1 as the checked call would."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.scheduling import packing
from kai_es.scheduling.packing import ArrayPackTable, InvalidArgument, Strategy, TaskShape
from kai_es.scheduling.packing.model import (
    REASON_COUNT,
    CpuStrategy,
    DeviceRow,
    DeviceStrategy,
    GpuStrategy,
    NodeRow,
    ReturnCode,
)
from kai_es.scheduling.packing.native import NativePacker, _Calls

GIB = 1 << 30
BINPACK = Strategy(GpuStrategy.BINPACK, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK)
STRATEGIES = [BINPACK, Strategy(GpuStrategy.SPREAD, CpuStrategy.SPREAD, DeviceStrategy.GPUSPREAD),
              Strategy(GpuStrategy.FRAGMENTATION)]
TASKS = [TaskShape.cpu(500), TaskShape.whole(1, milli_cpu=1000), TaskShape.whole(2),
         TaskShape.fraction(500), TaskShape.gpu_memory(20480), TaskShape.fraction(250, devices=2)]


def _table(rows: list[tuple[int, list[int]]]) -> ArrayPackTable:
    return ArrayPackTable.from_rows([
        NodeRow(free_milli_cpu=cpu, free_memory_bytes=64 * GIB, free_pods=110,
                devices=tuple(DeviceRow(free_milli=f, total_memory_mib=40960, shared=0) for f in devs))
        for cpu, devs in rows])


def _c(packer: NativePacker, t: ArrayPackTable, strategy: Strategy) -> tuple[Any, Any, Any]:
    """(lib, ffi, the bound calls) of `t` with `strategy`."""
    calls = _Calls(packer, t, strategy)
    return packer._lib, packer._ffi, calls


def _both(packer: NativePacker, calls: _Calls, task: TaskShape, eligible: Any, cap: int) -> tuple[object, object]:
    """Every output of `kai_pack_rank` and of `kai_pack_rank_trusting` for the same call."""
    ffi, lib = packer._ffi, packer._lib
    out = []
    for fn in (lib.kai_pack_rank, lib.kai_pack_rank_trusting):
        rows, count = ffi.new("int64_t[]", 4 * cap), ffi.new("int64_t *")
        devices, reasons = ffi.new("int64_t[]", 8), ffi.new("int64_t[]", REASON_COUNT)
        c_task = ffi.new("kai_pack_task *", task.as_tuple())
        code = fn(calls.struct, eligible, c_task, calls.c_strategy, rows, cap, count, devices, 8, reasons, REASON_COUNT)
        out.append((code, list(rows[0:4 * count[0]]), list(devices[0:8]), list(reasons[0:REASON_COUNT])))
    return out[0], out[1]


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 8000), st.lists(st.sampled_from([0, 250, 500, 1000]), max_size=4)),
                     min_size=1, max_size=6),
       strategy=st.sampled_from(STRATEGIES), task=st.sampled_from(TASKS), cap=st.integers(1, 8),
       mask_bits=st.integers(0, 63))
def test_trusting_answers_as_checked_on_a_valid_table(rows: list[tuple[int, list[int]]], strategy: Strategy,
                                                      task: TaskShape, cap: int, mask_bits: int) -> None:
    packer = NativePacker()
    t = _table(rows)
    lib, ffi, calls = _c(packer, t, strategy)
    assert lib.kai_pack_table_check(calls.struct, calls.keep[0].views[8], calls.c_strategy) == 0
    mask = array("q", [(mask_bits >> (i % 6)) & 1 for i in range(len(rows))])
    for eligible in (calls.keep[0].views[8], ffi.from_buffer("int64_t[]", mask)):
        checked, trusting = _both(packer, calls, task, eligible, cap)
        assert checked == trusting


@pytest.mark.parametrize(("array_name", "index", "value"), [
    ("dev_free_milli", 0, 1001), ("dev_free_milli", 1, -1), ("dev_shared", 0, 2),
    ("dev_total_memory_mib", 1, -5), ("free_pods", 1, -1), ("free_milli_cpu", 0, -(2**63)),
    ("free_memory_bytes", 1, -1), ("alloc_milli_cpu", 0, -1), ("eligible", 0, 2), ("eligible", 1, -1),
    ("gpu_start", 1, 3),
])
def test_the_check_refuses_what_every_checked_call_refuses(array_name: str, index: int, value: int) -> None:
    packer = NativePacker()
    t = _table([(8000, [1000]), (8000, [1000])])
    getattr(t, array_name)[index] = value
    lib, _, calls = _c(packer, t, BINPACK)
    assert lib.kai_pack_table_check(calls.struct, calls.keep[0].views[8], calls.c_strategy) == ReturnCode.EINVAL
    assert packer.place_raw(t, TaskShape.cpu(1), BINPACK).code == ReturnCode.EINVAL
    # bound to such a table, the wrapper checks every call: it refuses it as `place` does
    assert not calls.trusting
    with pytest.raises(InvalidArgument):
        calls.place(TaskShape.cpu(1))


def test_the_check_refuses_a_fragmentation_node_with_too_many_devices() -> None:
    packer = NativePacker()
    big = ArrayPackTable(free_milli_cpu=[1000], free_memory_bytes=[GIB], free_pods=[1],
                         gpu_start=[0, 65537], dev_free_milli=[1000] * 65537)
    lib, _, calls = _c(packer, big, Strategy(GpuStrategy.FRAGMENTATION))
    assert lib.kai_pack_table_check(calls.struct, calls.keep[0].views[8], calls.c_strategy) == ReturnCode.EINVAL
    assert lib.kai_pack_table_check(calls.struct, calls.keep[0].views[8], _c(packer, big, BINPACK)[2].c_strategy) == 0


def test_trusting_still_refuses_what_is_not_the_tables_contents() -> None:
    packer = NativePacker()
    t = _table([(8000, [1000, 1000])])
    lib, ffi, calls = _c(packer, t, BINPACK)
    elig = calls.keep[0].views[8]
    node, devices, reasons = ffi.new("int64_t *"), ffi.new("int64_t[]", 4), ffi.new("int64_t[]", REASON_COUNT)
    good = ffi.new("kai_pack_task *", TaskShape.whole(2).as_tuple())
    place = lib.kai_pack_place_trusting
    assert place(calls.struct, elig, good, calls.c_strategy, node, devices, 4, reasons, REASON_COUNT) == 0
    assert node[0] == 0
    bad_task = ffi.new("kai_pack_task *", (0, 0, 1, 500, 1, 0))
    bad_strategy = ffi.new("kai_pack_strategy *", (3, 0, 0, 0, ffi.NULL))
    assert place(calls.struct, elig, bad_task, calls.c_strategy, node, devices, 4, reasons, REASON_COUNT) < 0
    assert place(calls.struct, elig, good, bad_strategy, node, devices, 4, reasons, REASON_COUNT) < 0
    assert place(calls.struct, elig, good, calls.c_strategy, node, devices, 1, reasons, REASON_COUNT) < 0
    assert place(calls.struct, elig, good, calls.c_strategy, node, devices, 4, ffi.NULL, REASON_COUNT) < 0
    assert place(calls.struct, ffi.NULL, good, calls.c_strategy, node, devices, 4, reasons, REASON_COUNT) < 0
    assert place(ffi.NULL, elig, good, calls.c_strategy, node, devices, 4, reasons, REASON_COUNT) < 0
    shape = ffi.new("kai_pack_table *")
    shape.n_nodes, shape.n_devices = 1, 3  # gpu_start ends at 2: the shape is checked
    (shape.free_milli_cpu, shape.free_memory_bytes, shape.free_pods, shape.alloc_milli_cpu, shape.gpu_start,
     shape.dev_free_milli, shape.dev_total_memory_mib, shape.dev_shared) = calls.keep[0].views[:8]
    assert place(shape, elig, good, calls.c_strategy, node, devices, 4, reasons, REASON_COUNT) < 0
    rows, count = ffi.new("int64_t[]", 4), ffi.new("int64_t *")
    assert lib.kai_pack_rank_trusting(calls.struct, elig, good, calls.c_strategy, rows, 0, count,
                                      devices, 4, reasons, REASON_COUNT) < 0  # cap 0


def test_the_wrapper_trusts_a_valid_array_table_and_checks_each_new_mask() -> None:
    packer = NativePacker()
    t = _table([(8000, [1000]), (8000, [1000])])
    calls = _Calls(packer, t, BINPACK)
    assert calls.trusting
    assert calls.rank_c is packer._lib.kai_pack_rank_trusting and calls.place_c is packer._lib.kai_pack_place_trusting
    assert calls.place(TaskShape.whole(1), array("q", [0, 1])).node == 1
    with pytest.raises(InvalidArgument, match="0/1"):
        calls.place(TaskShape.whole(1), array("q", [0, 2]))
    with pytest.raises(InvalidArgument, match="0/1"):
        calls.rank(TaskShape.whole(1), array("q", [-1, 1]), 2)
    # the plan's path: bound once, placements applied between calls, answers as `place`'s
    bound = packing.bind_place(packer, t, BINPACK)
    for _ in range(2):
        answer = bound(TaskShape.whole(1))
        assert answer == packer.place(t, TaskShape.whole(1), BINPACK)
        t.apply_placed(answer.node, answer.devices, TaskShape.whole(1), 1)
    assert bound(TaskShape.whole(1)).code == ReturnCode.NO_FIT


class _CountingLib:
    """The compiled library, counting `kai_pack_table_check` calls."""

    def __init__(self, lib: Any) -> None:
        self._lib, self.checks = lib, 0

    def kai_pack_table_check(self, *args: Any) -> int:
        self.checks += 1
        return int(self._lib.kai_pack_table_check(*args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)


def test_binds_of_one_table_check_it_once_and_a_one_off_call_checks_it_again() -> None:
    packer = NativePacker()
    counting = _CountingLib(packer._lib)
    packer._lib = counting
    t = _table([(8000, [1000]), (8000, [1000])])
    packing.bind_place(packer, t, BINPACK)  # (binds `place` and `rank`)
    packer.bind_rank(t, BINPACK)
    assert counting.checks == 1  # as a Plan binds its idle table three times
    packer.bind(t, Strategy(GpuStrategy.FRAGMENTATION))
    assert counting.checks == 2  # FRAGMENTATION checks more
    t.dev_free_milli[0] = 1001  # (no writer of the table does this: a test's corruption)
    with pytest.raises(InvalidArgument):
        packer.place(t, TaskShape.cpu(1), BINPACK)  # one-off calls check the table again
    answer, _ = packer.rank_raw(t, TaskShape.cpu(1), BINPACK, None, 2)
    assert answer.code == ReturnCode.EINVAL and counting.checks == 3
