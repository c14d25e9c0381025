"""Reclaim at scale (issue 11's shapes), one full cycle with every action of the policy on (the
default config's actions: under kai-es/v5 (as v4) allocate, consolidation, reclaim, preempt and
stalegangeviction):

- big: one pending job of 500 pods x 8 GPUs (queue deserves 0... here a quota-less queue whose
  fair share the division gives it) against 1,000 full nodes x 8 GPUs of single-GPU jobs of
  another queue. KAI's own benchmark takes 76 s and 7.9 GiB; the target here is < 5 s, < 1 GiB.
- many: 8,000 pending single-GPU jobs against 8,000 running ones on 1,000 nodes; target < 5 s.

    python tools/bench/bench_reclaim.py [--shape big|many|both] [--policy VERSION]

Prints the cycle's wall time (untraced), its peak memory of Python objects (tracemalloc, a second
run on a fresh state), the process's peak RSS (everything, C tables included) and what it decided.
"""

from __future__ import annotations

import argparse
import resource
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kai_es.events import payloads as p  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from bench_cycle import START, Folder, timed_run  # noqa: E402  (this directory is on the path)


def build(nodes: int, running: int, pending_jobs: int, pods_per_job: int, gpus_per_pod: int) -> tuple[ClusterState, int]:
    folder = Folder()
    add = folder.add

    for i in range(nodes):
        add(p.NodeObserved(name=f"node-{i:05d}", milli_cpu=256_000, memory_bytes=2**41, gpus=8))
    # both queues deserve nothing and weigh the same: the division splits the cluster by demand
    for name in ("owner", "claimer"):
        add(p.QueueObserved(name=name, gpu=p.QueueResource(quota=0, over_quota_weight=1)))
    for i in range(running):
        node = f"node-{i // 8:05d}"
        add(p.PodObserved(namespace="b", name=f"run-{i}", uid=f"r{i}", queue="owner", podgroup=f"rg-{i}",
                          implicit_podgroup=True, priority_class="train", phase="Running", node_name=node,
                          gpu=p.GpuRequest(whole=1), requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30),
                          created_ns=START + i))
    for j in range(pending_jobs):
        if pods_per_job > 1:
            add(p.PodGroupObserved(namespace="a", name=f"job-{j}", queue="claimer", min_member=pods_per_job,
                                   priority_class="train"))
        for k in range(pods_per_job):
            add(p.PodObserved(namespace="a", name=f"job-{j}-{k}", uid=f"a{j}-{k}", queue="claimer",
                              podgroup=f"job-{j}", implicit_podgroup=pods_per_job == 1, priority_class="train",
                              gpu=p.GpuRequest(whole=gpus_per_pod),
                              requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30),
                              created_ns=START + running + j))
    return folder.state, folder.pos


def run(label: str, build: Callable[[], tuple[ClusterState, int]], policy: str | None = None) -> None:
    overrides = {} if policy is None else {"policy_version": policy}
    cfg = SchedulerConfig(state_digest_every=0, **overrides)  # the policy's default actions: all
    dt, peak, kinds = timed_run(build, cfg)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(f"{label}: one cycle ({', '.join(cfg.action_list)}) in {dt:.2f}s, peak {peak / 2**20:.0f} MiB "
          f"of Python objects, process peak RSS so far {rss / 2**20:.0f} MiB (state, both runs, the "
          f"packer's C tables; target < 5 s, < 1 GiB); decisions {kinds}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=["big", "many", "both"], default="both")
    ap.add_argument("--policy", default=None, help="policyVersion (default: the config's default)")
    args = ap.parse_args()
    if args.shape in ("big", "both"):
        run("big: 500 pods x 8 GPUs vs 1,000 full nodes of 1-GPU jobs",
            lambda: build(nodes=1000, running=8000, pending_jobs=1, pods_per_job=500, gpus_per_pod=8),
            args.policy)
    if args.shape in ("many", "both"):
        run("many: 8,000 pending 1-GPU jobs vs 8,000 running",
            lambda: build(nodes=1000, running=8000, pending_jobs=8000, pods_per_job=1, gpus_per_pod=1),
            args.policy)


if __name__ == "__main__":
    main()
