"""GPU placement hot path: known answers, native == reference, apply/unapply, loader."""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_es.scheduling import packing
from kai_es.scheduling.packing import (
    ArrayPackTable,
    CpuStrategy,
    DeviceRow,
    DeviceStrategy,
    GpuStrategy,
    InvalidArgument,
    PackingError,
    NativePacker,
    NativePackerUnavailable,
    NodeRow,
    Packer,
    Placement,
    Reason,
    ReferencePacker,
    ReturnCode,
    Strategy,
    TaskShape,
    WorkloadShape,
    load_packer,
)
from kai_es.scheduling.packing.model import (
    MAX_NODE_DEVICES,
    MAX_RANKED,
    MAX_SHAPES,
    MAX_TOTAL_WEIGHT,
    workload_from_tasks,
)
from kai_es.scheduling.packing.reference import filter_node, score_node
from kai_es.scheduling.packing import native as native_module

GIB = 1 << 30
BINPACK = Strategy(GpuStrategy.BINPACK, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK)
SPREAD = Strategy(GpuStrategy.SPREAD, CpuStrategy.SPREAD, DeviceStrategy.GPUSPREAD)


@pytest.fixture(params=["native", "reference"])
def packer(request: pytest.FixtureRequest) -> Packer:
    return load_packer(request.param)


def node(cpu: int = 8000, mem: int = 64 * GIB, pods: int = 110, devs: tuple[DeviceRow, ...] = (), elig: int = 1) -> NodeRow:
    return NodeRow(free_milli_cpu=cpu, free_memory_bytes=mem, free_pods=pods, devices=devs, eligible=elig)


def dev(free: int = 1000, total: int = 40960, shared: int = 0) -> DeviceRow:
    return DeviceRow(free_milli=free, total_memory_mib=total, shared=shared)


def table(*rows: NodeRow) -> ArrayPackTable:
    return ArrayPackTable.from_rows(rows)


def rej(**counts: int) -> tuple[int, ...]:
    out = [0] * len(Reason)
    for name, value in counts.items():
        out[Reason[name]] = value
    return tuple(out)


# ----------------------------------------------------------------------------- the native module


def test_native_module_is_loaded() -> None:
    """Fails when the extension is not built: the native packer must really be native."""
    import kai_es._native._packer as compiled

    p = load_packer("native")
    assert isinstance(p, NativePacker)
    assert p.module is compiled
    assert p.lib is compiled.lib
    assert compiled.lib.kai_pack_abi_version() == native_module.ABI_VERSION


def test_default_loader_is_native_and_env_selects_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from kai_es.app import PACKER_ENV_VAR, packer_from_env

    monkeypatch.delenv(PACKER_ENV_VAR, raising=False)
    assert isinstance(load_packer(), NativePacker)
    assert isinstance(packer_from_env(), NativePacker)
    monkeypatch.setenv(PACKER_ENV_VAR, "reference")
    assert isinstance(packer_from_env(), ReferencePacker)
    assert isinstance(packer_from_env("native"), NativePacker)  # an explicit kind wins
    monkeypatch.setenv(PACKER_ENV_VAR, "fallback-please")
    with pytest.raises(ValueError):
        packer_from_env()


def test_missing_native_module_raises_never_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from kai_es.app import PACKER_ENV_VAR, packer_from_env

    monkeypatch.delenv(PACKER_ENV_VAR, raising=False)
    monkeypatch.setattr(native_module, "NATIVE_MODULE", "kai_es._native._no_such_module")
    with pytest.raises(NativePackerUnavailable, match="KAI_ES_PACKER=reference"):
        load_packer()
    with pytest.raises(NativePackerUnavailable):
        packer_from_env()
    with pytest.raises(NativePackerUnavailable):
        load_packer("native")
    assert isinstance(load_packer("reference"), ReferencePacker)


# ----------------------------------------------------------------------------- CPU-only tasks


def test_cpu_task_prefers_cpu_only_node(packer: Packer) -> None:
    # Binpack alone would pick node 0 (1000 left < 7000 left); CPU-only preference wins.
    t = table(node(cpu=2000, devs=(dev(),)), node(cpu=8000))
    p = packer.place(t, TaskShape.cpu(1000), BINPACK)
    assert (p.code, p.node, p.devices, p.rejections) == (ReturnCode.OK, 1, (), rej())


def test_cpu_task_goes_to_gpu_node_when_no_cpu_only_node_fits(packer: Packer) -> None:
    t = table(node(cpu=2000, devs=(dev(),)), node(cpu=500))
    p = packer.place(t, TaskShape.cpu(1000), BINPACK)
    assert (p.node, p.rejections) == (0, rej(CPU=1))


def test_cpu_binpack_vs_spread(packer: Packer) -> None:
    t = table(node(cpu=4000), node(cpu=2000), node(cpu=8000))
    assert packer.place(t, TaskShape.cpu(1000), BINPACK).node == 1  # 1000 left: least
    assert packer.place(t, TaskShape.cpu(1000), SPREAD).node == 2  # 7000 left: most


