"""Memory of the `kai-es scheduler` process over many pod lifecycles on the file log
(Reliability II §4, second part).

    python3 tools/bench/bench_memory_process.py                     # 1,000,000 pods
    python3 tools/bench/bench_memory_process.py --pods 40000 --every 8000   # quick

A real `kai-es scheduler` process (`python -m kai_es scheduler --log FILE`, cycles every
`--period`, a snapshot every 50 cycles) runs over a new file log; this process plays the
informer and the binder on it: 8 queues and 250 nodes x 8 GPUs, then rounds of 400 arriving
pods (1, 1, 2 or 4 GPUs), and for every BindingDecided the scheduler appends, the binder's
PodBound and the pod's Running observation; the pods bound in one round finish (Succeeded) in
the next. Every `--every` pods it prints the scheduler process's RSS (/proc/PID/statm), the
events in the log, the RSS growth per 1,000 pods since the first print (the warm-up) and, for
comparison, what an offset per event would cost (8 bytes an event: the file log's index before
it was bounded, `kai_es.adapters.offset_index`).

The log is written under `--dir` (default: a new temporary directory, removed afterwards).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kai_es.adapters.file_log import FileEventLog  # noqa: E402
from kai_es.events import Envelope  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import derived_id, make_envelope  # noqa: E402

NODES = 250
QUEUES = 8
BATCH = 400
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class Driver:
    """The informer and the binder of the benchmark, appending to the log the scheduler reads."""

    def __init__(self, log: FileEventLog) -> None:
        self.log = log
        self.n = 0
        self.read_to = 0  # the next position to read
        self.cycles_completed = 0
        self.last_cycle_started = -1

    def ev(self, payload: p.Payload, subject: str, source: str = "kai-es/informer") -> Envelope:
        self.n += 1
        return make_envelope(payload, event_id=derived_id("bench-memory", self.n), source=source,
                             subject=subject, logicaltime=time.time_ns())

    async def decisions_after(self, position: int, timeout_s: float) -> list[tuple[str, p.BindingDecided]]:
        """(id, payload) of the BindingDecided records read until a cycle started after
        `position` completes."""
        binds: list[tuple[str, p.BindingDecided]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            async for record in self.log.read(self.read_to):
                self.read_to = record.position + 1
                data = record.envelope.data
                if isinstance(data, p.CycleStarted):
                    self.last_cycle_started = record.position
                elif isinstance(data, p.BindingDecided):
                    binds.append((record.envelope.id, data))
                elif isinstance(data, p.CycleCompleted) and self.last_cycle_started > position:
                    self.cycles_completed += 1
                    return binds
            if time.monotonic() > deadline:
                raise TimeoutError(f"no cycle completed within {timeout_s} s of position {position}")
            await anyio.sleep(0.002)


async def run(args: argparse.Namespace, log_path: Path) -> None:
    log = FileEventLog(log_path)
    driver = Driver(log)
    ev = driver.ev
    await log.append([ev(p.QueueObserved(name=f"q{i}"), f"queue/q{i}") for i in range(QUEUES)])
    await log.append([ev(p.NodeObserved(name=f"node-{i:04d}", milli_cpu=128_000, memory_bytes=2**40, gpus=8,
                                        gpu_memory_mib=81920), f"node/node-{i:04d}") for i in range(NODES)])
    proc = subprocess.Popen([sys.executable, "-m", "kai_es", "scheduler", "--log", str(log_path),
                             "--period", args.period, "--snapshot-every", "50"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pods: dict[str, p.PodObserved] = {}
        running: list[p.PodObserved] = []
        arrived = 0
        next_print = args.every
        base: tuple[int, float, int] | None = None
        t0 = time.perf_counter()
        print(f"{'pods':>10} {'RSS MiB':>9} {'log events':>11} {'KiB/1000 pods':>14} "
              f"{'8 B/event KiB':>15} {'cycles':>7} {'s':>6}")
        while arrived < args.pods:
            batch = []
            for _ in range(BATCH):
                arrived += 1
                spec = p.PodObserved(namespace="bench", name=f"pod-{arrived}", uid=f"u{arrived}",
                                     queue=f"q{arrived % QUEUES}", podgroup=f"pg-{arrived}", implicit_podgroup=True,
                                     requests=p.PodResources(milli_cpu=4000, memory_bytes=2**34),
                                     gpu=p.GpuRequest(whole=(1, 1, 2, 4)[arrived % 4]), created_ns=time.time_ns())
                pods[spec.name] = spec
                batch.append(ev(spec, f"pod/bench/{spec.name}"))
            positions = await log.append(batch)
            binds = await driver.decisions_after(positions[-1], args.timeout)
            bound = [ev(p.PodBound(namespace="bench", name=d.name, uid=d.uid, node=d.node, decision_id=i,
                                   gpu_devices=d.gpu_devices), f"pod/bench/{d.name}", "kai-es/binder")
                     for i, d in binds]
            now_running = []
            for _, d in binds:
                spec = pods.pop(d.name)
                obs = p.PodObserved(**{**{f: getattr(spec, f) for f in spec.__struct_fields__},
                                       "phase": "Running", "node_name": d.node, "gpu_devices": d.gpu_devices})
                now_running.append(obs)
            done = [ev(p.PodObserved(**{**{f: getattr(o, f) for f in o.__struct_fields__}, "phase": "Succeeded"}),
                       f"pod/bench/{o.name}") for o in running]
            await log.append(bound + [ev(o, f"pod/bench/{o.name}") for o in now_running] + done)
            running = now_running
            if proc.poll() is not None:
                raise RuntimeError(f"the scheduler exited ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
            if arrived >= next_print:
                next_print += args.every
                rss = rss_mib(proc.pid)
                events = await log.end_position()
                slope = index = ""
                if base is None:
                    base = (arrived, rss, events)
                else:
                    per = (arrived - base[0]) / 1000
                    slope = f"{(rss - base[1]) * 1024 / per:.1f}"
                    index = f"{(events - base[2]) * 8 / 1024 / per:.1f}"
                print(f"{arrived:>10,} {rss:>9.1f} {events:>11,} {slope:>14} {index:>15} "
                      f"{driver.cycles_completed:>7,} {time.perf_counter() - t0:>6.0f}", flush=True)
        print(f"pending at the end: {len(pods)} pods (the backlog a full cluster keeps)")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=100_000)
    ap.add_argument("--period", default="10ms", help="the scheduler's --period (default 10ms)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a cycle")
    ap.add_argument("--dir", type=Path, help="where to write the log (default: a temporary directory)")
    args = ap.parse_args()
    if args.pods < 1 or args.every < BATCH:
        ap.error(f"--pods must be positive and --every at least {BATCH}")
    made = args.dir is None
    directory = Path(tempfile.mkdtemp(prefix="kai-es-bench-memory-")) if made else args.dir
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "bench-memory.log"
    if log_path.exists():
        ap.error(f"{log_path} exists: choose another --dir")
    try:
        anyio.run(run, args, log_path)
    finally:
        if made:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
