"""Benchmark the GPU-placement hot path: native (cffi/C) vs the pure-Python reference.

5,000 nodes x 8 GPUs (seeded random partial occupancy, some shared devices, a few
devices with unknown memory), a range of task shapes and strategies.  Prints the
per-call time of each packer and the ratio (target: native >= 20x faster) for the
binpack, spread and fragmentation (16-shape workload) strategies.  It also
prints how many answers differed (should be 0).  No assertions.

    python3 tools/bench/bench_packer.py [--nodes 5000] [--gpus 8] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from kai_es.scheduling.packing import (
    ArrayPackTable,
    CpuStrategy,
    DeviceRow,
    DeviceStrategy,
    GpuStrategy,
    NodeRow,
    Placement,
    Strategy,
    TaskShape,
    WorkloadShape,
    load_packer,
)

GIB = 1 << 30


def build_cluster(nodes: int, gpus: int, seed: int) -> ArrayPackTable:
    rng = random.Random(seed)
    rows = []
    for _ in range(nodes):
        cpu_only = rng.random() < 0.05
        total = rng.choice([40960, 81920, 81920, 0]) if rng.random() < 0.1 else rng.choice([40960, 81920])
        devices = []
        for _ in range(0 if cpu_only else gpus):
            r = rng.random()
            if r < 0.35:
                devices.append(DeviceRow(free_milli=1000, total_memory_mib=total))
            elif r < 0.65:
                devices.append(DeviceRow(free_milli=0, total_memory_mib=total))
            else:
                devices.append(DeviceRow(free_milli=rng.randrange(0, 1000, 50), total_memory_mib=total, shared=1))
        alloc = rng.choice([64000, 96000, 128000])
        rows.append(
            NodeRow(
                free_milli_cpu=rng.randrange(0, alloc, 250),
                free_memory_bytes=rng.randrange(0, 512) * GIB,
                free_pods=rng.choice([0, 5, 20, 110]),
                devices=tuple(devices),
                eligible=1 if rng.random() < 0.9 else 0,
                alloc_milli_cpu=alloc,
            )
        )
    return ArrayPackTable.from_rows(rows)


TASKS = [
    TaskShape.cpu(2000, 4 * GIB),
    TaskShape.whole(1, 4000, 16 * GIB),
    TaskShape.whole(2, 8000, 32 * GIB),
    TaskShape.whole(4, 16000, 64 * GIB),
    TaskShape.whole(8, 32000, 128 * GIB),
    TaskShape.fraction(250, 1, 1000, GIB),
    TaskShape.fraction(500, 2, 2000, 2 * GIB),
    TaskShape.fraction(100, 4, 500, GIB),
    TaskShape.gpu_memory(10000, 1, 1000, GIB),
    TaskShape.gpu_memory(40000, 2, 4000, 8 * GIB),
    TaskShape.gpu_memory(81920, 1, 4000, 8 * GIB),
]
# A workload table in the spirit of the openb trace: 16 shapes (the fragmentation
# strategy's cost grows with the number of shapes).
WORKLOAD = tuple(
    WorkloadShape(task, weight)
    for task, weight in [
        (TaskShape.whole(1, 11300), 874), (TaskShape.whole(1, 3152), 470), (TaskShape.whole(1, 12000), 326),
        (TaskShape.whole(1, 18708), 255), (TaskShape.whole(2, 16000), 120), (TaskShape.whole(4, 32000), 60),
        (TaskShape.whole(8, 64000), 40), (TaskShape.fraction(810, 1, 3152), 1047),
        (TaskShape.fraction(470, 1, 11908), 388), (TaskShape.fraction(470, 1, 8000), 360),
        (TaskShape.fraction(650, 1, 11908), 237), (TaskShape.fraction(320, 1, 4000), 232),
        (TaskShape.fraction(230, 1, 4000), 122), (TaskShape.fraction(460, 1, 6000), 120),
        (TaskShape.fraction(590, 1, 3152), 75), (TaskShape.gpu_memory(10000, 1, 4000), 50),
    ]
)
STRATEGIES = [
    Strategy(GpuStrategy.BINPACK, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK),
    Strategy(GpuStrategy.SPREAD, CpuStrategy.SPREAD, DeviceStrategy.GPUSPREAD),
    Strategy(GpuStrategy.FRAGMENTATION, CpuStrategy.BINPACK, DeviceStrategy.GPUPACK, WORKLOAD),
]
STRATEGY_NAMES = {GpuStrategy.BINPACK: "binpack", GpuStrategy.SPREAD: "spread", GpuStrategy.FRAGMENTATION: "frag"}


def per_call(fn: Callable[[], Placement], min_seconds: float) -> float:
    fn()  # warm-up
    calls = 0
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--native-seconds", type=float, default=0.2, help="timing budget per case, native")
    parser.add_argument("--reference-seconds", type=float, default=0.3, help="timing budget per case, reference")
    args = parser.parse_args()

    table = build_cluster(args.nodes, args.gpus, args.seed)
    native = load_packer("native")
    reference = load_packer("reference")
    print(f"cluster: {table.n_nodes} nodes, {table.n_devices} devices (seed {args.seed})")
    print(f"{'task':<58} {'strategy':<9} {'placed':>6} {'native us':>10} {'ref us':>10} {'ratio':>7}")
    mismatches = 0
    total_native = total_ref = 0.0
    for task in TASKS:
        for strategy in STRATEGIES:
            expected = reference.place(table, task, strategy)
            got = native.place(table, task, strategy)
            mismatches += got != expected

            def run_native(task: TaskShape = task, strategy: Strategy = strategy) -> Placement:
                return native.place(table, task, strategy)

            def run_reference(task: TaskShape = task, strategy: Strategy = strategy) -> Placement:
                return reference.place(table, task, strategy)

            t_native = per_call(run_native, args.native_seconds)
            t_ref = per_call(run_reference, args.reference_seconds)
            total_native += t_native
            total_ref += t_ref
            label = (
                f"cpu={task.milli_cpu} whole={task.whole_gpus} frac={task.fraction_milli}"
                f"x{task.fraction_devices} gmem={task.gpu_memory_mib}"
            )
            strat = STRATEGY_NAMES[GpuStrategy(strategy.gpu_strategy)]
            placed = f"n{got.node}" if got.placed else "-"
            print(
                f"{label:<58} {strat:<9} {placed:>6} {t_native * 1e6:>10.1f} {t_ref * 1e6:>10.1f}"
                f" {t_ref / t_native:>6.0f}x"
            )
    cases = len(TASKS) * len(STRATEGIES)
    print(
        f"mean per call: native {total_native / cases * 1e6:.1f} us, reference {total_ref / cases * 1e6:.1f} us, "
        f"ratio {total_ref / total_native:.0f}x (target >= 20x); mismatches: {mismatches}"
    )


if __name__ == "__main__":
    main()