def test_ties_go_to_lowest_node_index(packer: Packer) -> None:
    t = table(node(elig=0), node(), node(), node())
    assert packer.place(t, TaskShape.cpu(1000), BINPACK).node == 1
    assert packer.place(t, TaskShape.cpu(1000), SPREAD).node == 1
    g = table(node(devs=(dev(500),)), node(devs=(dev(500),)))
    assert packer.place(g, TaskShape.fraction(200), BINPACK).node == 0
    assert packer.place(g, TaskShape.whole(1), BINPACK).code == ReturnCode.NO_FIT


# ----------------------------------------------------------------------------- whole-GPU tasks


def test_whole_gpu_binpack_vs_spread(packer: Packer) -> None:
    # after placing one whole GPU: node 0 has 1000 milli left, node 1 has 500.
    t = table(node(devs=(dev(), dev())), node(devs=(dev(), dev(500))))
    binpack = packer.place(t, TaskShape.whole(1), BINPACK)
    assert (binpack.node, binpack.devices) == (1, (2,))
    spread = packer.place(t, TaskShape.whole(1), SPREAD)
    assert (spread.node, spread.devices) == (0, (0,))


def test_whole_gpu_takes_lowest_index_idle_devices(packer: Packer) -> None:
    t = table(node(devs=(dev(), dev(300), dev(), dev())))
    p = packer.place(t, TaskShape.whole(2), BINPACK)
    assert (p.node, p.devices) == (0, (0, 2))


def test_whole_gpu_cpu_strategy_breaks_gpu_tie(packer: Packer) -> None:
    t = table(node(cpu=8000, devs=(dev(),)), node(cpu=3000, devs=(dev(),)))
    assert packer.place(t, TaskShape.whole(1, milli_cpu=1000), BINPACK).node == 1
    assert packer.place(t, TaskShape.whole(1, milli_cpu=1000), SPREAD).node == 0


def test_whole_gpu_rejected_for_gpu_when_not_enough_idle(packer: Packer) -> None:
    t = table(node(devs=(dev(), dev(999))), node(), node(devs=(dev(), dev())))
    p = packer.place(t, TaskShape.whole(2), BINPACK)
    assert (p.node, p.devices, p.rejections) == (2, (2, 3), rej(GPU=2))


# ----------------------------------------------------------------------------- shared tasks


def test_shared_reuse_beats_gpu_strategy(packer: Packer) -> None:
    # GPU spread alone prefers node 0 (700 left vs 300), but node 1 reuses a shared device.
    t = table(node(devs=(dev(1000),)), node(devs=(dev(600, shared=1),)))
    for strategy in (BINPACK, SPREAD):
        p = packer.place(t, TaskShape.fraction(300), strategy)
        assert (p.node, p.devices) == (1, (1,))


def test_shared_gpu_binpack_vs_spread(packer: Packer) -> None:
    t = table(node(devs=(dev(1000), dev(1000))), node(devs=(dev(400),)))
    assert packer.place(t, TaskShape.fraction(300), BINPACK).node == 1  # 100 left
    assert packer.place(t, TaskShape.fraction(300), SPREAD).node == 0  # 1700 left


def test_shared_gpu_key_beats_cpu_key(packer: Packer) -> None:
    t = table(node(cpu=2000, devs=(dev(1000),)), node(cpu=9000, devs=(dev(500),)))
    cpu_spread = Strategy(GpuStrategy.BINPACK, CpuStrategy.SPREAD, DeviceStrategy.GPUPACK)
    assert packer.place(t, TaskShape.fraction(300), cpu_spread).node == 1
    # equal gpu_left: the cpu strategy decides
    t2 = table(node(cpu=2000, devs=(dev(500),)), node(cpu=9000, devs=(dev(500),)))
    assert packer.place(t2, TaskShape.fraction(300), cpu_spread).node == 1
    assert packer.place(t2, TaskShape.fraction(300), BINPACK).node == 0


def test_gpupack_vs_gpuspread_device_choice(packer: Packer) -> None:
    t = table(node(devs=(dev(1000), dev(400), dev(700, shared=1), dev(500, shared=1), dev(200))))
    pack = Strategy(device_strategy=DeviceStrategy.GPUPACK)
    spread = Strategy(device_strategy=DeviceStrategy.GPUSPREAD)
    # device 4 (200 free) cannot take 300.
    assert packer.place(t, TaskShape.fraction(300), pack).devices == (3,)  # shared, fullest
    assert packer.place(t, TaskShape.fraction(300), spread).devices == (0,)  # emptiest
    assert packer.place(t, TaskShape.fraction(300, devices=3), pack).devices == (3, 2, 1)
    assert packer.place(t, TaskShape.fraction(300, devices=3), spread).devices == (0, 2, 3)
    assert packer.place(t, TaskShape.fraction(300, devices=4), pack).devices == (3, 2, 1, 0)


def test_gpuspread_reuse_counts_only_chosen_devices(packer: Packer) -> None:
    # gpuspread on node 0 picks the idle device (no reuse); node 1's only taker is shared.
    t = table(node(devs=(dev(1000), dev(500, shared=1))), node(devs=(dev(600, shared=1),)))
    spread = Strategy(GpuStrategy.SPREAD, CpuStrategy.BINPACK, DeviceStrategy.GPUSPREAD)
    p = packer.place(t, TaskShape.fraction(300), spread)
    assert (p.node, p.devices) == (1, (2,))
    pack = Strategy(GpuStrategy.SPREAD, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK)
    p = packer.place(t, TaskShape.fraction(300), pack)  # both reuse 1; spread: node 0 has 1200 left
    assert (p.node, p.devices) == (0, (1,))


