"""A task asked again (`packing.repeat.RepeatedPlace`, what `bind_place` returns for a table):
every answer equals a fresh scan by the packer in every field (node, devices, rejection counts),
after any sequence of placements applied, not applied and undone, for every strategy and task
kind; and a run of identical binpacked pods asks the packer only when its node fills up."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.scheduling.packing import (
    ArrayPackTable,
    CpuStrategy,
    DeviceRow,
    DeviceStrategy,
    GpuStrategy,
    NodeRow,
    Packer,
    Placement,
    Strategy,
    TaskShape,
    WorkloadShape,
    bind_place,
    bind_rank,
    load_packer,
)
from kai_es.scheduling.packing.repeat import RANK_CAP, RepeatedPlace
from tests.builders import counting_rank

GIB = 1 << 30
TASKS = (
    TaskShape.whole(1, 1000, GIB),
    TaskShape.whole(2, 0, 0),
    TaskShape.cpu(2000, 2 * GIB),
    TaskShape.cpu(0, 0),
    TaskShape.fraction(500, 1, 100, GIB),
    TaskShape.gpu_memory(20480, 1, 0, 0),
)
STRATEGIES = [Strategy(g, c, d, (WorkloadShape(TASKS[0], 1),) if g == GpuStrategy.FRAGMENTATION else ())
              for g in GpuStrategy for c in CpuStrategy for d in DeviceStrategy]


@st.composite
def tables(draw: st.DrawFn) -> ArrayPackTable:
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        devices = tuple(DeviceRow(free_milli=draw(st.sampled_from([0, 250, 500, 1000, 1000, 1000])),
                                  total_memory_mib=40960)
                        for _ in range(draw(st.sampled_from([0, 2, 4, 8]))))
        rows.append(NodeRow(free_milli_cpu=draw(st.sampled_from([0, 3000, 8000, 64000])),
                            free_memory_bytes=draw(st.sampled_from([0, 4, 64])) * GIB,
                            free_pods=draw(st.sampled_from([0, 2, 110])), devices=devices))
    return ArrayPackTable.from_rows(rows)


@pytest.mark.parametrize("kind", ["native", "reference"])
@settings(max_examples=150, deadline=None)
@given(table=tables(), strategy=st.sampled_from(STRATEGIES), data=st.data())
def test_every_answer_is_the_packers_own(kind: str, table: ArrayPackTable, strategy: Strategy,
                                         data: st.DataObject) -> None:
    packer = load_packer(kind)  # type: ignore[arg-type]
    place = bind_place(packer, table, strategy)
    assert isinstance(place, RepeatedPlace)
    n = table.n_nodes
    masks = [array("q", [1] * n), array("q", [i % 2 for i in range(n)])]
    applied: list[tuple[int, tuple[int, ...], TaskShape]] = []
    task, mask = TASKS[0], masks[0]
    for _ in range(data.draw(st.integers(1, 30))):
        if data.draw(st.booleans()):  # else the same task again, as a run of identical pods asks
            task = data.draw(st.sampled_from(TASKS))
            mask = data.draw(st.sampled_from(masks))
        if data.draw(st.integers(0, 9)) == 0:
            mask[data.draw(st.integers(0, n - 1))] ^= 1  # a mask changed in place, as a caller may
        got = place(task, mask)
        assert got == packer.place(table, task, strategy, array("q", mask))
        then = data.draw(st.sampled_from(["apply", "apply", "apply", "leave", "undo"]))
        if then == "apply" and got.placed:
            table.apply_placed(got.node, got.devices, task, 1)
            applied.append((got.node, got.devices, task))
        elif then == "undo" and applied:
            node, devices, done = applied.pop()
            table.apply_placed(node, devices, done, -1)


class _Mask(array):  # type: ignore[type-arg]
    """A mask that counts how often its contents are compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Mask.compared += 1
        return array.__eq__(self, other)

    __hash__ = None


