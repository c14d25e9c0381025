"""Scheduler cold start on a 1,000,000-event Kafka topic: from a snapshot (+ tail) vs a full fold.

    python tools/bench/bench_kafka_coldstart.py [--events 1000000] [--bootstrap host:port]

1. The synthetic log of tools/bench/bench_fold.py (generated there if missing, into
   out/bench/synthetic-N.events.jsonl) is produced raw into a fresh topic.
2. A scheduler with a snapshot store starts on it (a FULL FOLD: timed), announces its config
   (stateDigestEvery=1), runs one cycle and writes the snapshot of that cut to
   `<topic>.snapshots`; a tail of 2,000 more events is appended after it.
3. Timed: a new scheduler restores the snapshot (validated: restored digest and the log's
   CycleCompleted statedigest) and folds the tail -> "ready". Then, for comparison, a new
   scheduler without snapshots folds all of it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]  # noqa: E402

from kai_es.adapters.clock import SystemClock  # noqa: E402
from kai_es.adapters.file_log import FileEventLog  # noqa: E402
from kai_es.adapters.ids import RandomIds  # noqa: E402
from kai_es.adapters.kafka_log import KafkaEventLog  # noqa: E402
from kai_es.adapters.kafka_snapshots import KafkaSnapshotStore  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import make_envelope  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig  # noqa: E402
from kai_es.scheduling.packing import load_packer  # noqa: E402
from kai_es.services.scheduler import SchedulerService  # noqa: E402
from kai_es.state.snapshot import digest  # noqa: E402


def load_module(rel: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def produce(bootstrap: str, topic: str, path: Path) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20,
                                max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)
    await producer.start()
    n = 0
    try:
        pending = []
        for _, body in FileEventLog(path, readonly=True).scan_raw():
            pending.append(await producer.send(topic, value=body, partition=0))
            n += 1
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return n


async def run(args: argparse.Namespace, bootstrap: str) -> None:
    path = ROOT / "out" / "bench" / f"synthetic-{args.events}.events.jsonl"
    if not path.exists():
        bench_fold = load_module("tools/bench/bench_fold.py", "kai_es_bench_fold")
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        bench_fold.generate(path, args.events)
        print(f"generated {path.relative_to(ROOT)} in {time.perf_counter() - t0:.1f} s")
    topic = f"coldstart-{os.getpid()}-{time.time_ns() % 10**9}"
    events = KafkaEventLog(bootstrap, topic, transactional_id=f"bench-{topic}")
    await events.end_position()  # creates the topic (1 partition, unlimited retention)
    t0 = time.perf_counter()
    n = await produce(bootstrap, topic, path)
    print(f"produced {n:,} events into {topic} in {time.perf_counter() - t0:.1f} s")

    packer = load_packer("native")
    config = SchedulerConfig(state_digest_every=1)
    store = KafkaSnapshotStore.for_log(events)
    try:
        sched = SchedulerService(events, config, packer, SystemClock(), RandomIds(),
                                 snapshots=store, snapshot_every=1)
        t0 = time.perf_counter()
        await sched.start()
        first_fold = time.perf_counter() - t0
        await sched.run_cycle_once()
        assert sched.snapshots_written == 1, "no snapshot written"
        snap_pos = sched.state.position
        print(f"first start (full fold, no snapshot yet): {first_fold:.2f} s; one cycle + snapshot "
              f"written; state has {len(sched.state.pods):,} pods, {len(sched.state.nodes)} nodes")
        # a tail after the snapshot: 2,000 node heartbeats that change nothing but must be folded
        tail = [make_envelope(p.ResyncStarted(kind="Topology"), event_id=f"tail-{i}",
                              source="kai-es/informer", subject="resync/topology",
                              logicaltime=sched.state.logicaltime + i) for i in range(args.tail)]
        for i in range(0, len(tail), 500):
            await events.append(tail[i:i + 500])
        end = await events.end_position()
        await events.close()

        t0 = time.perf_counter()
        warm = SchedulerService(events, config, packer, SystemClock(), RandomIds(),
                                snapshots=KafkaSnapshotStore.for_log(events), snapshot_every=0)
        await warm.start()
        ready = time.perf_counter() - t0
        assert warm.snapshot_restored is not None, "the snapshot was not used"
        print(f"READY from snapshot (load + validate + restore) + tail of "
              f"{warm.state.position - warm.snapshot_restored:,} positions: {ready:.2f} s   "
              f"target < 10 s  (snapshot at {warm.snapshot_restored}, end {end})")
        await warm.snapshots.close()  # type: ignore[union-attr]
        await events.close()

        t0 = time.perf_counter()
        cold = SchedulerService(events, config, packer, SystemClock(), RandomIds())
        await cold.start()
        full = time.perf_counter() - t0
        print(f"full fold without snapshot: {full:.2f} s ({cold.state.records:,} records, "
              f"{cold.state.records / full:,.0f} events/s)")
        same = digest(cold.state) == digest(warm.state)
        print(f"same state digest from snapshot+tail and from full fold: {same}")
        del snap_pos
        if not same:
            sys.exit(1)
    finally:
        await store.close()
        await events.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--tail", type=int, default=2_000)
    ap.add_argument("--bootstrap", default=None, help="a running broker (host:port)")
    args = ap.parse_args()
    if args.bootstrap:
        asyncio.run(run(args, args.bootstrap))
        return
    broker_mod = load_module("tools/kafka/broker.py", "kai_es_tools_kafka_broker")
    broker = broker_mod.KafkaBroker()
    try:
        broker.start(timeout_s=180)
        asyncio.run(run(args, broker.bootstrap))
    finally:
        broker.close()


if __name__ == "__main__":
    main()