def test_device_order_ties_lowest_index(packer: Packer) -> None:
    t = table(node(devs=(dev(600), dev(600), dev(600, shared=1), dev(600, shared=1))))
    assert packer.place(t, TaskShape.fraction(100), BINPACK).devices == (2,)
    assert packer.place(t, TaskShape.fraction(100, devices=3), SPREAD).devices == (0, 1, 2)


def test_gpu_memory_conversion_rounds_up(packer: Packer) -> None:
    # 10001 MiB of 40000 MiB = 250.025 milli -> ceil 251.
    task = TaskShape.gpu_memory(10001)
    t = table(node(devs=(dev(250, total=40000),)), node(devs=(dev(251, total=40000),)))
    p = packer.place(t, task, BINPACK)
    assert (p.node, p.devices, p.rejections) == (1, (1,), rej(GPU_SHARE=1))
    t.apply(p.node, p.devices, task)
    assert (t.dev_free_milli[1], t.dev_shared[1], t.dev_frac_holders[1]) == (0, 1, 1)
    assert packing.need_milli(task, 40000) == 251
    assert packing.need_milli(task, 10001) == 1000
    assert packing.need_milli(task, 10000) is None
    assert packing.need_milli(task, 0) is None


def test_gpu_memory_converting_to_1000_needs_idle_device(packer: Packer) -> None:
    # 39990 / 40000 -> 999.75 -> 1000 milli: only an idle device takes it.
    task = TaskShape.gpu_memory(39990)
    t = table(node(devs=(dev(999, total=40000),)), node(devs=(dev(1000, total=40000),)))
    p = packer.place(t, task, BINPACK)
    assert (p.node, p.devices, p.rejections) == (1, (1,), rej(GPU_SHARE=1))


def test_gpu_memory_per_device_need_affects_score(packer: Packer) -> None:
    # 20000 MiB is 500 milli on a 40000 MiB device, 250 on an 80000 MiB device.
    t = table(node(devs=(dev(1000, total=40000),)), node(devs=(dev(1000, total=80000),)))
    assert packer.place(t, TaskShape.gpu_memory(20000), BINPACK).node == 0  # 500 left < 750
    assert packer.place(t, TaskShape.gpu_memory(20000), SPREAD).node == 1


def test_gpu_memory_reason_only_when_size_is_the_obstacle(packer: Packer) -> None:
    task = TaskShape.gpu_memory(50000, devices=2)
    t = table(
        node(devs=(dev(1000, total=0), dev(1000, total=81920))),  # one unknown -> GPU_MEMORY
        node(devs=(dev(1000, total=40960), dev(1000, total=81920))),  # one too small -> GPU_MEMORY
        node(devs=(dev(1000, total=81920), dev(100, total=81920))),  # size ok, occupied -> GPU_SHARE
        node(devs=(dev(1000, total=81920),)),  # one device only -> GPU
        node(devs=(dev(1000, total=81920), dev(1000, total=81920))),
    )
    p = packer.place(t, task, BINPACK)
    assert (p.node, p.devices, p.rejections) == (4, (7, 8), rej(GPU=1, GPU_SHARE=1, GPU_MEMORY=2))


def test_each_rejection_reason_counted(packer: Packer) -> None:
    task = TaskShape.gpu_memory(20000, milli_cpu=1000, memory_bytes=GIB)
    t = table(
        node(elig=0, pods=0, cpu=0),  # NOT_ELIGIBLE (first failing reason only)
        node(pods=0, cpu=0),  # PODS
        node(cpu=500, mem=0),  # CPU
        node(mem=GIB - 1),  # MEMORY
        node(),  # GPU: CPU-only node
        node(devs=(dev(100, total=40000),)),  # GPU_SHARE
        node(devs=(dev(1000, total=0),)),  # GPU_MEMORY
        node(devs=(dev(1000, total=40000),)),  # fits
    )
    p = packer.place(t, task, BINPACK)
    assert (p.code, p.node, p.devices) == (ReturnCode.OK, 7, (2,))
    assert p.rejections == (1, 1, 1, 1, 1, 1, 1)
    assert p.rejected(Reason.GPU_MEMORY) == 1


def test_fraction_task_reasons(packer: Packer) -> None:
    t = table(node(devs=(dev(200),)), node(), node(devs=(dev(),)))
    p = packer.place(t, TaskShape.fraction(500, devices=2), BINPACK)
    assert (p.code, p.node, p.devices, p.rejections) == (ReturnCode.NO_FIT, -1, (), rej(GPU=3))
    p = packer.place(t, TaskShape.fraction(500), BINPACK)
    assert (p.node, p.devices, p.rejections) == (2, (1,), rej(GPU=1, GPU_SHARE=1))


