"""`kai-es replay kafka://...` of a long history: wall time and memory, against a real broker.

    python3 tools/bench/bench_kafka_replay.py [--events 1000000] [--jobs 1,2]

Starts a single-node broker (tools/kafka/broker.py, a temporary directory), writes into a fresh
topic the workload of `bench_fold.py` as a scheduler writes it (each batch one transaction, the
cycles run on the folded state, their decisions based on the Kafka offsets, a state digest and a
checkpoint in `<topic>.checkpoints` every `bench_fold.SNAPSHOT_EVERY` cycles), then runs
`kai-es replay --jobs N kafka://...` for each N (N > 1: with and without the checkpoints), each
in a new process. Prints, for each, the wall time with its ratio to the file replay's target
(`bench_fold.REPLAY_TARGET_S`) and the largest resident memory of the replay's processes
(readers included) with its ratio to `MEMORY_TARGET`: the replay streams the log, so memory must
not grow with it (before `adapters.kafka_frames` it collected the whole log: 2.2 GB for
1,000,000 events).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import bench_fold  # noqa: E402  (tools/bench: the workload and the replay target)
from bench_kafka import load_broker_module  # noqa: E402  (tools/bench: the broker)

from kai_es.adapters.kafka_checkpoints import KafkaCheckpointStore  # noqa: E402
from kai_es.adapters.kafka_log import KafkaEventLog  # noqa: E402
from kai_es.adapters.snapshot_codec import encode_stored  # noqa: E402
from kai_es.events import Envelope, Record  # noqa: E402
from kai_es.ports import StoredSnapshot  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from kai_es.state.reducer import apply  # noqa: E402

#: a replay's largest process, whatever the length of the log (the what-if bound of issue #21)
MEMORY_TARGET = 1 << 30


async def write_workload(bootstrap: str, topic: str, events: int) -> int:
    """`bench_fold.lifecycles` appended to `topic` until it holds `events` events, with its
    checkpoints; the count. The cycles run in a thread (they are sync) and append through this
    loop."""
    log = KafkaEventLog(bootstrap, topic, transactional_id=f"{topic}-writer")
    checkpoints = KafkaCheckpointStore(bootstrap, topic)
    loop = asyncio.get_running_loop()
    state = ClusterState()
    written = 0

    def emit(envs: list[Envelope]) -> None:
        nonlocal written
        positions = asyncio.run_coroutine_threadsafe(log.append(envs), loop).result()
        for position, env in zip(positions, envs):
            apply(state, Record(position, env))
        written += len(envs)

    def keep(snap: StoredSnapshot) -> None:
        asyncio.run_coroutine_threadsafe(checkpoints.save(snap.position, encode_stored(snap)), loop).result()

    def drive() -> None:
        config = SchedulerConfig(state_digest_every=bench_fold.SNAPSHOT_EVERY)
        for _ in bench_fold.lifecycles(state, emit, config, snapshot_every=bench_fold.SNAPSHOT_EVERY, on_snapshot=keep):
            if written >= events:
                return

    try:
        thread = threading.Thread(target=drive)
        thread.start()
        await asyncio.to_thread(thread.join)
    finally:
        await log.close()
        await checkpoints.close()
    return written


def timed_replay(url: str, jobs: int, options: list[str]) -> tuple[float, int, str]:
    """(wall seconds, largest resident bytes of its processes, its last output line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "kai_es", "replay", "--jobs", str(jobs), *options, url],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"kai-es replay --jobs {jobs} failed ({run.returncode}): {run.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of the children is the largest of any child so far: a run below an earlier one's
    # peak reads as that peak, so the runs go smallest --jobs first and the figure is an upper bound
    return wall, max(peak, before) * 1024, run.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--jobs", default="1,2", help="comma-separated --jobs values to time")
    args = ap.parse_args()
    broker_mod = load_broker_module()
    broker = broker_mod.KafkaBroker()
    try:
        t0 = time.perf_counter()
        broker.start(timeout_s=180)
        topic = f"bench-replay-{args.events}"
        written = asyncio.run(write_workload(broker.bootstrap, topic, args.events))
        print(f"broker {broker.bootstrap}; wrote {written:,} events into {topic} in "
              f"{time.perf_counter() - t0:.1f} s (the bench_fold workload, one transaction per batch)")
        url = f"kafka://{broker.bootstrap}/{topic}"
        runs = [(jobs, options) for jobs in sorted(int(j) for j in args.jobs.split(","))
                for options in (([], ["--no-checkpoints"]) if jobs > 1 else ([],))]
        for jobs, options in runs:
            wall, peak, line = timed_replay(url, jobs, options)
            shown = " ".join(["--jobs", str(jobs), *options])
            print(f"kai-es replay {shown} kafka://: {wall:.2f} s   target < {bench_fold.REPLAY_TARGET_S:.0f} s "
                  f"({wall / bench_fold.REPLAY_TARGET_S:.2f}x it); largest process {peak / 2**20:,.0f} MiB "
                  f"(bound {MEMORY_TARGET >> 20:,} MiB: {peak / MEMORY_TARGET:.2f}x)")
            print(f"  verdict: {line[:160]}")
    finally:
        broker.close()


if __name__ == "__main__":
    main()
