"""Scheduling shards against one scheduler: 4 shards x 5,000 nodes against one shard of 20,000
nodes (issue #21 §2), the same pending pods in total.

Each shard's scheduler is its own process with its own state (its nodes, queues and pods only:
what its log holds), so the shards run one allocate cycle each, in parallel processes, started
together after every state is built; the single scheduler runs one cycle over everything.
Prints placements per second of wall time for both and their ratio, and placements per
CPU-second (what the shards give on a machine with a core per shard: this one has
`os.cpu_count()`). States are built as `bench_cycle.build` builds them (8-GPU nodes, 55 queues,
one-GPU pods), native packer, the current policy.

    python3 tools/bench/bench_shards.py                       # 20,000 nodes, 20,000 pods, 4 shards
    python3 tools/bench/bench_shards.py --nodes 4000 --pods 4000   # quick
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cycle import START, build  # noqa: E402

from kai_es.events import Record  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import make_envelope  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig, config_digest  # noqa: E402
from kai_es.scheduling.cycle import run_cycle  # noqa: E402
from kai_es.scheduling.packing import load_packer  # noqa: E402
from kai_es.state.reducer import apply  # noqa: E402


def shard_cycle(nodes: int, pods: int, barrier: Any, out: Any) -> None:
    """Build a shard's state, wait for the others, run one allocate cycle; report (placements,
    wall seconds, CPU seconds)."""
    state, pos = build(nodes, pods)
    cfg = SchedulerConfig(state_digest_every=0, actions=["allocate"])
    started = make_envelope(p.CycleStarted(cycle=1, config_digest=config_digest(cfg)), event_id="c1",
                            source="bench", subject="cycle/1", logicaltime=START + pos)
    apply(state, Record(pos, started))
    packer = load_packer("native")
    if barrier is not None:
        barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    decisions = run_cycle(state, Record(pos, started), cfg, packer)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out.put((sum(1 for d in decisions if isinstance(d.data, p.BindingDecided)), wall, cpu))


def run(shards: int, nodes: int, pods: int) -> tuple[int, float, float]:
    """(placements, wall seconds from the common start to the last shard's end, CPU seconds)."""
    ctx = mp.get_context("fork")
    out: Any = ctx.Queue()
    barrier = ctx.Barrier(shards) if shards > 1 else None
    procs = [ctx.Process(target=shard_cycle, args=(nodes // shards, pods // shards, barrier, out))
             for _ in range(shards)]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"a shard's process exited {proc.exitcode}")
    return sum(r[0] for r in results), max(r[1] for r in results), sum(r[2] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--pods", type=int, default=20_000)
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    print(f"{args.nodes} nodes x 8 GPUs, {args.pods} pending one-GPU pods; {os.cpu_count()} CPUs here")
    one = run(1, args.nodes, args.pods)
    print(f"one scheduler, {args.nodes} nodes: {one[0]} placements in {one[1]:.2f} s wall "
          f"-> {one[0] / one[1]:,.0f} placements/s ({one[0] / one[2]:,.0f} per CPU-second)")
    many = run(args.shards, args.nodes, args.pods)
    print(f"{args.shards} shards x {args.nodes // args.shards} nodes, in parallel: {many[0]} placements, "
          f"the last done after {many[1]:.2f} s -> {many[0] / many[1]:,.0f} placements/s "
          f"({many[0] / many[2]:,.0f} per CPU-second)")
    print(f"ratio shards / one, wall: {(many[0] / many[1]) / (one[0] / one[1]):.2f}x; per CPU-second: "
          f"{(many[0] / many[2]) / (one[0] / one[2]):.2f}x (with a core per shard, the wall ratio "
          f"approaches shards x the per-CPU ratio)")
    if many[0] != one[0]:
        raise SystemExit(f"the shards placed {many[0]} pods, the single scheduler {one[0]}: not the same work")


if __name__ == "__main__":
    main()