def test_no_fit_counts_every_node(packer: Packer) -> None:
    t = table(node(cpu=100), node(elig=0), node(pods=0))
    p = packer.place(t, TaskShape.cpu(1000), BINPACK)
    assert p == Placement(ReturnCode.NO_FIT, -1, (), rej(CPU=1, NOT_ELIGIBLE=1, PODS=1))
    assert not p.placed
    empty = ArrayPackTable(free_milli_cpu=[], free_memory_bytes=[], free_pods=[], gpu_start=[0], dev_free_milli=[])
    assert packer.place(empty, TaskShape.whole(1), BINPACK).code == ReturnCode.NO_FIT


def test_eligible_override(packer: Packer) -> None:
    t = table(node(cpu=2000), node(cpu=4000))
    p = packer.place(t, TaskShape.cpu(1000), BINPACK, eligible=array("q", [0, 1]))
    assert (p.node, p.rejections) == (1, rej(NOT_ELIGIBLE=1))


# ----------------------------------------------------------------------------- errors


def frag(*shapes: tuple[TaskShape, int], cpu: int = CpuStrategy.BINPACK, device: int = DeviceStrategy.GPUPACK) -> Strategy:
    return Strategy(GpuStrategy.FRAGMENTATION, cpu, device, tuple(WorkloadShape(t, w) for t, w in shapes))


def test_fragmentation_avoids_stranding_a_partial_device(packer: Packer) -> None:
    # Workload: halves.  Node 1 (600 free) would keep 300, too small for a half: +300
    # stranded; node 0 keeps 700, still one half.  Binpack takes node 1 (least left).
    t = table(node(devs=(dev(1000),)), node(devs=(dev(600),)))
    assert packer.place(t, TaskShape.fraction(300), BINPACK).node == 1
    p = packer.place(t, TaskShape.fraction(300), frag((TaskShape.fraction(500), 1)))
    assert (p.code, p.node, p.devices, p.rejections) == (ReturnCode.OK, 0, (0,), rej())


def test_fragmentation_counts_gpus_stranded_by_cpu(packer: Packer) -> None:
    # Workload: 1 GPU + 4 cores.  A 4-core CPU-only task on node 0 (8 cores, 2 idle
    # GPUs) leaves room for one such task only: 1000 milli stranded.  Node 1 (12 cores)
    # still hosts two.  CPU binpack alone would take node 0.
    t = table(node(cpu=8000, devs=(dev(), dev())), node(cpu=12000, devs=(dev(), dev())))
    task = TaskShape.cpu(4000)
    assert packer.place(t, task, BINPACK).node == 0
    p = packer.place(t, task, frag((TaskShape.whole(1, milli_cpu=4000), 3)))
    assert (p.node, p.devices) == (1, ())


def test_fragmentation_device_choice(packer: Packer) -> None:
    # Workload: halves.  F before = 400 (device 2 is too small).  Taking 200 from
    # device 0 -> 400, device 1 -> 800 (it drops below a half), device 2 -> 200.
    t = table(node(devs=(dev(1000), dev(600), dev(400))))
    spread_dev = frag((TaskShape.fraction(500), 1), device=DeviceStrategy.GPUSPREAD)
    assert packer.place(t, TaskShape.fraction(200), SPREAD).devices == (0,)
    assert packer.place(t, TaskShape.fraction(200), spread_dev).devices == (2,)
    assert packer.place(t, TaskShape.fraction(200, devices=2), spread_dev).devices == (2, 0)
    # equal keys: the device strategy breaks the tie (GPUPACK: fullest first)
    t2 = table(node(devs=(dev(1000), dev(900))))
    assert packer.place(t2, TaskShape.fraction(100), frag((TaskShape.whole(2), 1))).devices == (1,)


def test_fragmentation_prefers_node_already_fragmented(packer: Packer) -> None:
    # Workload: whole GPUs.  Node 1's 300-milli device is stranded already; filling it
    # lowers F (delta -300 * 2), while node 0 would lose its only idle device.
    t = table(node(devs=(dev(1000),)), node(devs=(dev(300), dev(0))))
    p = packer.place(t, TaskShape.fraction(300), frag((TaskShape.whole(1), 2)))
    assert (p.node, p.devices) == (1, (1,))


def test_fragmentation_without_workload_is_binpack_order(packer: Packer) -> None:
    t = table(node(devs=(dev(), dev())), node(devs=(dev(), dev(500))))
    p = packer.place(t, TaskShape.whole(1), frag())
    assert (p.node, p.devices) == (1, (2,))
    t2 = table(node(cpu=2000, devs=(dev(),)), node(cpu=8000))
    assert packer.place(t2, TaskShape.cpu(1000), frag()).node == 1  # CPU-only node first


def test_fragmentation_workload_is_validated(packer: Packer) -> None:
    t = table(node(devs=(dev(),)))
    task = TaskShape.whole(1)
    bad = [
        frag(*[(TaskShape.whole(1), 1)] * (MAX_SHAPES + 1)),
        frag((TaskShape.whole(1), MAX_TOTAL_WEIGHT + 1)),
        frag((TaskShape.whole(1), MAX_TOTAL_WEIGHT), (TaskShape.fraction(500), 1)),
        frag((TaskShape.whole(1), -1)),
        frag((TaskShape(fraction_milli=500), 1)),
        Strategy(GpuStrategy.FRAGMENTATION, workload=[WorkloadShape(task)]),  # type: ignore[arg-type]
        Strategy(GpuStrategy.BINPACK, workload=(WorkloadShape(TaskShape(whole_gpus=-1)),)),  # checked always
    ]
    for strategy in bad:
        with pytest.raises(InvalidArgument):
            packer.place(t, task, strategy)
        assert packer.place_raw(t, task, strategy) == Placement.failure(ReturnCode.EINVAL)
    ok = frag(*[(TaskShape.whole(1), 1)] * MAX_SHAPES)
    assert packer.place(t, task, ok).placed


