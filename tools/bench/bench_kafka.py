"""KafkaEventLog throughput and latency against a real local broker (tools/kafka/broker.py).

Measures, on one freshly started single-node Kafka 4.1.2 broker (loopback):

* append-to-fold latency: one event per `append` (one transaction each), timed from the call
  until a follow-mode reader has decoded it and folded it with `kai_es.state.reducer.apply`
  (p50/p90/p99/max);
* sustained append rate: `--events` events in transactions of `--batch` events (events/s);
* fold rate: a fresh log instance reads the whole topic from position 0 (read_committed,
  batched fetch, `kai_es.events.decode`) and folds every record with `reducer.apply`
  (events/s), plus read+decode alone for comparison.

The event mix is realistic for the reducer: nodes and queues first, then pods observed pending,
observed running on a node, and removed. Prints numbers; asserts nothing.

    python3 tools/bench/bench_kafka.py                    # 200,000 events, batches of 500
    python3 tools/bench/bench_kafka.py --events 50000 --batch 100 --latency-samples 200
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kai_es.adapters.kafka_log import KafkaEventLog  # noqa: E402
from kai_es.events import Envelope, encode  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import make_envelope  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from kai_es.state.reducer import apply  # noqa: E402

GIB = 1 << 30


def load_broker_module() -> Any:
    path = REPO / "tools" / "kafka" / "broker.py"
    spec = importlib.util.spec_from_file_location("kai_es_tools_kafka_broker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def env_of(payload: p.Payload, i: int, subject: str) -> Envelope:
    return make_envelope(payload, event_id=f"bench-{i}", source="bench", subject=subject,
                         logicaltime=1_000_000 + i)


def workload(n: int, nodes: int = 200) -> Iterator[Envelope]:
    """n envelopes: nodes and a queue, then pods cycling pending -> running -> removed."""
    i = 0
    yield env_of(p.QueueObserved(name="team-a", gpu=p.QueueResource(quota=-1)), i, "queue/team-a")
    i += 1
    for k in range(min(nodes, n - 1)):
        yield env_of(p.NodeObserved(name=f"node-{k}", milli_cpu=64_000, memory_bytes=512 * GIB,
                                    gpus=8, gpu_memory_mib=81_920), i, f"node/node-{k}")
        i += 1
    pod = 0
    while i < n:
        name, uid = f"pod-{pod}", f"uid-{pod}"
        node = f"node-{pod % nodes}"
        base = dict(namespace="default", name=name, uid=uid, queue="team-a",
                    podgroup=f"pg-{pod}", implicit_podgroup=True,
                    requests=p.PodResources(milli_cpu=1000, memory_bytes=GIB),
                    gpu=p.GpuRequest(whole=1))
        steps = [(p.PodObserved(**base), "pod"),
                 (p.PodObserved(**base, phase="Running", node_name=node, gpu_devices=(pod % 8,)), "pod"),
                 (p.PodRemoved(namespace="default", name=name, uid=uid), "pod")]
        for payload, _ in steps:
            if i >= n:
                break
            yield env_of(payload, i, f"pod/default/{name}")
            i += 1
        pod += 1


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


async def bench_latency(bootstrap: str, topic: str, samples: int) -> list[float]:
    writer = KafkaEventLog(bootstrap, topic, transactional_id=f"{topic}-latency-writer")
    reader = KafkaEventLog(bootstrap, topic, transactional_id=f"{topic}-latency-reader")
    state = ClusterState()
    folded: dict[str, float] = {}
    arrived = asyncio.Event()
    try:
        start = await writer.end_position()

        async def follow() -> None:
            async for record in reader.read(start, follow=True):
                apply(state, record)
                folded[record.envelope.id] = time.perf_counter()
                arrived.set()

        task = asyncio.create_task(follow())
        await writer.append([env_of(p.NodeObserved(name="lat", milli_cpu=1000, memory_bytes=GIB),
                                    0, "node/lat")])  # warm-up: producer + coordinator
        while "bench-0" not in folded:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 30)
        lat: list[float] = []
        for i in range(1, samples + 1):
            env = env_of(p.NodeObserved(name="lat", milli_cpu=1000 + i, memory_bytes=GIB), i,
                         "node/lat")
            t0 = time.perf_counter()
            await writer.append([env])
            while env.id not in folded:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 30)
            lat.append(folded[env.id] - t0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return lat
    finally:
        await writer.close()
        await reader.close()


async def bench_append(bootstrap: str, topic: str, events: list[Envelope],
                       batch: int) -> tuple[float, list[float]]:
    log = KafkaEventLog(bootstrap, topic, transactional_id=f"{topic}-writer")
    try:
        await log.append(events[:1])  # warm-up outside the timing
        per_batch: list[float] = []
        t0 = time.perf_counter()
        for k in range(1, len(events), batch):
            tb = time.perf_counter()
            await log.append(events[k:k + batch])
            per_batch.append(time.perf_counter() - tb)
        return time.perf_counter() - t0, per_batch
    finally:
        await log.close()


async def bench_fold(bootstrap: str, topic: str, *, fold: bool) -> tuple[int, float]:
    log = KafkaEventLog(bootstrap, topic, create=False)
    try:
        await log.end_position()  # connect + topic check outside the timing
        state = ClusterState()
        n = 0
        t0 = time.perf_counter()
        if fold:
            async for record in log.read(0):
                apply(state, record)
                n += 1
        else:
            async for _record in log.read(0):
                n += 1
        return n, time.perf_counter() - t0
    finally:
        await log.close()


def decode_only_rate(events: list[Envelope]) -> float:
    from kai_es.events import decode

    blobs = [encode(e) for e in events]
    t0 = time.perf_counter()
    for b in blobs:
        decode(b)
    return len(blobs) / (time.perf_counter() - t0)


async def run(args: argparse.Namespace, bootstrap: str) -> None:
    topic = f"bench-{os.getpid()}-{time.time_ns() % 10**9}"
    events = list(workload(args.events))
    size = sum(len(encode(e)) for e in events) / len(events)
    print(f"workload: {len(events):,} events, mean value {size:.0f} bytes; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs (broker on the same host)")

    lat = await bench_latency(bootstrap, f"{topic}-lat", args.latency_samples)
    ms = [x * 1000 for x in lat]
    print(f"append-to-fold latency, 1 event per transaction, {len(ms)} samples: "
          f"p50 {pct(ms, 50):.2f} ms  p90 {pct(ms, 90):.2f} ms  p99 {pct(ms, 99):.2f} ms  "
          f"max {max(ms):.2f} ms")

    elapsed, per_batch = await bench_append(bootstrap, topic, events, args.batch)
    bms = [x * 1000 for x in per_batch]
    print(f"append: {len(events) - 1:,} events in transactions of {args.batch}: "
          f"{(len(events) - 1) / elapsed:,.0f} events/s ({elapsed:.2f} s); per transaction "
          f"p50 {pct(bms, 50):.1f} ms p99 {pct(bms, 99):.1f} ms")

    for rnd in range(args.rounds):
        n, t = await bench_fold(bootstrap, topic, fold=False)
        print(f"read+decode (no fold) round {rnd + 1}: {n:,} records in {t:.2f} s = "
              f"{n / t:,.0f} events/s")
        n, t = await bench_fold(bootstrap, topic, fold=True)
        print(f"fold (read + decode + reducer.apply) round {rnd + 1}: {n:,} records in {t:.2f} s"
              f" = {n / t:,.0f} events/s")
    print(f"decode alone (in memory, no Kafka): {decode_only_rate(events[:50_000]):,.0f} events/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--latency-samples", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bootstrap", default=None,
                    help="use a running broker instead of starting one (host:port)")
    args = ap.parse_args()
    if args.bootstrap:
        asyncio.run(run(args, args.bootstrap))
        return
    broker_mod = load_broker_module()
    broker = broker_mod.KafkaBroker()
    try:
        t0 = time.perf_counter()
        broker.start(timeout_s=180)
        print(f"broker {broker.bootstrap} started in {time.perf_counter() - t0:.1f} s")
        asyncio.run(run(args, broker.bootstrap))
    finally:
        broker.close()


if __name__ == "__main__":
    main()
