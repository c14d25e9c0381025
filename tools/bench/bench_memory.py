"""Memory over many pod lifecycles: does the scheduler's state stay flat? (Reliability II §4)

    python tools/bench/bench_memory.py [--pods 1000000] [--every 100000]

The lifecycles of `bench_fold.py`'s synthetic cluster (pods arrive 400 a cycle, a real cycle
with the default actions places them, the binder's outcome and Running are folded, each pod
finishes a cycle later), folded in memory: what is measured is the state and the cycle, not a
log file. A pod observed Succeeded or Failed leaves the state (the reducer's rule, deleted from
the cluster or not), and an implicit job with it.

Prints, every `--every` pods: pods arrived, the process's RSS (/proc/self/statm), the pods and
jobs the state holds, and the RSS growth per 1,000 pods since the first line (the warm-up).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fold import lifecycles  # noqa: E402  (puts the repository on sys.path)

from kai_es.events import Envelope, Record  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from kai_es.state.reducer import apply  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=100_000)
    args = ap.parse_args()
    state = ClusterState()
    position = 0

    def emit(envs: list[Envelope]) -> None:
        nonlocal position
        for env in envs:
            apply(state, Record(position, env))
            position += 1

    next_print = args.every
    base: tuple[int, float] | None = None
    t0 = time.perf_counter()
    print(f"{'pods':>10} {'RSS MiB':>9} {'state pods':>10} {'state jobs':>10} {'KiB/1000 pods':>14} {'s':>6}")
    for arrived in lifecycles(state, emit, SchedulerConfig()):
        if arrived >= next_print:
            next_print += args.every
            gc.collect()
            rss = rss_mib()
            slope = "" if base is None else f"{(rss - base[1]) * 1024 / ((arrived - base[0]) / 1000):.1f}"
            if base is None:
                base = (arrived, rss)
            print(f"{arrived:>10,} {rss:>9.1f} {len(state.pods):>10,} {len(state.jobs):>10,} {slope:>14} "
                  f"{time.perf_counter() - t0:>6.0f}", flush=True)
        if arrived >= args.pods:
            break


if __name__ == "__main__":
    main()