def test_workload_from_tasks() -> None:
    half, whole = TaskShape.fraction(500, milli_cpu=1000), TaskShape.whole(1)
    tasks = [half, whole, half, TaskShape.cpu(1000), TaskShape(fraction_milli=1), half, whole]
    assert workload_from_tasks(tasks) == (WorkloadShape(half, 3), WorkloadShape(whole, 2))
    assert workload_from_tasks(tasks, max_shapes=1) == (WorkloadShape(half, 3),)
    assert workload_from_tasks(tasks, coverage_pct=60) == (WorkloadShape(half, 3),)
    many = workload_from_tasks([TaskShape.fraction(1 + k % 100) for k in range(300)])
    assert len(many) == MAX_SHAPES
    assert packing.workload_problem(many) is None


def test_fragmentation_bounds_devices_per_node(packer: Packer) -> None:
    big = ArrayPackTable(free_milli_cpu=[1000], free_memory_bytes=[GIB], free_pods=[1],
                         gpu_start=[0, MAX_NODE_DEVICES + 1], dev_free_milli=[1000] * (MAX_NODE_DEVICES + 1))
    assert packer.place_raw(big, TaskShape.cpu(1), BINPACK).placed
    assert packer.place_raw(big, TaskShape.cpu(1), frag()) == Placement.failure(ReturnCode.EINVAL)
    with pytest.raises(InvalidArgument):
        packer.place(big, TaskShape.cpu(1), frag())


@pytest.mark.parametrize(
    "task",
    [
        TaskShape(whole_gpus=1, fraction_milli=500, fraction_devices=1),
        TaskShape(fraction_milli=500),
        TaskShape(fraction_milli=1000, fraction_devices=1),
        TaskShape(fraction_milli=100, gpu_memory_mib=100, fraction_devices=1),
        TaskShape(fraction_devices=1),
        TaskShape(milli_cpu=-1),
        TaskShape(whole_gpus=(1 << 20) + 1),
        TaskShape(gpu_memory_mib=(1 << 40) + 1, fraction_devices=1),
        TaskShape(memory_bytes=1 << 63),
    ],
)
def test_invalid_task(packer: Packer, task: TaskShape) -> None:
    t = table(node(devs=(dev(),)))
    with pytest.raises(InvalidArgument):
        packer.place(t, task, BINPACK)
    assert packer.place_raw(t, task, BINPACK) == Placement.failure(ReturnCode.EINVAL)


@pytest.mark.parametrize("strategy", [Strategy(gpu_strategy=3), Strategy(cpu_strategy=2), Strategy(device_strategy=-1)])
def test_invalid_strategy(packer: Packer, strategy: Strategy) -> None:
    t = table(node(devs=(dev(),)))
    with pytest.raises(InvalidArgument):
        packer.place(t, TaskShape.whole(1), strategy)
    assert packer.place_raw(t, TaskShape.whole(1), strategy).code == ReturnCode.EINVAL


@pytest.mark.parametrize(
    ("array_name", "index", "value"),
    [
        ("dev_free_milli", 0, 1001),
        ("dev_free_milli", 1, -1),
        ("dev_shared", 0, 2),
        ("dev_total_memory_mib", 1, -5),
        ("free_pods", 1, -1),
        ("eligible", 0, 2),
        ("gpu_start", 1, 3),
    ],
)
def test_invalid_table_contents(packer: Packer, array_name: str, index: int, value: int) -> None:
    # The native packer validates the contents in C; the message comes from Python.
    t = table(node(devs=(dev(),)), node(devs=(dev(),)))
    getattr(t, array_name)[index] = value
    with pytest.raises(InvalidArgument):
        packer.place(t, TaskShape.cpu(1), BINPACK)


def test_eligible_override_wrong_length(packer: Packer) -> None:
    t = table(node(), node())
    assert packer.place_raw(t, TaskShape.cpu(1), BINPACK, eligible=array("q", [1])).code == ReturnCode.EINVAL


def test_native_rejects_non_int64_buffers() -> None:
    t = table(node(), node())
    with pytest.raises(TypeError):
        load_packer("native").place(t, TaskShape.cpu(1), BINPACK, eligible=array("i", [1, 1]))


def test_table_constructor_validates() -> None:
    with pytest.raises(InvalidArgument):
        ArrayPackTable(free_milli_cpu=[1], free_memory_bytes=[1], free_pods=[1], gpu_start=[0, 2], dev_free_milli=[1000])
    with pytest.raises(InvalidArgument):
        table(node(devs=(DeviceRow(free_milli=500, shared=1, frac_holders=0),)))


# ----------------------------------------------------------------------------- apply / unapply


