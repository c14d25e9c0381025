"""Fold throughput and replay time on a 1,000,000-event synthetic log, and encode latency.

    python tools/bench/bench_fold.py [--events 1000000] [--regenerate] [--overload]
                                     [--min-events-per-s N] [--no-replay]

The log is realistic in shape, not just in size: 250 nodes x 8 GPUs; pods arrive, a real cycle
(run_cycle, native packer) decides them in batches, the binder confirms, pods run and finish.
So `kai-es replay` on it re-runs every cycle exactly as a scheduler would have. It is generated
once into out/bench/ (deterministic) and reused.

Prints: events/s for decode+apply (file scan incl. CRC; and from bytes in memory), each with its
ratio to the target (`FOLD_TARGET`, issue #21), the `kai-es replay` wall time, and the mean time
to canonically encode one decision event. With `--min-events-per-s N` it exits 1, saying so, when
the fold from memory with the GC paused (best of three, the figure the target is about) is below
N: a regression guard (pick N well under a quiet machine's figure, this machine's noise is large).
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kai_es.adapters.file_checkpoints import DEFAULT_KEEP, checkpoint_dir, list_checkpoints, save_checkpoint  # noqa: E402
from kai_es.adapters.file_log import FileEventLog, frame  # noqa: E402
from kai_es.adapters.snapshot_codec import encode_stored  # noqa: E402
from kai_es.ports import StoredSnapshot  # noqa: E402
from kai_es.services.snapshotting import cut_snapshot  # noqa: E402
from kai_es.events import Envelope, Record, decode, encode  # noqa: E402
from kai_es.events import payloads as p  # noqa: E402
from kai_es.events.factory import derived_id, make_envelope  # noqa: E402
from kai_es.scheduling.config import config_event  # noqa: E402
from kai_es.scheduling.config import SchedulerConfig, config_digest  # noqa: E402
from kai_es.scheduling.cycle import run_cycle  # noqa: E402
from kai_es.scheduling.packing import load_packer  # noqa: E402
from kai_es.state import ClusterState  # noqa: E402
from kai_es.state.reducer import apply, fold  # noqa: E402
from kai_es.replay_parallel import default_jobs  # noqa: E402

NODES = 250
BATCH = 400
#: the log's cycles record a state digest, and a snapshot is kept, every this many cycles (a
#: digest on every cycle, the default, costs a replay ~20% more on this log)
SNAPSHOT_EVERY = 50
START = 1_767_225_600_000_000_000
SEC = 1_000_000_000
#: decode + apply on one core, from memory with the GC paused (issue #21 §1)
FOLD_TARGET = 300_000
#: a 1,000,000-event `kai-es replay` on two cores (issue #21 §1)
REPLAY_TARGET_S = 5.0


def _rate(events: int, seconds: float) -> str:
    """`events / seconds` as events/s with its ratio to FOLD_TARGET."""
    rate = events / seconds
    return f"{rate:,.0f} events/s ({rate / FOLD_TARGET:.2f}x the {FOLD_TARGET:,} target)  ({seconds:.2f}s)"


def lifecycles(state: ClusterState, emit: Callable[[list[Envelope]], object], config: SchedulerConfig, *,
               overload: bool = False, snapshot_every: int = 0,
               on_snapshot: Callable[[StoredSnapshot], object] | None = None) -> Iterator[int]:
    """Drive a synthetic cluster: 8 queues, NODES nodes x 8 GPUs; then rounds of BATCH arriving
    pods, a real cycle (run_cycle, native packer) deciding them, the binder's PodBound and the
    pod's Running observation, and the pods of an earlier round finishing (Succeeded). `emit(events)`
    must fold the events into `state` (and may write them). Every `snapshot_every` cycles whose
    CycleCompleted records a state digest, `on_snapshot` gets the snapshot a scheduler would
    store then (`kai-es scheduler --snapshot-every`). Yields the pods arrived so far after
    each round, for ever: the caller stops it."""
    packer = load_packer("native")
    t = START
    n = 0

    def ev(payload: p.Payload, subject: str, source: str = "kai-es/informer") -> Envelope:
        nonlocal n
        n += 1
        return make_envelope(payload, event_id=derived_id("bench", n), source=source, subject=subject, logicaltime=t)

    emit([config_event(config, event_id="cfg", logicaltime=t)])
    emit([ev(p.QueueObserved(name=f"q{i}"), f"queue/q{i}") for i in range(8)])
    emit([ev(p.NodeObserved(name=f"node-{i:04d}", milli_cpu=128_000, memory_bytes=2**40, gpus=8,
                            gpu_memory_mib=81920), f"node/node-{i:04d}") for i in range(NODES)])
    cycle = 0
    running: list[tuple[int, p.PodObserved]] = []
    pod_no = 0
    while True:
        t += 5 * SEC
        batch = []
        for _ in range(BATCH):
            pod_no += 1
            gpus = (1, 1, 2, 4)[pod_no % 4]
            spec = p.PodObserved(namespace="bench", name=f"pod-{pod_no}", uid=f"u{pod_no}",
                                 queue=f"q{pod_no % 8}", podgroup=f"pg-{pod_no}", implicit_podgroup=True,
                                 requests=p.PodResources(milli_cpu=4000, memory_bytes=2**34),
                                 gpu=p.GpuRequest(whole=gpus), created_ns=t)
            batch.append(ev(spec, f"pod/bench/pod-{pod_no}"))
        emit(batch)
        cycle += 1
        started = ev(p.CycleStarted(cycle=cycle, config_digest=config_digest(config)), f"cycle/{cycle}",
                     "kai-es/scheduler")
        emit([started])
        decisions = run_cycle(state, Record(state.position, started), config, packer)
        cut = state.position
        snap = cut_snapshot(state, config, decisions) if snapshot_every and on_snapshot is not None and \
            cycle % snapshot_every == 0 else None
        emit(decisions)
        if snap is not None and on_snapshot is not None:
            on_snapshot(StoredSnapshot(position=cut, completed_position=state.position, cycle=cycle,
                                       logicaltime=started.logicaltime, digest=decisions[-1].statedigest or "",
                                       data=snap))
        t += SEC
        confirmations = []
        for d in decisions:
            if isinstance(d.data, p.BindingDecided):
                confirmations.append(make_envelope(
                    p.PodBound(namespace="bench", name=d.data.name, uid=d.data.uid, node=d.data.node,
                               decision_id=d.id, gpu_devices=d.data.gpu_devices),
                    event_id=derived_id(d.id, 0), source="kai-es/binder", subject=d.subject, logicaltime=t))
        emit(confirmations)
        now_running = []
        for d in decisions:
            if isinstance(d.data, p.BindingDecided):
                pod = state.pods[f"bench/{d.data.name}"]
                spec = pod.spec
                obs = p.PodObserved(**{**{f: getattr(spec, f) for f in spec.__struct_fields__},
                                       "phase": "Running", "node_name": d.data.node,
                                       "gpu_devices": d.data.gpu_devices})
                now_running.append(ev(obs, d.subject))
                # steady state: pods run one cycle (~80% GPU load, a small backlog); overload:
                # two cycles (~120% of capacity arrives, a backlog of thousands is retried each cycle)
                running.append((cycle + (2 if overload else 1), obs))
        emit(now_running)
        done = [obs for until, obs in running if until <= cycle]
        running = [(u, o) for u, o in running if u > cycle]
        emit([ev(p.PodObserved(**{**{f: getattr(o, f) for f in o.__struct_fields__}, "phase": "Succeeded"}),
                 f"pod/bench/{o.name}") for o in done])
        yield pod_no


def generate(path: Path, target: int, overload: bool = False) -> None:
    """The benchmark log at `path`: `lifecycles` until it holds at least `target` events
    (deterministic: the same bytes every time), as a scheduler with stateDigestEvery
    `SNAPSHOT_EVERY` and ``--snapshot-every`` the same writes it, with its checkpoints
    (`adapters.file_checkpoints`, the default number kept) in ``<path>.checkpoints/``."""
    state = ClusterState()
    pos = 0
    for old in checkpoint_dir(path).glob("*.checkpoint"):  # a former generation's
        old.unlink()

    def keep(snap: StoredSnapshot) -> None:
        save_checkpoint(path, snap.position, encode_stored(snap))

    config = SchedulerConfig(state_digest_every=SNAPSHOT_EVERY)
    with open(path, "wb") as out:

        def emit(envs: list[Envelope]) -> None:
            nonlocal pos
            for env in envs:
                body = encode(env)
                out.write(frame(body))
                fold([Record(pos, decode(body))], state)
                pos += 1

        for _ in lifecycles(state, emit, config, overload=overload, snapshot_every=SNAPSHOT_EVERY, on_snapshot=keep):
            if pos >= target:
                break
    # (made even when no checkpoint was due, in a short log: its presence says this generation
    # wrote the log, see `ensure_log`)
    checkpoint_dir(path).mkdir(exist_ok=True)


def log_path(events: int, overload: bool = False) -> Path:
    """Where the generated log of about `events` events is kept."""
    return ROOT / "out" / "bench" / f"synthetic-{'overload' if overload else 'steady'}-{events}.events.jsonl"


def ensure_log(events: int, overload: bool = False, *, regenerate: bool = False) -> Path:
    """`log_path`, the log generated first when missing (or when `regenerate`); says so when it
    generates."""
    path = log_path(events, overload)
    path.parent.mkdir(parents=True, exist_ok=True)
    if regenerate or not path.exists() or not checkpoint_dir(path).is_dir():  # (older ones had none)
        t0 = time.perf_counter()
        generate(path, events, overload)
        print(f"generated {path.relative_to(ROOT)} in {time.perf_counter() - t0:.1f}s")
    return path


def fold_bodies(bodies: list[bytes]) -> ClusterState:
    """Decode and apply `bodies` (a log's, in order) into a new state: the fold the target is
    about, and what `count_cycles.py --bench fold` counts."""
    st = ClusterState()
    for i, body in enumerate(bodies):
        apply(st, Record(i, decode(body)))
    return st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--overload", action="store_true",
                    help="a cluster offered ~120%% of its capacity: thousands of pods stay pending and "
                         "are re-examined every cycle (a stress case for replay)")
    ap.add_argument("--min-events-per-s", type=float, default=None, metavar="N",
                    help="exit 1 when the fold from memory with the GC paused (best of 3) is below N "
                         "events/s (a regression guard)")
    ap.add_argument("--no-replay", action="store_true", help="skip the two `kai-es replay` runs")
    args = ap.parse_args()
    path = ensure_log(args.events, args.overload, regenerate=args.regenerate)
    log = FileEventLog(path, readonly=True)
    total = sum(1 for _ in log.scan_raw())
    size_mb = path.stat().st_size / 1e6
    kept = len(list_checkpoints(path))
    print(f"log: {total:,} events, {size_mb:.0f} MB, {kept} checkpoints beside it (one every "
          f"{SNAPSHOT_EVERY} cycles, at most {DEFAULT_KEEP} kept; none: both spread replays fold from 0)")

    t0 = time.perf_counter()
    state = fold(log.scan())
    dt = time.perf_counter() - t0
    print(f"fold from file (CRC + decode + apply): {_rate(total, dt)}")
    print(f"  state at the end: {len(state.pods):,} pods, {len(state.nodes)} nodes")
    gc.disable()
    t0 = time.perf_counter()
    fold(log.scan())
    dt = time.perf_counter() - t0
    gc.enable()
    print(f"fold from file, GC paused (as kai-es replay does): {_rate(total, dt)}")
    t0 = time.perf_counter()
    for _, body in log.scan_raw():
        decode(body)
    dt = time.perf_counter() - t0
    print(f"decode alone (CRC + decode): {total / dt:,.0f} events/s")

    bodies = [body for _, body in log.scan_raw()]
    paused_rate = 0.0
    for paused in (False, True):
        best = float("inf")
        for _ in range(3):  # best of three: this machine's run-to-run noise is large
            if paused:
                gc.disable()
            t0 = time.perf_counter()
            st = fold_bodies(bodies)
            best = min(best, time.perf_counter() - t0)
            gc.enable()
            del st
        label = "GC paused, as replay and cold start run it" if paused else "GC on"
        print(f"fold from memory (decode + apply), best of 3, {label}: {_rate(total, best)}")
        if paused:
            paused_rate = total / best
    del bodies, state

    jobs = str(default_jobs())
    runs = (("1",), (jobs, "--no-checkpoints"), (jobs,))
    for options in () if args.no_replay else runs:
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "kai_es", "replay", "--jobs", *options, str(path)],
                             capture_output=True, text=True)
        dt = time.perf_counter() - t0
        verdict = (run.stdout or run.stderr).strip().splitlines()[0]
        how = ("shares folding from 0" if "--no-checkpoints" in options else
               "later shares from checkpoints" if options[0] != "1" else "one process")
        print(f"kai-es replay --jobs {' '.join(options)} ({how}; re-fold + re-run every cycle, process start "
              f"included): {dt:.2f}s   target < {REPLAY_TARGET_S:g}s on two cores ({dt / REPLAY_TARGET_S:.2f}x it)")
        print(f"  verdict: {verdict}")

    env = make_envelope(p.BindingDecided(namespace="default", name="train-0", uid="5b7c1a52-0f7e-4a8e-9d60-1c2b3a4d5e6f",
                                         node="node-0042", podgroup="pg-train", queue="team-a",
                                         gpu_devices=(0, 1, 2, 3)),
                        event_id=derived_id("c", 1), source="kai-es/scheduler", subject="pod/default/train-0",
                        logicaltime=START, causationid="c", correlationid="c", basedon=123456,
                        policyversion="kai-es/v1")
    n = 200_000
    per = timeit.timeit(lambda: encode(env), number=n) / n * 1e6
    print(f"canonical encode of one decision event: {per:.2f} us   target < 10 us")

    if args.min_events_per_s is not None:
        verdict = "ok" if paused_rate >= args.min_events_per_s else "FAIL"
        print(f"{verdict}: fold from memory, GC paused: {paused_rate:,.0f} events/s against the floor of "
              f"{args.min_events_per_s:,.0f} (--min-events-per-s)")
        if verdict == "FAIL":
            sys.exit(1)


if __name__ == "__main__":
    main()
