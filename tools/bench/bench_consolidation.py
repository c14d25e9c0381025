"""Consolidation at scale, one full cycle with every action of the default policy on (kai-es/v5, as v4:
allocate, consolidation, reclaim, preempt, stalegangeviction):

- fragmented: 1,000 nodes x 8 GPUs, each running 6 single-GPU preemptible jobs (2,000 GPUs free,
  two on every node), and 200 pending 4-GPU jobs of the same queue
  and priority: nothing fits, no queue is owed anything and no priority is higher, so only
  moves can help. Each placed job needs two pods moved; the cycle moves at most
  `maxConsolidationPreemptees` jobs (default 16, so 8 jobs are placed; `--budget -1`: no limit).
- full: the same cluster with 8 jobs on every node (nothing free): consolidation must give up
  at once (moves keep the free capacity as it is), so the cycle costs what it did without it.
- hopeless: the fragmented cluster and 200 pending 16-GPU jobs (larger than any node): every
  search must end at once, whatever the cluster runs.

    python tools/bench/bench_consolidation.py [--shape fragmented|full|hopeless|all] [--budget N]

Prints the cycle's wall time (untraced), its peak memory (tracemalloc, a second run on a fresh
state) and what it decided.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kai_es.events import payloads as p  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from bench_cycle import START, Folder, timed_run  # noqa: E402  (this directory is on the path)


def build(nodes: int, per_node: int, pending: int, gpus: int = 4) -> tuple[ClusterState, int]:
    folder = Folder()
    add = folder.add
    for i in range(nodes):
        add(p.NodeObserved(name=f"node-{i:05d}", milli_cpu=256_000, memory_bytes=2**41, gpus=8))
    add(p.QueueObserved(name="team", gpu=p.QueueResource(quota=-1, over_quota_weight=1)))
    k = 0
    for i in range(nodes):
        for _ in range(per_node):
            add(p.PodObserved(namespace="b", name=f"run-{k}", uid=f"r{k}", queue="team", podgroup=f"rg-{k}",
                              implicit_podgroup=True, priority_class="train", phase="Running",
                              node_name=f"node-{i:05d}", gpu=p.GpuRequest(whole=1),
                              requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30), created_ns=START + k))
            k += 1
    for j in range(pending):
        add(p.PodObserved(namespace="a", name=f"job-{j}", uid=f"a{j}", queue="team", podgroup=f"job-{j}",
                          implicit_podgroup=True, priority_class="train", gpu=p.GpuRequest(whole=gpus),
                          requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30), created_ns=START + k + j))
    return folder.state, folder.pos


def run(label: str, build: Callable[[], tuple[ClusterState, int]], budget: int) -> None:
    cfg = SchedulerConfig(state_digest_every=0, max_consolidation_preemptees=budget)
    dt, peak, kinds = timed_run(build, cfg)
    print(f"{label}: one cycle ({', '.join(cfg.action_list)}; budget {budget}) in {dt:.2f}s, "
          f"peak {peak / 2**20:.0f} MiB; decisions {kinds}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=["fragmented", "full", "hopeless", "all"], default="all")
    ap.add_argument("--budget", type=int, default=16, help="maxConsolidationPreemptees (-1: no limit)")
    args = ap.parse_args()
    if args.shape in ("fragmented", "all"):
        run("fragmented: 200 pending 4-GPU jobs, 1,000 nodes with 2 free GPUs each",
            lambda: build(nodes=1000, per_node=6, pending=200), args.budget)
    if args.shape in ("full", "all"):
        run("full: 200 pending 4-GPU jobs, 1,000 full nodes",
            lambda: build(nodes=1000, per_node=8, pending=200), args.budget)
    if args.shape in ("hopeless", "all"):
        run("hopeless: 200 pending 16-GPU jobs, 1,000 8-GPU nodes",
            lambda: build(nodes=1000, per_node=6, pending=200, gpus=16), args.budget)


if __name__ == "__main__":
    main()