def test_apply_unapply_known_answer() -> None:
    t = table(node(cpu=4000, mem=8 * GIB, pods=3, devs=(dev(1000), dev(600, shared=1))))
    before = t.snapshot()
    frac = TaskShape.fraction(300, milli_cpu=1000, memory_bytes=GIB)
    t.apply(0, (1,), frac)
    assert (t.free_milli_cpu[0], t.free_memory_bytes[0], t.free_pods[0]) == (3000, 7 * GIB, 2)
    assert (t.dev_free_milli[1], t.dev_shared[1], t.dev_frac_holders[1]) == (300, 1, 2)
    t.apply(0, (0,), frac)
    assert (t.dev_free_milli[0], t.dev_shared[0], t.dev_frac_holders[0]) == (700, 1, 1)
    t.apply(0, (0,), frac, sign=-1)
    assert (t.dev_free_milli[0], t.dev_shared[0], t.dev_frac_holders[0]) == (1000, 0, 0)
    t.apply(0, (1,), frac, sign=-1)
    assert t.snapshot() == before
    whole = TaskShape.whole(1)
    t.apply(0, (0,), whole)
    assert (t.dev_free_milli[0], t.dev_shared[0]) == (0, 0)
    with pytest.raises(InvalidArgument):
        t.apply(0, (0,), whole)  # not idle any more
    snap = t.snapshot()
    with pytest.raises(InvalidArgument):
        t.apply(0, (1,), TaskShape.fraction(700))  # 300 free only: table unchanged
    assert t.snapshot() == snap
    with pytest.raises(InvalidArgument):
        t.apply(0, (0, 0), TaskShape.fraction(100, devices=2))
    with pytest.raises(InvalidArgument):
        t.apply(0, (0,), whole, sign=2)


def _sized_clusters(max_nodes: int, max_devices: int, repeats: int = 1) -> st.SearchStrategy[ArrayPackTable]:
    """Tables of up to `max_nodes` distinct rows, each repeated 1..`repeats` times (ties)."""
    mem_sizes = st.sampled_from([0, 16384, 40000, 40960, 81920])
    device = st.builds(
        lambda free, total, shared: DeviceRow(free_milli=free, total_memory_mib=total, shared=shared),
        st.one_of(st.sampled_from([0, 1, 100, 250, 251, 300, 500, 999, 1000]), st.integers(0, 1000)),
        mem_sizes,
        st.integers(0, 1),
    )
    row = st.builds(
        NodeRow,
        free_milli_cpu=st.sampled_from([0, 500, 1000, 2000, 4000, 8000, 8000, 16000]),
        free_memory_bytes=st.sampled_from([0, GIB, 4 * GIB, 16 * GIB, 16 * GIB]),
        free_pods=st.sampled_from([0, 1, 2, 110, 110]),
        devices=st.lists(device, max_size=max_devices).map(tuple),
        eligible=st.sampled_from([0, 1, 1, 1, 1, 1]),
        alloc_milli_cpu=st.sampled_from([None, 16000]),
    )
    rows = st.lists(st.tuples(row, st.integers(1, repeats)), max_size=max_nodes)
    return rows.map(lambda drawn: ArrayPackTable.from_rows([r for r, times in drawn for _ in range(times)]))


_cpu = st.sampled_from([0, 500, 1000, 2000])
_mem = st.sampled_from([0, GIB, 2 * GIB])
tasks = st.one_of(
    st.builds(TaskShape.cpu, _cpu, _mem),
    st.builds(TaskShape.whole, st.integers(1, 4), _cpu, _mem),
    st.builds(
        TaskShape.fraction,
        st.one_of(st.sampled_from([1, 100, 250, 300, 500, 999]), st.integers(1, 999)),
        st.integers(1, 4),
        _cpu,
        _mem,
    ),
    st.builds(
        TaskShape.gpu_memory,
        st.one_of(st.sampled_from([1, 10001, 16384, 20000, 39990, 40000, 40960, 50000]), st.integers(1, 90000)),
        st.integers(1, 3),
        _cpu,
        _mem,
    ),
)
_invalid_tasks = st.builds(  # mostly invalid combinations and out-of-range values
    TaskShape,
    st.integers(-2, 3000),
    st.sampled_from([0, GIB, -1]),
    st.integers(-1, 3),
    st.integers(-1, 1001),
    st.integers(-1, 3),
    st.sampled_from([0, 0, 20000, -1, (1 << 40) + 1]),
)
_workloads = st.lists(st.builds(WorkloadShape, tasks, st.integers(0, 1000)), max_size=4).map(tuple)
strategies = st.builds(Strategy, st.integers(0, 2), st.integers(0, 1), st.integers(0, 1), _workloads)
_odd_workloads = st.lists(
    st.builds(WorkloadShape, st.one_of(tasks, _invalid_tasks),
              st.sampled_from([-1, 0, 1, MAX_TOTAL_WEIGHT, MAX_TOTAL_WEIGHT + 1])),
    max_size=3,
).map(tuple)
_odd_strategies = st.builds(Strategy, st.integers(-1, 3), st.integers(-1, 2), st.integers(-1, 2),
                            st.one_of(_workloads, _odd_workloads))
