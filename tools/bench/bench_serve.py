"""`kai-es serve`'s view: the pages built in-process, then loaded by a real browser.

1. 1,000 queues (10 parents x 99 leaves + the parents, 64 nodes, 2,000 pending pods), 600
   cycles: the cost of one cycle's cut (every queue's numbers), then the queue-tree page (1,000
   rows and its chart), a queue page and the pending-jobs page, built in Python.
2. The 1,000,000-event benchmark log (tools/bench/bench_fold.py makes it in out/bench/ if it is
   missing): the cold fold `kai-es serve` does at start, the pages on the folded view, then
   following: the cost per record of the last records fed (it must not grow with the log: the
   view folds each new record once, it never re-folds), and a job's timeline on first request:
   the one the view kept while folding (`LiveView.timeline`) with its event records read by
   position, against `kai-es explain` over the whole log (what the page ran before; checked
   equal; `--no-explain` skips it), and the memory the kept timelines take.
3. In a browser, for each of the two logs (part 1's records written to a log file): `kai-es
   serve LOG` started as a process (loopback, a free port), the time from its start until the
   served view is complete (its /api/position is the log's record count), then headless
   Chromium (Debian's, started as tests/test_serve_browser.py starts it: tests/chromium.py)
   loading the queue tree, a queue page and the pending-jobs page, each in a fresh context,
   three times: from the request to the load event with the page's chart (`svg.chart`) or its
   content present. A Chromium that cannot start ends the run with exit 1 and says why
   (checked first, before the in-process parts); `--no-browser` skips this part.

    python tools/bench/bench_serve.py [--events 1000000] [--queues 1000] [--no-explain] [--no-browser]

Prints each time and its ratio to the target (pages < 3 s each, "a few seconds"; a job's
timeline < 1 s; following < 1 ms per record). Asserts nothing about the times.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kai_es.adapters.file_log import FileEventLog  # noqa: E402
from kai_es.app import freeze_long_lived  # noqa: E402
from kai_es.events import Envelope, Record  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import make_envelope  # noqa: E402
from kai_es.explain import event_positions, explain, resolve  # noqa: E402
from kai_es.visibility import pages  # noqa: E402
from kai_es.visibility.live import LiveView  # noqa: E402

PAGE_TARGET_S = 3.0
TIMELINE_TARGET_S = 1.0
FOLLOW_TARGET_US = 1000.0


def _report(label: str, dt: float, target_s: float = PAGE_TARGET_S, detail: str = "", indent: str = "  ") -> None:
    print(f"{indent}{label}: {dt * 1000:.0f} ms{detail}   target < {target_s:g} s  ({dt / target_s:.2f} of it)")


def _timed(label: str, fn: object, target_s: float = PAGE_TARGET_S) -> object:
    t0 = time.perf_counter()
    out = fn()  # type: ignore[operator]
    dt = time.perf_counter() - t0
    _report(label, dt, target_s, f" ({len(out) / 1e6:.2f} MB)" if isinstance(out, str) else "")
    return out


def _many_queues_log(queues: int, cycles: int) -> list[list[Envelope]]:
    """Part 1's log as its appends: the queues, nodes and pending pods in one, then one per
    cycle (its start and its end, nothing decided)."""
    n = 0

    def env(payload: p.Payload, subject: str, t: int, basedon: int | None = None) -> Envelope:
        nonlocal n
        n += 1
        return make_envelope(payload, event_id=f"b{n - 1}", source="kai-es/bench", subject=subject, logicaltime=t,
                             basedon=basedon)

    t = 1_800_000_000 * 10**9
    parents = max(1, queues // 100)
    setup = [env(p.QueueObserved(name=f"dept-{i}", gpu=p.QueueResource(quota=64_000)), f"queue/dept-{i}", t)
             for i in range(parents)]
    setup += [env(p.QueueObserved(name=f"team-{i}", parent=f"dept-{i % parents}", gpu=p.QueueResource(quota=1000)),
                  f"queue/team-{i}", t) for i in range(queues - parents)]
    setup += [env(p.NodeObserved(name=f"node-{i}", milli_cpu=128_000, memory_bytes=2**40, gpus=8,
                                 gpu_memory_mib=81920), f"node/node-{i}", t) for i in range(64)]
    setup += [env(p.PodObserved(namespace="default", name=f"pod-{i}", uid=f"u{i}", podgroup=f"pg-{i}",
                                queue=f"team-{i % (queues - parents)}", gpu=p.GpuRequest(whole=1), created_ns=t),
                  f"pod/default/pod-{i}", t) for i in range(2000)]
    appends = [setup]
    for c in range(cycles):
        t += 10**9
        started = n
        appends.append([env(p.CycleStarted(cycle=c + 1, config_digest=""), f"cycle/{c + 1}", t),
                        env(p.CycleCompleted(cycle=c + 1, decisions=0), f"cycle/{c + 1}", t, basedon=started)])
    return appends


def _many_queues(appends: list[list[Envelope]]) -> LiveView:
    """A view of part 1's log, the cycles' cuts timed."""
    view = LiveView()
    for position, envelope in enumerate(appends[0]):
        view.feed(Record(position, envelope))
    position = len(appends[0])
    t0 = time.perf_counter()
    for batch in appends[1:]:
        for envelope in batch:
            view.feed(Record(position, envelope))
            position += 1
    dt = time.perf_counter() - t0
    cycles, queues = len(appends) - 1, sum(isinstance(e.data, p.QueueObserved) for e in appends[0])
    print(f"  one cycle's cut at {queues} queues: {dt / cycles * 1000:.1f} ms ({cycles} cycles folded in {dt:.1f} s)")
    return view


async def _write_log(path: Path, appends: list[list[Envelope]]) -> int:
    """A log file at `path` written append by append; its record count."""
    log = FileEventLog(path)
    try:
        for batch in appends:
            await log.append(batch)
        return await log.end_position()
    finally:
        await log.close()


# --- in a browser --------------------------------------------------------------------------------


@contextlib.contextmanager
def _chromium() -> Iterator[Any]:
    """Headless Chromium as tests/test_serve_browser.py starts it; exit 1, saying why, if it
    cannot start (a benchmark that skipped its browser part silently would report nothing)."""
    try:
        from playwright.sync_api import sync_playwright

        from tests.chromium import ChromiumDidNotStart, launch
    except ImportError as exc:
        sys.exit(f"bench_serve: the browser part needs Playwright's Python driver ({exc}); "
                 "--no-browser skips it")
    with sync_playwright() as pw:
        try:
            browser = launch(pw)
        except ChromiumDidNotStart as exc:
            sys.exit(f"bench_serve: {exc}\n(--no-browser skips the browser part)")
        try:
            yield browser
        finally:
            browser.close()


class _Served:
    """`kai-es serve LOG` as a process on a free loopback port; `started` is when it was spawned
    (time.perf_counter)."""

    def __init__(self, log: Path, err: IO[str]) -> None:
        self.err = err
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "kai_es", "serve", str(log), "--bind", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "serving LOG read-only on http://127.0.0.1:PORT/ (...)"
        if "http://" not in line:
            self._fail(f"printed {line!r} instead of its address")
        self.url = "http://" + line.split("http://", 1)[1].split()[0].rstrip("/")

    def _fail(self, what: str) -> None:
        self.stop()
        self.err.seek(0)
        sys.exit(f"bench_serve: kai-es serve {what}; its stderr:\n{self.err.read()[-2000:]}")

    def complete_after(self, records: int, timeout_s: float = 900.0) -> float:
        """Seconds from the process's start until its view has folded all `records` of the log
        (polled every 0.1 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                self._fail(f"ended (exit {self.proc.returncode}) before its view was complete")
            try:
                with urllib.request.urlopen(self.url + "/api/position", timeout=30) as r:
                    if int(r.read()) >= records:
                        return time.perf_counter() - self.started
            except OSError:
                pass  # (busy folding: asked again)
            if time.monotonic() > deadline:
                self._fail(f"had not folded {records:,} records after {timeout_s:g} s")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


def _load(browser: Any, url: str, ready: str) -> tuple[float, int]:
    """Seconds from asking for `url` in a fresh browser context to its load event with `ready`
    (a CSS selector) in the page; and the rows the page shows (queues or waiting jobs)."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        t0 = time.perf_counter()
        page.goto(url, wait_until="load", timeout=120_000)
        page.wait_for_selector(ready, state="attached", timeout=120_000)
        dt = time.perf_counter() - t0
        if errors:
            sys.exit(f"bench_serve: {url}: script errors in the page: {errors}")
        return dt, page.locator("tr[data-queue], tr[data-job]").count()
    finally:
        context.close()


def _in_browser(log: Path, records: int, queue: str) -> None:
    """Part 3 for one log: `kai-es serve` started on it, complete, then its pages in Chromium."""
    with tempfile.TemporaryFile("w+") as err:
        served = _Served(log, err)
        try:
            complete = served.complete_after(records)
            print(f"    kai-es serve: view complete ({records:,} records folded) {complete:.1f} s after the process "
                  "started")
            with _chromium() as browser:
                for label, path, ready, what in (
                        ("queue tree page", "/", "svg.chart polyline", "its chart"),
                        (f"queue {queue}'s page", f"/queue?name={queue}", "svg.chart polyline", "its chart"),
                        ("pending jobs page", "/pending", "main#live h1", "its content (no chart)")):
                    loads = [_load(browser, served.url + path, ready) for _ in range(3)]
                    times = [dt for dt, _ in loads]
                    _report(f"{label} ({loads[0][1]:,} rows), request to load event with {what}, slowest of 3",
                            max(times), detail=f" (each: {', '.join(f'{t * 1000:.0f}' for t in times)} ms)",
                            indent="    ")
        finally:
            served.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--no-explain", action="store_true", help="skip explain over the whole log (the old page)")
    ap.add_argument("--no-browser", action="store_true",
                    help="skip the browser part (kai-es serve processes loaded by headless Chromium)")
    args = ap.parse_args()
    if not args.no_browser:
        with _chromium():  # (fails now rather than after the in-process parts)
            pass

    print(f"{args.queues} queues:")
    appends = _many_queues_log(args.queues, args.cycles)
    view = _many_queues(appends)
    _timed("queue tree page (every queue, chart)", lambda: pages.queues_page(view))
    _timed("one queue's page (numbers, chart, waiting jobs)", lambda: pages.queue_page(view, "team-0"))
    _timed("pending jobs page (every queue's waiting jobs)", lambda: pages.pending_page(view))
    del view
    gc.collect()
    if not args.no_browser:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"queues-{args.queues}.events.jsonl"
            records = anyio.run(_write_log, path, appends)
            print(f"  in Chromium ({path.name}, {records:,} records, {path.stat().st_size / 1e6:.1f} MB):")
            _in_browser(path, records, "team-0")
    del appends

    path = ROOT / "out" / "bench" / f"synthetic-steady-{args.events}.events.jsonl"
    if not path.exists():
        sys.path.insert(0, str(ROOT / "tools" / "bench"))
        from bench_fold import generate  # the same deterministic log bench_fold.py measures

        path.parent.mkdir(parents=True, exist_ok=True)
        generate(path, args.events)
    print(f"{path.name}:")
    records = _big_log(path, args.no_explain)
    gc.unfreeze()  # (what freeze_long_lived kept goes, so the in-process view is gone before kai-es serve
    gc.collect()  # folds the log again)
    if not args.no_browser:
        print("  in Chromium:")
        _in_browser(path, records, "q0")


def _big_log(path: Path, no_explain: bool) -> int:
    """Part 2 on the log at `path`; its record count."""
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
        if not no_explain:
            want = _timed(f"job timeline of {target} by explain over the whole log (the page before)",
                          lambda: explain(log.scan(0), target), target_s=TIMELINE_TARGET_S)
            print(f"  the same report: {'yes' if want == report else 'NO'}")
    return records


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
