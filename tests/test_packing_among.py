"""The packer's answer on a few known nodes (`packing.among`): on a mask allowing one node,
every field equals the packer's scan; among candidate nodes outside which none fits, the node
and devices equal the scan's; for every strategy and task kind, on both packers' tables."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.scheduling.packing import ArrayPackTable, DeviceRow, GpuStrategy, NodeRow, Strategy, TaskShape, load_packer
from kai_es.scheduling.packing.among import best_among, on_one_node
from kai_es.scheduling.packing.reference import filter_node
from tests.test_packer_repeat import STRATEGIES, TASKS, tables

NATIVE = load_packer("native")


@settings(max_examples=300, deadline=None)
@given(table=tables(), strategy=st.sampled_from(STRATEGIES), task=st.sampled_from(TASKS), data=st.data())
def test_on_one_node_is_the_packers_answer_in_every_field(table: ArrayPackTable, strategy: Strategy,
                                                          task: TaskShape, data: st.DataObject) -> None:
    node = data.draw(st.integers(0, table.n_nodes - 1))
    only = array("q", [0] * table.n_nodes)
    only[node] = 1
    answer = on_one_node(table, task, strategy, only, node)
    if strategy.gpu_strategy == GpuStrategy.FRAGMENTATION:
        assert answer is None  # the packer answers itself
        return
    assert answer == NATIVE.place(table, task, strategy, only)


def test_on_one_node_leaves_an_invalid_task_to_the_packer() -> None:
    table = ArrayPackTable.from_rows([NodeRow(free_milli_cpu=8000, free_memory_bytes=1 << 30, free_pods=10,
                                              devices=(DeviceRow(free_milli=1000, total_memory_mib=40960),))] * 2)
    only = array("q", [1, 0])
    bad = TaskShape(milli_cpu=-1, memory_bytes=0, whole_gpus=0, fraction_milli=0, fraction_devices=0,
                    gpu_memory_mib=0)
    assert on_one_node(table, bad, STRATEGIES[0], only, 0) is None


@settings(max_examples=300, deadline=None)
@given(table=tables(), strategy=st.sampled_from(STRATEGIES), task=st.sampled_from(TASKS), data=st.data())
def test_best_among_the_only_nodes_that_fit_is_the_scans_node(table: ArrayPackTable, strategy: Strategy,
                                                              task: TaskShape, data: st.DataObject) -> None:
    mask = array("q", data.draw(st.lists(st.integers(0, 1), min_size=table.n_nodes, max_size=table.n_nodes)))
    fitting = [i for i in range(table.n_nodes) if filter_node(table, mask, i, task) is None]
    others = data.draw(st.lists(st.integers(0, table.n_nodes - 1), max_size=3))
    candidates = sorted(set(fitting) | set(others))  # every node that fits, and some that do not
    answer = best_among(table, task, strategy, mask, candidates)
    scan = NATIVE.place(table, task, strategy, mask)
    assert (answer.code, answer.node, answer.devices) == (scan.code, scan.node, scan.devices)