@pytest.mark.parametrize("kind", ["native", "reference"])
@settings(max_examples=100, deadline=None)
@given(table=tables(), strategy=st.sampled_from(STRATEGIES), data=st.data())
def test_a_fixed_mask_is_known_by_identity_and_answers_stay_the_packers(
        kind: str, table: ArrayPackTable, strategy: Strategy, data: st.DataObject) -> None:
    """A mask passed with `fixed=True` (its caller never changes it) is the same mask when passed
    again as the same object: its contents are not compared. Mixed with masks that do change
    (passed without `fixed`), and with a copy of it, every answer is still a fresh scan's."""
    packer = load_packer(kind)  # type: ignore[arg-type]
    place = bind_place(packer, table, strategy)
    assert isinstance(place, RepeatedPlace)
    n = table.n_nodes
    fixed = _Mask("q", [1] * n)
    changing = array("q", [i % 2 for i in range(n)])
    for _ in range(data.draw(st.integers(1, 30))):
        task = data.draw(st.sampled_from(TASKS[:3]))
        which = data.draw(st.sampled_from(["fixed", "fixed", "fixed", "changing", "copy"]))
        if which == "changing" and data.draw(st.booleans()):
            changing[data.draw(st.integers(0, n - 1))] ^= 1
        mask = {"fixed": fixed, "changing": changing, "copy": array("q", fixed)}[which]
        got = place(task, mask, fixed=which == "fixed")
        assert got == packer.place(table, task, strategy, array("q", mask))
        if got.placed and data.draw(st.booleans()):
            table.apply_placed(got.node, got.devices, task, 1)
    place(TASKS[0], fixed, fixed=True)
    _Mask.compared = 0
    place(TASKS[0], fixed, fixed=True)
    place(TASKS[0], fixed, fixed=True)
    assert _Mask.compared == 0


@pytest.mark.parametrize("kind", ["native", "reference"])
@settings(max_examples=150, deadline=None)
@given(table=tables(), strategy=st.sampled_from(STRATEGIES), task=st.sampled_from(TASKS), data=st.data())
def test_the_best_two_ranked_say_where_a_task_goes_and_whether_another_node_fits(
        kind: str, table: ArrayPackTable, strategy: Strategy, task: TaskShape, data: st.DataObject) -> None:
    """`bind_rank` (`Plan.fits_elsewhere`'s scan, consolidation's check that a pod could move)
    with a cap of two: its first node is the packer's placement, and a second is listed exactly
    when the packer places the task on the mask without that node."""
    packer = load_packer(kind)  # type: ignore[arg-type]
    mask = array("q", [data.draw(st.integers(0, 1)) for _ in range(table.n_nodes)])
    answer, ranked = bind_rank(packer, table, strategy)(task, mask, 2)
    first = packer.place(table, task, strategy, mask)
    assert answer == first
    if not first.placed:
        assert not ranked
        return
    assert ranked[0] == first.node
    others = array("q", mask)
    others[first.node] = 0
    assert (len(ranked) > 1) == packer.place(table, task, strategy, others).placed


@settings(max_examples=150, deadline=None)
@given(table=tables(), data=st.data())
def test_a_copied_table_and_its_original_never_see_each_others_placements(
        table: ArrayPackTable, data: st.DataObject) -> None:
    """`ArrayPackTable.copy` (a Plan's tables, from the ones kept across cycles) shares only the
    buffers no placement writes (`FIXED`): placing and undoing on the copy leaves the original
    as it was, and the shared buffers as they were."""
    packer = load_packer("reference")
    before = table.snapshot()
    copy = table.copy()
    assert all((getattr(copy, name) is getattr(table, name)) == (name in ArrayPackTable.FIXED)
               for name in ArrayPackTable.ARRAYS)
    done: list[tuple[int, tuple[int, ...], TaskShape]] = []
    strategy = STRATEGIES[0]
    for _ in range(data.draw(st.integers(1, 12))):
        task = data.draw(st.sampled_from(TASKS))
        got = packer.place(copy, task, strategy)
        if got.placed:
            copy.apply_placed(got.node, got.devices, task, 1)
            done.append((got.node, got.devices, task))
        elif done and data.draw(st.booleans()):
            node, devices, placed = done.pop()
            copy.apply_placed(node, devices, placed, -1)
    assert table.snapshot() == before
    for node, devices, placed in reversed(done):
        copy.apply_placed(node, devices, placed, -1)
    assert copy.snapshot() == before