_one_in_ten = st.sampled_from([False] * 9 + [True])
any_tasks = _one_in_ten.flatmap(lambda odd: _invalid_tasks if odd else tasks)
any_strategies = _one_in_ten.flatmap(lambda odd: _odd_strategies if odd else strategies)


@st.composite
def maybe_corrupted(draw: st.DrawFn, repeats: int = 1) -> ArrayPackTable:
    t = draw(_sized_clusters(6, 6, repeats))
    if draw(_one_in_ten):
        names = ["free_milli_cpu", "free_pods", "eligible", "dev_free_milli", "dev_total_memory_mib", "dev_shared"]
        name = draw(st.sampled_from(names))
        arr = getattr(t, name)
        if len(arr):
            arr[draw(st.integers(0, len(arr) - 1))] = draw(st.sampled_from([-1, 2, 1001, (1 << 40) + 1]))
    return t


_REFERENCE = ReferencePacker()


@functools.cache
def _native() -> NativePacker:
    return NativePacker()  # created lazily: without the extension only the native tests fail


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=maybe_corrupted(), task=any_tasks, strategy=any_strategies)
def test_native_agrees_with_reference(t: ArrayPackTable, task: TaskShape, strategy: Strategy) -> None:
    expected = _REFERENCE.place_raw(t, task, strategy)
    assert _native().place_raw(t, task, strategy) == expected
    if expected.placed:
        assert len(expected.devices) == task.device_count
        assert sum(expected.rejections) < len(t.free_milli_cpu)
    elif expected.code == ReturnCode.NO_FIT:
        assert sum(expected.rejections) == len(t.free_milli_cpu)


def test_ranking_lists_the_best_nodes_ties_by_index(packer: Packer) -> None:
    """Nodes of one score rank by index; a better one goes first; the ineligible and the full
    are not listed but counted; the cap cuts the list (`kai_pack_rank`)."""
    same = node(cpu=4000, devs=(dev(), dev(free=0)))
    t = table(same, same, node(cpu=4000, devs=(dev(free=0), dev(free=0))), same,
              node(cpu=4000, devs=(dev(), dev(free=0)), elig=0), node(cpu=2000, devs=(dev(), dev(free=0))), same)
    task = TaskShape.whole(1, 1000, 0)
    placement, ranked = packer.rank_raw(t, task, BINPACK, None, 4)
    assert (placement.node, ranked) == (5, (5, 0, 1, 3))  # node 5: least CPU left, then by index
    assert placement.rejected(Reason.NOT_ELIGIBLE) == 1 and placement.rejected(Reason.GPU) == 1
    assert packer.rank_raw(t, task, BINPACK, None, MAX_RANKED)[1] == (5, 0, 1, 3, 6)
    assert packer.rank_raw(t, task, SPREAD, None, 2)[1] == (0, 1)  # spread: most CPU left first
    assert packer.rank_raw(t, TaskShape.whole(2, 0, 0), BINPACK, None, 4) == \
        (packer.place_raw(t, TaskShape.whole(2, 0, 0), BINPACK), ())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=maybe_corrupted(repeats=3), task=any_tasks, strategy=any_strategies,
       cap=st.sampled_from([-1, 0, 1, 2, 3, 7, MAX_RANKED, MAX_RANKED + 1, 1 << 64]),
       mask_seed=st.integers(0, 2**6 - 1))
def test_native_ranking_agrees_with_reference(t: ArrayPackTable, task: TaskShape, strategy: Strategy, cap: int,
                                              mask_seed: int) -> None:
    """`rank_raw` (``kai_pack_rank``): both engines give the same answer, which is `place_raw`'s,
    and the same ranked nodes: each passes the filter, they go best first (score descending,
    ties by index), and every other node that passes ranks after the last of them."""
    mask = array("q", [(mask_seed >> (i % 6)) & 1 for i in range(len(t.free_milli_cpu))])
    expected = _REFERENCE.rank_raw(t, task, strategy, mask, cap)
    assert _native().rank_raw(t, task, strategy, mask, cap) == expected
    placement, ranked = expected
    if not 1 <= cap <= MAX_RANKED:
        assert expected == (Placement.failure(ReturnCode.EINVAL), ())
        return
    assert placement == _REFERENCE.place_raw(t, task, strategy, mask)
    if not placement.placed:
        assert ranked == ()
        return
    passed = [i for i in range(len(t.free_milli_cpu)) if filter_node(t, mask, i, task) is None]
    assert ranked[0] == placement.node and len(ranked) == min(cap, len(passed))
    order = {i: (tuple(-k for k in score_node(t, i, task, strategy)), i) for i in passed}
    assert list(ranked) == sorted(ranked, key=order.__getitem__)
    assert all(order[i] > order[ranked[-1]] for i in passed if i not in ranked)


def _place_sequence(t: ArrayPackTable, seq: list[tuple[TaskShape, Strategy]]) -> Iterator[tuple[int, tuple[int, ...], TaskShape]]:
    for task, strategy in seq:
        expected = _REFERENCE.place(t, task, strategy)
        assert _native().place(t, task, strategy) == expected
        if expected.placed:
            t.apply(expected.node, expected.devices, task)
            assert t.problem() is None
            yield expected.node, expected.devices, task


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=_sized_clusters(5, 4), seq=st.lists(st.tuples(tasks, strategies), max_size=8))
def test_incremental_cycle_agrees_and_rolls_back_exactly(t: ArrayPackTable, seq: list[tuple[TaskShape, Strategy]]) -> None:
    before = t.snapshot()
    applied = list(_place_sequence(t, seq))
    for node_index, devices, task in reversed(applied):
        t.apply(node_index, devices, task, sign=-1)
    assert t.snapshot() == before


