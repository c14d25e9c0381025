"""`kai-es serve`'s view (kai_es.visibility: the fold and the pages), measured in-process:

1. 1,000 queues (10 parents x 99 leaves + the parents, 64 nodes, 2,000 pending pods), 600
   cycles: the cost of one cycle's cut (every queue's numbers), then the queue-tree page (1,000
   rows and its chart), a queue page and the pending-jobs page.
2. The 1,000,000-event benchmark log (tools/bench/bench_fold.py makes it in out/bench/ if it is
   missing): the cold fold `kai-es serve` does at start, the pages on the folded view, then
   following: the cost per record of the last records fed (it must not grow with the log: the
   view folds each new record once, it never re-folds), and a job's timeline on first request:
   the one the view kept while folding (`LiveView.timeline`) with its event records read by
   position, against `kai-es explain` over the whole log (what the page ran before; checked
   equal; `--no-explain` skips it), and the memory the kept timelines take.

    python tools/bench/bench_serve.py [--events 1000000] [--queues 1000] [--no-explain]

Prints each time and its ratio to the target (pages < 3 s each; a job's timeline < 1 s;
following < 1 ms per record). Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import types
from pathlib import Path

from kai_es.adapters.file_log import FileEventLog
from kai_es.app import freeze_long_lived
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.explain import event_positions, explain, resolve
from kai_es.visibility import pages
from kai_es.visibility.live import LiveView

ROOT = Path(__file__).resolve().parents[2]
PAGE_TARGET_S = 3.0
TIMELINE_TARGET_S = 1.0
FOLLOW_TARGET_US = 1000.0


def _timed(label: str, fn: object, target_s: float = PAGE_TARGET_S) -> object:
    t0 = time.perf_counter()
    out = fn()  # type: ignore[operator]
    dt = time.perf_counter() - t0
    size = f" ({len(out) / 1e6:.2f} MB)" if isinstance(out, str) else ""
    print(f"  {label}: {dt * 1000:.0f} ms{size}   target < {target_s:g} s  ({dt / target_s:.2f} of it)")
    return out


def _many_queues(queues: int, cycles: int) -> LiveView:
    view = LiveView()
    n = 0

    def feed(payload: p.Payload, subject: str, t: int, basedon: int | None = None) -> None:
        nonlocal n
        env = make_envelope(payload, event_id=f"b{n}", source="kai-es/bench", subject=subject, logicaltime=t,
                            basedon=basedon)
        view.feed(Record(n, env))
        n += 1

    t = 1_800_000_000 * 10**9
    parents = max(1, queues // 100)
    for i in range(parents):
        feed(p.QueueObserved(name=f"dept-{i}", gpu=p.QueueResource(quota=64_000)), f"queue/dept-{i}", t)
    for i in range(queues - parents):
        feed(p.QueueObserved(name=f"team-{i}", parent=f"dept-{i % parents}", gpu=p.QueueResource(quota=1000)),
             f"queue/team-{i}", t)
    for i in range(64):
        feed(p.NodeObserved(name=f"node-{i}", milli_cpu=128_000, memory_bytes=2**40, gpus=8, gpu_memory_mib=81920),
             f"node/node-{i}", t)
    for i in range(2000):
        q = f"team-{i % (queues - parents)}"
        feed(p.PodObserved(namespace="default", name=f"pod-{i}", uid=f"u{i}", podgroup=f"pg-{i}", queue=q,
                           gpu=p.GpuRequest(whole=1), created_ns=t), f"pod/default/pod-{i}", t)
    t0 = time.perf_counter()
    for c in range(cycles):
        t += 10**9
        started = n
        feed(p.CycleStarted(cycle=c + 1, config_digest=""), f"cycle/{c + 1}", t)
        feed(p.CycleCompleted(cycle=c + 1, decisions=0), f"cycle/{c + 1}", t, basedon=started)
    dt = time.perf_counter() - t0
    print(f"  one cycle's cut at {queues} queues: {dt / cycles * 1000:.1f} ms ({cycles} cycles folded in {dt:.1f} s)")
    return view


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--no-explain", action="store_true", help="skip explain over the whole log (the old page)")
    args = ap.parse_args()

    print(f"{args.queues} queues:")
    view = _many_queues(args.queues, args.cycles)
    _timed("queue tree page (every queue, chart)", lambda: pages.queues_page(view))
    _timed("one queue's page (numbers, chart, waiting jobs)", lambda: pages.queue_page(view, "team-0"))
    _timed("pending jobs page (every queue's waiting jobs)", lambda: pages.pending_page(view))
    del view
    gc.collect()

    path = ROOT / "out" / "bench" / f"synthetic-steady-{args.events}.events.jsonl"
    if not path.exists():
        sys.path.insert(0, str(ROOT / "tools" / "bench"))
        from bench_fold import generate  # the same deterministic log bench_fold.py measures

        path.parent.mkdir(parents=True, exist_ok=True)
        generate(path, args.events)
    print(f"{path.name}:")
    log = FileEventLog(path, readonly=True)
    records = log.record_count()
    tail = min(10_000, records // 10)
    view = LiveView()
    gc.disable()  # as the follower's cold fold does (kai_es.app.bulk_fold)
    t0 = time.perf_counter()
    head_n = 0
    for record in log.scan(0, records - tail):
        view.feed(record)
        head_n += 1
    dt = time.perf_counter() - t0
    gc.enable()
    freeze_long_lived()  # as the follower does once it has caught up
    print(f"  cold fold: {head_n:,} records in {dt:.1f} s ({head_n / dt:,.0f} records/s; {dt / head_n * 1e6:.0f} us each)")
    t0 = time.perf_counter()
    for record in log.scan(records - tail):
        view.feed(record)
    follow_us = (time.perf_counter() - t0) / tail * 1e6
    print(f"  following: the last {tail:,} records fed one by one after that: {follow_us:.0f} us each   "
          f"target < {FOLLOW_TARGET_US:g} us  ({follow_us / FOLLOW_TARGET_US:.2f} of it)")
    _timed("queue tree page", lambda: pages.queues_page(view))
    _timed("one queue's page", lambda: pages.queue_page(view, "q0"))
    _timed("pending jobs page", lambda: pages.pending_page(view))
    _timed("decision stream, newest 200 binder events",
           lambda: pages.events_page(view, pages.EventFilter(type="kai.binder.*")))
    _timed("decision stream, a subject matching nothing (scans the whole window)",
           lambda: pages.events_page(view, pages.EventFilter(subject="pod/none/*")))
    pod = next((r.envelope.data for r in log.scan(records // 2) if isinstance(r.envelope.data, p.PodObserved)), None)
    if pod is not None:
        target = f"{pod.namespace}/{pod.podgroup}"  # the job the pending page links

        def kept() -> dict[str, object]:
            report = view.timeline(target)
            assert report is not None
            return resolve(report, {r.position: r for at in event_positions(report) for r in log.scan(at, at + 1)})

        report = _timed(f"job timeline of {target} on first request (kept by the view, {target}'s records read)",
                        kept, target_s=TIMELINE_TARGET_S)
        _timed("job timeline page from it", lambda: pages.job_page(report))  # type: ignore[arg-type]
        t0 = time.perf_counter()
        size, timelines = _deep_size(view.timelines), len(view.timelines.timelines)
        print(f"  kept timelines: {timelines:,} subjects, {size / 2**20:.0f} MiB ({size / timelines:.0f} B each; "
              f"measured in {time.perf_counter() - t0:.0f} s)")
        if not args.no_explain:
            want = _timed(f"job timeline of {target} by explain over the whole log (the page before)",
                          lambda: explain(log.scan(0), target), target_s=TIMELINE_TARGET_S)
            print(f"  the same report: {'yes' if want == report else 'NO'}")


def _deep_size(root: object) -> int:
    """Bytes of every object reachable from `root` (classes, functions and modules left out)."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


if __name__ == "__main__":
    main()