def _run(place: Callable[[TaskShape, array[int] | None], Placement], packer: Packer, table: ArrayPackTable,
         strategy: Strategy, task: TaskShape, count: int) -> list[int]:
    """Place `count` tasks one after the other, each answer checked against a fresh scan and
    applied: the nodes chosen."""
    mask = array("q", [1] * table.n_nodes)
    nodes = []
    for _ in range(count):
        got = place(task, mask)
        assert got == packer.place(table, task, strategy, mask)
        table.apply_placed(got.node, got.devices, task, 1)
        nodes.append(got.node)
    return nodes


def test_identical_binpacked_pods_ask_the_packer_only_when_their_node_fills() -> None:
    table = ArrayPackTable.from_rows([NodeRow(free_milli_cpu=64000, free_memory_bytes=64 * GIB, free_pods=110,
                                              devices=tuple(DeviceRow(free_milli=1000) for _ in range(4)))
                                      for _ in range(3)])
    strategy = Strategy(GpuStrategy.BINPACK, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK)
    packer = load_packer("native")
    asked: list[TaskShape] = []

    def counted(task: TaskShape, eligible: array[int] | None = None) -> Placement:
        asked.append(task)
        return packer.place(table, task, strategy, eligible)

    nodes = _run(RepeatedPlace(counted, table, strategy), packer, table, strategy, TaskShape.whole(1, 1000, GIB), 12)
    assert nodes == [0] * 4 + [1] * 4 + [2] * 4
    assert len(asked) == 3  # once per node: when the last one filled up


def _one_idle_gpu_in_two_nodes_of_three(kind: str, nodes: int
                                        ) -> tuple[ArrayPackTable, Strategy, Packer, RepeatedPlace]:
    """`nodes` nodes of two GPUs, one idle on two nodes in three (a full cluster's steady state),
    GPU binpack, and the bound packer `kind` asked through."""
    table = ArrayPackTable.from_rows([
        NodeRow(free_milli_cpu=4000, free_memory_bytes=GIB, free_pods=110,
                devices=(DeviceRow(free_milli=0 if i % 3 == 2 else 1000), DeviceRow(free_milli=0)))
        for i in range(nodes)])
    strategy = Strategy(GpuStrategy.BINPACK, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK)
    packer = load_packer(kind)  # type: ignore[arg-type]
    place = bind_place(packer, table, strategy)
    assert isinstance(place, RepeatedPlace)
    return table, strategy, packer, place


@pytest.mark.parametrize("kind", ["native", "reference"])
@pytest.mark.parametrize(("nodes", "task", "scans"), [
    # two nodes in three have one idle GPU (a full cluster's steady state): each pod fills its
    # node, and the next answer is the scan's runner-up; more than RANK_CAP need a second scan
    (2 * RANK_CAP, TaskShape.whole(1, 0, 0), 2),
    # the node's CPU runs out before its GPUs: the node given up is counted under CPU
    (5, TaskShape.whole(1, 3000, 0), 1),
])
def test_a_run_of_identical_pods_scans_once_per_ranked_nodes(kind: str, nodes: int, task: TaskShape,
                                                            scans: int) -> None:
    """Once the node of a run's answer fills up, the next answer is the node the scan ranked
    next (`Packer.rank_raw`), its rejection counts the last answer's plus the node given up:
    one scan per `RANK_CAP` nodes filled, each answer the packer's own in every field."""
    table, strategy, packer, place = _one_idle_gpu_in_two_nodes_of_three(kind, nodes)
    assert place.rank is not None
    ranks: list[int] = []
    place.rank = counting_rank(place.rank, ranks)
    idle = [i for i in range(nodes) if i % 3 != 2]
    filled = _run(place, packer, table, strategy, task, len(idle))
    assert sorted(filled) == idle
    assert len(ranks) == scans
    after = place(task, array("q", [1] * nodes))
    assert after == packer.place(table, task, strategy, array("q", [1] * nodes)) and not after.placed