@settings(max_examples=200, deadline=None)
@given(t=_sized_clusters(5, 4), task=tasks, strategy=strategies)
def test_apply_then_unapply_restores_table(t: ArrayPackTable, task: TaskShape, strategy: Strategy) -> None:
    p = _native().place(t, task, strategy)
    if not p.placed:
        return
    before = t.snapshot()
    t.apply(p.node, p.devices, task)
    assert t.snapshot() != before  # at least free_pods changed
    t.apply(p.node, p.devices, task, sign=-1)
    assert t.snapshot() == before


def _outcome(fn: object, *args: object) -> object:
    """A placement, or the type and message of the error it raised."""
    try:
        return fn(*args)  # type: ignore[operator]
    except (PackingError, TypeError) as exc:
        return (type(exc), str(exc))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=maybe_corrupted(), seq=st.lists(st.tuples(any_tasks, st.booleans()), min_size=1, max_size=6),
       strategy=strategies, mask_seed=st.integers(0, 2**6 - 1))
def test_bound_place_answers_as_place_does(t: ArrayPackTable, seq: list[tuple[TaskShape, bool]],
                                           strategy: Strategy, mask_seed: int) -> None:
    """`bind_place` (checks done once per table) answers, and fails, exactly as `place`, on
    both engines, while the table changes under it between calls."""
    mask = array("q", [(mask_seed >> (i % 6)) & 1 for i in range(len(t.free_milli_cpu))])
    for engine in (_native(), _REFERENCE):
        table = t.copy()
        bound = _outcome(packing.bind_place, engine, table, strategy)
        for task, masked in seq:
            eligible = mask if masked else None
            expected = _outcome(engine.place, table, task, strategy, eligible)
            got = _outcome(bound, task, eligible) if callable(bound) else bound
            if callable(bound):
                assert got == expected
            else:  # bind refused the table itself: place must refuse it too
                assert isinstance(expected, tuple)
            if isinstance(expected, Placement) and expected.placed:
                table.apply_placed(expected.node, expected.devices, task, 1)


# ----------------------------------------------------------------------------- int64 bounds

_INT64 = (-(1 << 63), -1, 0, 1 << 62, (1 << 62) + 1, (1 << 63) - 1, 1 << 63, 1 << 64)
_TASK_BOUNDS = {"milli_cpu": 1 << 62, "memory_bytes": 1 << 62, "whole_gpus": 1 << 20,
                "fraction_milli": 999, "fraction_devices": 1 << 20, "gpu_memory_mib": 1 << 40}


def _place_or_invalid(packer: Packer, t: ArrayPackTable, task: TaskShape) -> tuple[str, str]:
    try:
        return "placement", repr(packer.place(t, task, BINPACK))
    except InvalidArgument as exc:
        return "invalid", str(exc)


@pytest.mark.parametrize("field", sorted(_TASK_BOUNDS))
@pytest.mark.parametrize("value", _INT64)
def test_task_fields_at_the_int64_bounds_are_rejected_or_placed_alike(field: str, value: int) -> None:
    t = table(node(cpu=(1 << 63) - 1, mem=(1 << 63) - 1, pods=(1 << 63) - 1, devs=(dev(), dev(shared=0))))
    task = TaskShape(**{field: value})
    native = _place_or_invalid(load_packer("native"), t, task)
    reference = _place_or_invalid(load_packer("reference"), t, task)
    assert native == reference
    if not 0 <= value <= _TASK_BOUNDS[field]:
        assert native == ("invalid", f"task.{field}={value} is outside 0..{_TASK_BOUNDS[field]}")
        assert load_packer("native").place_raw(t, task, BINPACK) == Placement.failure(ReturnCode.EINVAL)
        assert load_packer("reference").place_raw(t, task, BINPACK) == Placement.failure(ReturnCode.EINVAL)


def test_free_quantities_at_int64_max_do_not_overflow(packer: Packer) -> None:
    free = (1 << 63) - 1
    t = table(node(cpu=free, mem=free, pods=free), node(cpu=free - 1, mem=free - 1, pods=1))
    task = TaskShape(milli_cpu=1 << 62, memory_bytes=1 << 62)
    assert packer.place(t, task, BINPACK).node == 1  # binpack: the node left fuller
    assert packer.place(t, task, SPREAD).node == 0


@pytest.mark.parametrize("array_name", ["free_milli_cpu", "free_memory_bytes", "free_pods"])
def test_free_quantities_at_int64_min_are_rejected_alike(array_name: str) -> None:
    answers = []
    for kind in ("native", "reference"):
        t = table(node(devs=(dev(),)))
        getattr(t, array_name)[0] = -(1 << 63)
        answers.append(_place_or_invalid(load_packer(kind), t, TaskShape.cpu(1)))
    assert answers[0] == answers[1] == ("invalid", "node 0 has a negative free quantity")
