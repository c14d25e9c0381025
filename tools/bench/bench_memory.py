"""Memory over many pod lifecycles: does the scheduler's state stay flat? (Reliability II §4)

    python tools/bench/bench_memory.py [--pods 1000000] [--every 50000] [--keep-finished]

The scheduler's own loop, in one process: pods arrive in batches, a real cycle (`run_cycle`, the
native packer, the default actions) decides them, the binder's outcome and the pod's Running
observation are folded, and each pod finishes one cycle later (Succeeded) and is then deleted
(PodRemoved), as a Job's TTL controller or a user deletes it. Nothing is written to disk:
what is measured is the state and the cycle, not the log's file.

Prints, every `--every` pods: pods processed, the process's RSS (from /proc/self/statm), the
pods and jobs held by the state, and the RSS growth per 1,000 pods since warm-up (the first
print). With `--keep-finished`, finished pods are never deleted (a cluster whose completed pods
linger): then the state holds every one, by design, since they still exist in the cluster.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kai_es.events import Record  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import derived_id, make_envelope  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig, config_digest, config_event  # noqa: E402
from kai_es.scheduling.cycle import run_cycle  # noqa: E402
from kai_es.scheduling.packing import load_packer  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from kai_es.state.reducer import apply  # noqa: E402

NODES = 250
BATCH = 400
START = 1_767_225_600_000_000_000
SEC = 1_000_000_000
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=50_000)
    ap.add_argument("--keep-finished", action="store_true")
    args = ap.parse_args()
    cfg = SchedulerConfig()
    packer = load_packer("native")
    state = ClusterState()
    position = 0
    t = START
    n = 0

    def fold(envs: list) -> list[Record]:  # type: ignore[type-arg]
        nonlocal position
        out = []
        for env in envs:
            rec = Record(position, env)
            apply(state, rec)
            out.append(rec)
            position += 1
        return out

    def ev(payload: p.Payload, subject: str, source: str = "kai-es/informer") -> object:
        nonlocal n
        n += 1
        return make_envelope(payload, event_id=derived_id("mem", n), source=source, subject=subject, logicaltime=t)

    fold([config_event(cfg, event_id="cfg", logicaltime=t)])
    fold([ev(p.QueueObserved(name=f"q{i}"), f"queue/q{i}") for i in range(8)])
    fold([ev(p.NodeObserved(name=f"node-{i:04d}", milli_cpu=128_000, memory_bytes=2**40, gpus=8),
             f"node/node-{i:04d}") for i in range(NODES)])
    running: list[p.PodObserved] = []
    arrived = cycle = 0
    next_print = args.every
    base: tuple[int, float] | None = None
    t0 = time.perf_counter()
    print(f"{'pods':>10} {'RSS MiB':>9} {'state pods':>10} {'state jobs':>10} {'KiB/1000 pods':>14} {'s':>6}")
    while arrived < args.pods:
        t += 5 * SEC
        batch = []
        for _ in range(BATCH):
            arrived += 1
            spec = p.PodObserved(namespace="m", name=f"pod-{arrived}", uid=f"u{arrived}",
                                 queue=f"q{arrived % 8}", podgroup=f"pg-{arrived}", implicit_podgroup=True,
                                 requests=p.PodResources(milli_cpu=4000, memory_bytes=2**34),
                                 gpu=p.GpuRequest(whole=(1, 1, 2, 4)[arrived % 4]), created_ns=t)
            batch.append(ev(spec, f"pod/m/pod-{arrived}"))
        # the pods that ran one cycle finish, and are deleted
        finished = [ev(p.PodObserved(**{**{f: getattr(o, f) for f in o.__struct_fields__}, "phase": "Succeeded"}),
                       f"pod/m/{o.name}") for o in running]
        if not args.keep_finished:
            finished += [ev(p.PodRemoved(namespace="m", name=o.name, uid=o.uid), f"pod/m/{o.name}") for o in running]
        fold(batch + finished)
        cycle += 1
        [cut] = fold([ev(p.CycleStarted(cycle=cycle, config_digest=config_digest(cfg)), f"cycle/{cycle}",
                         "kai-es/scheduler")])
        decisions = run_cycle(state, cut, cfg, packer)
        fold(decisions)
        t += SEC
        running = []
        outcomes = []
        for d in decisions:
            if isinstance(d.data, p.BindingDecided):
                outcomes.append(make_envelope(
                    p.PodBound(namespace="m", name=d.data.name, uid=d.data.uid, node=d.data.node,
                               decision_id=d.id, gpu_devices=d.data.gpu_devices),
                    event_id=derived_id(d.id, 0), source="kai-es/binder", subject=d.subject, logicaltime=t))
                spec = state.pods[f"m/{d.data.name}"].spec
                obs = p.PodObserved(**{**{f: getattr(spec, f) for f in spec.__struct_fields__},
                                       "phase": "Running", "node_name": d.data.node, "gpu_devices": d.data.gpu_devices})
                outcomes.append(ev(obs, d.subject))
                running.append(obs)
        fold(outcomes)
        if arrived >= next_print:
            next_print += args.every
            gc.collect()
            rss = rss_mib()
            slope = "" if base is None else f"{(rss - base[1]) * 1024 / ((arrived - base[0]) / 1000):.1f}"
            if base is None:
                base = (arrived, rss)
            print(f"{arrived:>10,} {rss:>9.1f} {len(state.pods):>10,} {len(state.jobs):>10,} {slope:>14} "
                  f"{time.perf_counter() - t0:>6.0f}", flush=True)


if __name__ == "__main__":
    main()