@pytest.mark.parametrize("kind", ["native", "reference"])
def test_a_run_goes_on_past_another_tasks_ask_that_places_nothing(kind: str) -> None:
    """One-GPU pods of a queue asked between 8-GPU pods that fit nowhere (a full cluster's
    steady state, allocate's order interleaving queues): the 8-GPU ask changes nothing, so the
    one-GPU run goes on from its scan, one scan per `RANK_CAP` nodes filled as without them."""
    nodes = 2 * RANK_CAP
    table, strategy, packer, place = _one_idle_gpu_in_two_nodes_of_three(kind, nodes)
    rank = place.rank
    assert rank is not None
    scans: list[TaskShape] = []

    def counted(task: TaskShape, eligible: array[int] | None, cap: int) -> tuple[Placement, Sequence[int]]:
        scans.append(task)
        return rank(task, eligible, cap)

    place.rank = counted
    one, eight = TaskShape.whole(1, 0, 0), TaskShape.whole(8, 0, 0)
    mask = array("q", [1] * nodes)
    filled = []
    for _ in range(sum(1 for i in range(nodes) if i % 3 != 2)):
        got = place(one, mask, True)
        assert got == packer.place(table, one, strategy, mask)
        table.apply_placed(got.node, got.devices, one, 1)
        filled.append(got.node)
        big = place(eight, mask, True)
        assert big == packer.place(table, eight, strategy, mask) and not big.placed
    assert sorted(filled) == [i for i in range(nodes) if i % 3 != 2]
    assert scans.count(one) == 2  # as many as a run asked alone (the test above)


@pytest.mark.parametrize(("task", "strategy"), [
    (TaskShape.whole(1, 0, 0), Strategy(GpuStrategy.SPREAD, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK)),
    (TaskShape.cpu(1000, 0), Strategy(GpuStrategy.BINPACK, CpuStrategy.SPREAD, DeviceStrategy.GPUPACK)),
    (TaskShape.cpu(1000, 0), Strategy(GpuStrategy.FRAGMENTATION, CpuStrategy.SPREAD, DeviceStrategy.GPUPACK,
                                      (WorkloadShape(TaskShape.whole(1, 0, 0), 1),))),
    (TaskShape.whole(1, 1000, 0), Strategy(GpuStrategy.BINPACK, CpuStrategy.SPREAD, DeviceStrategy.GPUPACK)),
    (TaskShape.cpu(1000, 0), Strategy(GpuStrategy.SPREAD, CpuStrategy.BINPACK, DeviceStrategy.GPUSPREAD)),
])
def test_the_next_identical_task_stays_or_moves_on_as_the_packer_decides(task: TaskShape, strategy: Strategy) -> None:
    """Where placing a task raises its node's rank (GPU binpack for a whole-GPU task, CPU
    binpack but not fragmentation for a CPU-only one) the next identical task stays there;
    elsewhere it may move on: node after node, the answers are the packer's."""
    table = ArrayPackTable.from_rows([NodeRow(free_milli_cpu=4000, free_memory_bytes=GIB, free_pods=110,
                                              devices=tuple(DeviceRow(free_milli=1000) for _ in range(4)))
                                      for _ in range(2)])
    packer = load_packer("native")
    nodes = _run(bind_place(packer, table, strategy), packer, table, strategy, task, 4)
    stays = strategy.gpu_strategy == GpuStrategy.BINPACK if task.whole_gpus else \
        strategy.cpu_strategy == CpuStrategy.BINPACK and strategy.gpu_strategy != GpuStrategy.FRAGMENTATION
    assert len(set(nodes)) == (1 if stays else 2)
