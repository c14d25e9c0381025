"""`kai-es whatif` on the 1,000,000-event benchmark log (tools/bench/bench_fold.py makes it in
out/bench/ if it is missing): wall time of a what-if with the recorded config, and of one with a
changed config, process start included.

    python tools/bench/bench_whatif.py [--events 1000000]

Prints the wall and CPU times (this process's children: the what-if and its worker) and the
load average; target <= 30 s and <= 1 GB each (issue #21 §3). Asserts nothing. The benchmark log is written by a generator,
not by `kai-es simulate` (binds land 1 s after their cycle, pods run one cycle), so even the
recorded config's counterfactual differs from it in timing: "identical decisions" is expected
to be False here (tests/test_whatif.py proves reproduction on simulated logs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


#: `kai-es whatif` on the 1,000,000-event log with a change (issue #21 §3)
TARGET_S = 30.0

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    log = ROOT / "out" / "bench" / f"synthetic-steady-{args.events}.events.jsonl"
    if not log.exists():
        sys.path.insert(0, str(ROOT / "tools" / "bench"))
        from bench_fold import generate  # the same deterministic log bench_fold.py measures

        log.parent.mkdir(parents=True, exist_ok=True)
        generate(log, args.events)
    out = ROOT / "out" / "bench"
    for tag, changes in (("recorded config", []),
                         ("spread placement, q0 quota 64", ["--set", "scheduler.placementStrategy.gpu=spread",
                                                           "--set", "queue.q0.gpu.quota=64"])):
        t0 = time.perf_counter()
        cpu0 = os.times()
        run = subprocess.run([sys.executable, "-m", "kai_es", "whatif", str(log), "--log",
                              str(out / "whatif.events.jsonl"), "--report", str(out / "whatif-report"),
                              "--force", "--output", "json", *changes], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        cpu1 = os.times()
        cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
        if run.returncode != 0:
            print(f"{tag}: failed ({run.returncode}): {run.stderr.strip()}")
            continue
        doc = json.loads(run.stdout)
        rec, cf = doc["runs"]["recorded"], doc["runs"]["counterfactual"]
        print(f"whatif ({tag}) on {rec['records']:,} recorded events -> {cf['records']:,} counterfactual events: "
              f"{dt:.1f}s wall, {cpu:.1f}s CPU, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
              f"   target <= {TARGET_S:g}s ({dt / TARGET_S:.2f}x it) and <= 1 GB (issue #21 §3)")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
        print(f"  largest child's max RSS so far: {peak:.2f} GiB   target <= 1 GB ({peak * 2**30 / 1e9:.2f}x it)")
        print(f"  identical decisions: {doc['identicalDecisions']}; GPU utilisation "
              f"{rec['gpuUtilizationPermille'] / 10:.1f}% -> {cf['gpuUtilizationPermille'] / 10:.1f}%; "
              f"cycles {rec['cycles']} -> {cf['cycles']}")


if __name__ == "__main__":
    main()
