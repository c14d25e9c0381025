"""The long-running processes, each built here and nowhere else: the scheduler, the Kubernetes
informer and binder, and the simulated cluster (simulated Kubernetes + informer + binder in one
process). Every process writes to one shared log (file or Kafka).

Time. Every process uses `FlowClock`: wall time, optionally scaled (``--time-scale 60``: one
real second is one simulated minute), anchored at start to max(wall clock, the log's last
logical time), and moved forward (never back) whenever the process reads a later logical time
from the log — a Lamport clock. So logical time never goes below the log's, survives restarts,
and the processes' clocks converge to the fastest one. The informer does not otherwise read
the log: it looks at its last records every `CLOCK_POLL_S` only to observe their times.

Writers. Before reading, every writing process claims its writer role on the log
(`EventLog.claim_writer`: on Kafka, InitProducerId with the role's transactional id, which fences
an older instance and settles a transaction of ours in flight).

The simulated cluster after a restart. It lives in its process, so a restart loses it; it is
REBUILT from the log (`rebuild_cluster`): the scenario is re-anchored at t0 = the logical time
of the informer's first ResyncStarted (the cluster's birth), then every outcome the binder
recorded is re-applied at its own logical time (advance the cluster to it, bind/evict). The
simulated cluster is deterministic given the times of its binds and evictions, and the live
loop performs every bind at exactly the logical time its outcome records, so the rebuilt
cluster equals the lost one except for binds whose outcomes never reached the log — those are
performed again. Then the informer relists (resync), which removes pods that finished while
nobody was watching.

Errors. Any error other than fencing ends the "session": the process claims its writer role
again, re-reads the log and continues (the simulated cluster is rebuilt). A FencedError stops
the process (exit 2, one line): the one an append raises, or the one `EventLog.check_writer`
raises, which every process calls every `WRITER_CHECK_S` seconds (`while_writer`), so an idle
instance that another took over stops too instead of believing itself the writer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio

from kai_es.adapters.clock import FlowClock, FrozenClock
from kai_es.adapters.file_checkpoints import DEFAULT_KEEP
from kai_es.adapters.file_snapshots import FileBlobStore, FileSnapshotStore
from kai_es.adapters.ids import RandomIds
from kai_es.adapters.kafka_tenure import WriterTenure
from kai_es.adapters.scheduler_metrics import SchedulerMetrics
from kai_es.adapters.status_http import HEARTBEAT_S, MeteredLog, ProcessStatus
from kai_es.app import bulk_fold, freeze_long_lived, open_log
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.shards import ShardMap, shard_log_url, shard_writer
from kai_es.ports import ActionOutcome, BlobStore, EventLog, SetupError, SnapshotStore
from kai_es.scenario import Scenario
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import Packer
from kai_es.services.binder import SOURCE as BINDER_SOURCE
from kai_es.services.binder import BinderService
from kai_es.services.informer import SOURCE as INFORMER_SOURCE
from kai_es.services.informer import InformerService
from kai_es.services.scheduler import SchedulerService
from kai_es.services.snapshotting import restore_validated
from kai_es.sim.cluster import SimCluster
from kai_es.state import ClusterState
from kai_es.state.reducer import apply

if TYPE_CHECKING:
    from kai_es.adapters.kubernetes.leader import LeaseTimes

log = logging.getLogger(__name__)

SCHEDULER_TXN_ID = "kai-es-scheduler"
BINDER_TXN_ID = "kai-es-binder"
INFORMER_TXN_ID = "kai-es-informer"
#: binds and evictions the Kubernetes binder has in flight at once
KUBE_BINDER_CONCURRENCY = 32
#: seconds between checks that a process with nothing to append is still its log's writer
WRITER_CHECK_S = 5.0
Ready = Callable[[str], None]


# -- shared ---------------------------------------------------------------------------------------


def is_kafka_url(url: str) -> bool:
    return url.startswith("kafka://")


def snapshot_store(url: str, events: EventLog, checkpoints: int = DEFAULT_KEEP) -> SnapshotStore | None:
    """Where the scheduler keeps snapshots for the log at `url` (None: a memory log), each also
    kept as one of up to `checkpoints` checkpoints for replays (0: none)."""
    if is_kafka_url(url):
        from kai_es.adapters.kafka_checkpoints import KafkaCheckpointStore  # noqa: PLC0415
        from kai_es.adapters.kafka_snapshots import KafkaSnapshotStore  # noqa: PLC0415

        kept = KafkaCheckpointStore.for_events(events, keep=checkpoints) if checkpoints > 0 else None
        return KafkaSnapshotStore.for_log(events, checkpoints=kept)
    if url == "memory:":
        return None
    return FileSnapshotStore.for_log(url, checkpoints=checkpoints)


def progress_store(url: str, events: EventLog) -> BlobStore | None:
    """Where the binder keeps its progress for the log at `url` (None: a memory log)."""
    if is_kafka_url(url):
        from kai_es.adapters.kafka_snapshots import KafkaBlobStore  # noqa: PLC0415

        return KafkaBlobStore.for_log(events, key="binder")
    if url == "memory:":
        return None
    return FileBlobStore.for_log(url, suffix="binder-progress")


async def read_all(events: EventLog, from_position: int = 0) -> list[Record]:
    return [r async for r in events.read(from_position)]


async def last_logicaltime(events: EventLog, *, tail: int = 4096) -> int:
    """The largest logical time among the log's last records (0 for an empty log): positions
    are not dense, so this reads from `tail` positions before the end."""
    end = await events.end_position()
    latest = 0
    async for record in events.read(max(0, end - tail)):
        latest = max(latest, record.envelope.logicaltime)
    return latest


def fenced_error_types() -> tuple[type[BaseException], ...]:
    try:
        from kai_es.adapters.kafka_log import FencedError  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        return ()
    return (FencedError,)


def _stopping_cause(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The error of one of `kinds` that `exc` is or holds (a task group wraps its tasks' errors
    in an ExceptionGroup), or None."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _stopping_cause(inner, kinds)
            if found is not None:
                return found
    return None


def described(exc: BaseException) -> str:
    """`Type: message` of `exc` and of each error it was raised from (`from` or during the
    handling of), outermost first: a library that wraps an error keeps its cause in view."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
    return " <- ".join(parts)


async def supervise(name: str, session: Callable[[], Awaitable[None]], *,
                    max_failures: int = 60, backoff_s: float = 0.5,
                    on_restart: Callable[[BaseException], None] | None = None) -> None:
    """Run `session` again after any error but fencing and `SetupError`, which propagate —
    unwrapped from the ExceptionGroup of a task group that carries one: a fenced process that
    claimed its role again would fence the instance that took over. `on_restart` hears of each
    error that starts a session again."""
    stopping = (*fenced_error_types(), SetupError)
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await session()
            return
        except Exception as exc:  # noqa: BLE001 - the supervisor's whole point
            cause = _stopping_cause(exc, stopping)
            if cause is not None:
                if cause is exc:
                    raise
                raise cause from cause.__cause__  # unwrapped, its own cause kept
            if time.monotonic() - started > 30:
                failures = 0
            failures += 1
            if failures > max_failures:
                raise
            log.warning("%s: %s; starting again in %.1f s (attempt %d)", name,
                        described(exc), backoff_s, failures)
            if on_restart is not None:
                on_restart(exc)
            await anyio.sleep(backoff_s)
            backoff_s = min(backoff_s * 1.5, 3.0)


async def alongside(work: Awaitable[None], *helpers: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Await `work` with `helpers` running beside it until it ends (then they are cancelled).
    An error of `work`, or of a helper (which ends `work`), propagates as itself — not wrapped
    in the ExceptionGroup of the task group that runs them, which `supervise` and the CLI would
    not recognise."""
    try:
        async with anyio.create_task_group() as tg:
            for helper in helpers:
                tg.start_soon(helper)
            await work
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            inner = group.exceptions[0]
            raise inner from inner.__cause__  # unwrapped, its own cause kept
        raise


async def while_writer(events: EventLog | Sequence[EventLog], work: Awaitable[None], *,
                       every_s: float = WRITER_CHECK_S) -> None:
    """Await `work` while checking every `every_s` seconds that this process is still the log's
    (each log's) writer (`EventLog.check_writer`): a fenced process stops even when it has
    nothing to append. Fencing ends `work` and propagates; a check that fails otherwise (the log
    briefly unreachable) is logged and tried again at the next period — `work` meets such errors
    itself."""
    fenced = fenced_error_types()
    logs = list(events) if isinstance(events, Sequence) else [events]

    async def watch() -> None:
        while True:
            await anyio.sleep(every_s)
            try:
                for one in logs:
                    await one.check_writer()
            except fenced:
                raise
            except Exception as exc:  # noqa: BLE001 - a probe failing is not the process failing
                log.warning("checking the writer role failed: %s: %s", type(exc).__name__, exc)

    await alongside(work, watch)


def announcing(on_ready: Ready | None, status: ProcessStatus | None) -> Ready | None:
    """`on_ready`, also marking `status` ready (each session announces itself once)."""
    if status is None:
        return on_ready

    def ready(line: str) -> None:
        status.set_ready(True)
        if on_ready is not None:
            on_ready(line)

    return ready


def underlying(events: EventLog) -> EventLog:
    """The log itself under a `MeteredLog` (a side store is built from the log's address)."""
    return events.inner if isinstance(events, MeteredLog) else events


class _Closable(Protocol):
    async def close(self) -> None: ...


S = TypeVar("S", bound=_Closable)


async def _serve(name: str, url: str, writer: str, body: Callable[[EventLog, S | None], Awaitable[None]],
                 side_store: Callable[[str, EventLog], S | None] | None = None, *,
                 status: ProcessStatus | None = None, election: LeaderElection | None = None) -> None:
    """Supervised sessions of `body` (see `supervise`): each opens the log at `url` as `writer`,
    claims the role, opens the side store (snapshots, progress) if any, runs `body` (checking
    the writer role all along: `while_writer`), and always closes both. With `status`, the log
    is metered (`MeteredLog`), the session is not ready until `body` announces it, a restart is
    counted, and the event loop beats for /healthz. With `election`, all of it waits until
    this replica leads (`_leading`)."""

    tenure = WriterTenure()  # the role's writer identity, across this process's sessions

    async def session() -> None:
        raw = open_log(url, writer=writer, tenure=tenure)
        events: EventLog = MeteredLog(raw, status) if status is not None else raw
        store: S | None = None
        if status is not None:
            status.set_ready(False, f"{name} starting: claiming its writer role, reading the log")
        try:
            await events.claim_writer()
            store = side_store(url, raw) if side_store is not None else None
            await while_writer(events, body(events, store))
        finally:
            with anyio.CancelScope(shield=True):
                if store is not None:
                    await store.close()
                await events.close()

    def restarting(exc: BaseException) -> None:
        if status is not None:
            status.restarts.inc()
            status.set_ready(False, f"{name} starting again after {type(exc).__name__}: {exc}")

    async def supervised() -> None:
        await supervise(name, session, on_restart=restarting)

    async def heartbeat() -> None:
        assert status is not None
        while True:
            status.beat()
            await anyio.sleep(HEARTBEAT_S)

    main = supervised() if election is None else _leading(election, name, supervised, status)
    if status is None:
        await main
    else:
        await alongside(main, heartbeat)


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """`--leader-elect`: replicas of one process stand by until they hold the Lease
    `namespace/name` (`kai_es.adapters.kubernetes.leader`)."""

    namespace: str
    name: str
    identity: str
    times: LeaseTimes
    kubeconfig: str | None = None


async def _leading(election: LeaderElection, name: str, work: Callable[[], Awaitable[None]],
                   status: ProcessStatus | None) -> None:
    """Stand by until this replica holds the election's Lease, then run `work` while renewing
    it; losing it raises `LeadershipLost` (the process stops; its restart stands by). A clean
    end hands the Lease back."""
    from kai_es.adapters.kubernetes.client import api_client  # noqa: PLC0415
    from kai_es.adapters.kubernetes.leader import LeaseElector  # noqa: PLC0415

    async with await api_client(election.kubeconfig) as api:
        elector = LeaseElector(api, election.namespace, election.name, election.identity, election.times)

        def standing_by(holder: str) -> None:
            log.warning("%s: standing by: Lease %s is held by %s", name, elector.lease, holder)
            if status is not None:
                status.set_ready(True, f"standing by: Lease {elector.lease} is held by {holder}")

        if status is not None:
            status.set_ready(False, f"{name}: trying to acquire Lease {elector.lease}")
        await elector.acquire(standing_by)
        log.warning("%s: leading: acquired Lease %s as %s", name, elector.lease, election.identity)
        try:
            await alongside(work(), elector.hold)
        finally:
            with anyio.CancelScope(shield=True):
                await elector.release()


# -- the scheduler --------------------------------------------------------------------------------


async def run_scheduler(url: str, config: SchedulerConfig, packer: Packer, *, time_scale: float = 1.0,
                        period_s: float = 1.0, snapshot_every: int = 0, checkpoints: int = DEFAULT_KEEP,
                        cycles: int | None = None, writer: str = SCHEDULER_TXN_ID, on_ready: Ready | None = None,
                        status: ProcessStatus | None = None,
                        election: LeaderElection | None = None) -> None:
    """`kai-es scheduler`: fold the log (from a valid snapshot), then `SchedulerService.run`."""
    clock = FlowClock(time_scale)
    ready = announcing(on_ready, status)

    # one for the process: a registry takes each metric once, and the next session of `_serve`
    # (after the log's connection failed) must count on from where this one stopped
    metrics = SchedulerMetrics(status.registry, status=status) if status is not None else None

    async def body(events: EventLog, store: SnapshotStore | None) -> None:
        t = time.monotonic()
        sched = SchedulerService(events, config, packer, clock, RandomIds(), snapshots=store,
                                 snapshot_every=snapshot_every, observer=metrics)
        with bulk_fold(keep=True):  # (frozen before the collector resumes: else its first pass walks it all)
            await sched.restore_snapshot()
            restored = sched.snapshot_restored
            await sched.catch_up()
        clock.observe(sched.state.logicaltime)
        await sched.start()
        freeze_long_lived()
        if ready is not None:
            src = f"snapshot at {restored} + tail" if restored is not None else "full fold"
            ready(f"scheduler ready in {time.monotonic() - t:.2f} s ({src}): position "
                     f"{sched.state.position}, {sched.state.records} records, cycle {sched.state.cycle}")
        await sched.run(int(period_s * time_scale * 1e9),
                        cycles=None if cycles is None else sched.cycles_run + cycles)

    def stores(url: str, events: EventLog) -> SnapshotStore | None:
        return snapshot_store(url, events, checkpoints) if snapshot_every > 0 else None

    await _serve("scheduler", url, writer, body, stores, status=status, election=election)


# -- the Kubernetes informer and binder ------------------------------------------------------------


#: how often the informer looks at the log's tail for its clock, and how many records it reads
CLOCK_POLL_S = 0.25
CLOCK_TAIL = 16


async def _follow_times(url: str, clock: FlowClock, *, poll_s: float = CLOCK_POLL_S,
                        tail: int = CLOCK_TAIL) -> None:
    """Keep `clock` at or past the log's logical time: every `poll_s`, when the log grew,
    observe the logical times of its last `tail` records. The work is bounded whatever the
    append rate (decoding every record others append cost the informer a fifth of its CPU);
    the other writers' clocks are wall clocks too, so one running ahead is caught within a poll
    whenever it is among the last records, and the fold takes the largest logical time anyway."""
    events = open_log(url, readonly=True)
    try:
        seen = await events.end_position()
        while True:
            await anyio.sleep(poll_s)
            end = await events.end_position()
            if end <= seen:
                continue
            async for record in events.read(max(seen, end - tail)):
                if record.position >= end:
                    break
                clock.observe(record.envelope.logicaltime)
            seen = end
    finally:
        with anyio.CancelScope(shield=True):
            await events.close()


async def run_informer(url: str, kubeconfig: str | None, *, writer: str = INFORMER_TXN_ID,
                       on_ready: Ready | None = None, status: ProcessStatus | None = None,
                       election: LeaderElection | None = None,
                       config: SchedulerConfig | None = None, shards: ShardMap | None = None) -> None:
    """`kai-es informer`: list + watch the cluster (`KubernetesSource`; pods without a PodGroup
    grouped as KAI's podgrouper does, `PodGroupingSource`, with `config`'s no-code grouping
    rules), append what changed. With `shards`, into each shard's log (`shard_log_url` of
    `url`), each written with its own writer id (`shard_writer`)."""
    from kai_es.adapters.kubernetes.client import api_client  # noqa: PLC0415
    from kai_es.adapters.kubernetes.grouping import PodGroupingSource  # noqa: PLC0415
    from kai_es.adapters.kubernetes.source import INFORMER_KINDS, KubernetesSource  # noqa: PLC0415

    clock = FlowClock(1.0)
    ready = announcing(on_ready, status)
    home = shards.home.name if shards is not None else None
    urls = {name: shard_log_url(url, name) for name in shards.names} if shards is not None else {}
    tenures: dict[str, WriterTenure] = {}  # each shard's writer identity, across sessions

    async def body(events: EventLog, _: _Closable | None) -> None:
        logs: dict[str, EventLog] = {}
        try:
            if shards is not None:
                assert home is not None
                for name in shards.names:
                    if name == home:
                        logs[name] = events
                        continue
                    raw = open_log(urls[name], writer=shard_writer(writer, name),
                                   tenure=tenures.setdefault(name, WriterTenure()))
                    logs[name] = MeteredLog(raw, status) if status is not None else raw
                    await logs[name].claim_writer()
            for shard_log in (logs.values() if logs else (events,)):
                clock.observe(await last_logicaltime(shard_log))
            async with await api_client(kubeconfig) as api:
                rules = config.grouping if config is not None else ()
                ours = config.scheduler_name if config is not None else SCHEDULER_NAME
                informer = InformerService(logs if shards is not None else events,
                                           PodGroupingSource(KubernetesSource(api, kinds=INFORMER_KINDS), api,
                                                             rules=rules, ours=ours),
                                           clock, RandomIds(), ours=ours, shards=shards)
                t = time.monotonic()
                appended = await informer.resync()
                # what start-up made (modules, the relist's state) lives as long as the process:
                # out of the collector's sight, a full collection scans only what came since
                # (one cost the informer ~0.1 ms per pod of a burst)
                freeze_long_lived()
                if ready is not None:
                    where = f" into {len(logs)} shards' logs" if shards is not None else ""
                    ready(f"informer ready in {time.monotonic() - t:.2f} s: relisted {appended} events{where}")
                async with anyio.create_task_group() as tg:
                    for shard_url in (urls.values() if urls else (url,)):
                        tg.start_soon(_follow_times, shard_url, clock)
                    others = [log for name, log in logs.items() if name != home]
                    await while_writer(others, informer.follow()) if others else await informer.follow()
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                for name, shard_log in logs.items():
                    if name != home:
                        await shard_log.close()

    await _serve("informer", urls[home] if home is not None else url, shard_writer(writer, home), body,
                 status=status, election=election)


async def _state_before(url: str, events: EventLog, position: int) -> ClusterState | None:
    """A whole state for a follower that will read the log from `position`: the scheduler's
    newest valid snapshot, plus the records between it and `position` when it is older (a newer
    one already holds the first records the follower reads: it skips them); None when there is
    no valid snapshot."""
    store = snapshot_store(url, events)
    if store is None:
        return None
    try:
        state = await restore_validated(store, events)
    finally:
        await store.close()
    if state is None or state.position >= position - 1:
        return state
    with bulk_fold():
        async for record in events.read(state.position + 1):
            if record.position >= position:
                break
            apply(state, record)
    return state


async def run_binder(url: str, kubeconfig: str | None, *, writer: str = BINDER_TXN_ID,
                     poll_s: float = 0.05, concurrency: int = KUBE_BINDER_CONCURRENCY,
                     scheduled_events: bool = False, reservation_image: str | None = None,
                     wait_for_device_index_s: float | None = None,
                     on_ready: Ready | None = None, status: ProcessStatus | None = None,
                     election: LeaderElection | None = None) -> None:
    """`kai-es binder --kubeconfig`: perform the log's decisions through the Kubernetes API
    (`KubernetesActuator`, shared GPUs prepared by `GpuSharing`), append their outcomes, keep
    its progress durably; its followers release GPU reservations (`ReservationKeeper`) and
    write status back to Kubernetes (`StatusWriter`)."""
    from kai_es.adapters.kubernetes.actuator import KubernetesActuator  # noqa: PLC0415
    from kai_es.adapters.kubernetes.client import api_client  # noqa: PLC0415
    from kai_es.adapters.kubernetes.gpushare import GpuSharing  # noqa: PLC0415
    from kai_es.adapters.kubernetes.reservations import ReservationKeeper  # noqa: PLC0415
    from kai_es.adapters.kubernetes.status import StatusWriter  # noqa: PLC0415

    clock = FlowClock(1.0)
    ready = announcing(on_ready, status)

    async def body(events: EventLog, store: BlobStore | None) -> None:
        clock.observe(await last_logicaltime(events))
        async with await api_client(kubeconfig) as api:
            sharing = (GpuSharing(api, image=reservation_image, wait_for_index_s=wait_for_device_index_s)
                       if reservation_image else GpuSharing(api, wait_for_index_s=wait_for_device_index_s))
            # Scheduled Events are off by default: one more API write per bound pod took the
            # 4,000-pod e2e bench from 1.18x to 1.66x the control plane's floor
            binder = BinderService(events, KubernetesActuator(api, gpu_sharing=sharing), clock,
                                   concurrency=concurrency, progress=store)
            t = time.monotonic()
            await binder.restore()
            # Queue status needs the whole state: a binder resumed from its saved progress starts
            # its status writer from the scheduler's newest valid snapshot and the records up to
            # the resume point (without one, Queue status waits for a binder that reads from 0)
            initial = (await _state_before(url, underlying(events), binder.resumed_from)
                       if binder.resumed_from is not None else None)
            binder.followers = (ReservationKeeper(sharing),
                                StatusWriter(api, scheduled_events=scheduled_events, initial=initial))
            await binder.poll()
            if ready is not None:
                start = (f"saved progress, from position {binder.resumed_from}"
                         if binder.resumed_from is not None else "the log's start")
                ready(f"binder ready in {time.monotonic() - t:.2f} s ({start}): "
                         f"{len(binder.pending)} decisions to perform")
            await binder.run(int(poll_s * 1e9))

    await _serve("binder", url, writer, body, progress_store, status=status, election=election)


# -- the simulated cluster (simulated Kubernetes + informer + binder) --------------------------------


class CountingActuator:
    """The SimCluster as the binder's actuator, counting what a double bind would look like."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.binds = 0
        self.already = 0
        self.refused_other_node = 0
        self.failed = 0
        self.evictions = 0

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Any, gpu_groups: Any) -> ActionOutcome:
        out = await self.cluster.bind(namespace, name, uid, node, gpu_devices, gpu_groups)
        if out.ok and out.already:
            self.already += 1
        elif out.ok:
            self.binds += 1
        else:
            self.failed += 1
            if "already bound" in out.message:
                self.refused_other_node += 1
        return out

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        self.evictions += 1
        return await self.cluster.evict(namespace, name, uid)

    def stats(self) -> dict[str, int]:
        return {"binds": self.binds, "already": self.already, "failed": self.failed,
                "refusedOtherNode": self.refused_other_node, "evictions": self.evictions}


def cluster_birth(records: list[Record]) -> int | None:
    """Logical time of the simulated cluster's first relist (None: it never started)."""
    for record in records:
        env = record.envelope
        if env.source == INFORMER_SOURCE and isinstance(env.data, p.ResyncStarted):
            return env.logicaltime
    return None


async def rebuild_cluster(scenario: Scenario, records: list[Record], t0: int) -> tuple[SimCluster, int]:
    """The simulated cluster as the binder's recorded outcomes left it (see module docstring).
    Returns it and how many recorded binds were re-applied."""
    cluster = SimCluster(replace(scenario, start_ns=t0), t0)
    groups: dict[str, list[str]] = {}  # PodBound does not repeat the decision's GPU groups
    applied = 0
    for record in records:
        env = record.envelope
        data = env.data
        if isinstance(data, p.BindingDecided):
            if data.gpu_groups:
                groups[env.id] = list(data.gpu_groups)
            continue
        if env.source != BINDER_SOURCE:
            continue
        if isinstance(data, p.PodBound):
            cluster.advance(max(env.logicaltime, cluster.now_ns))
            out = await cluster.bind(data.namespace, data.name, data.uid, data.node,
                                     data.gpu_devices, groups.get(data.decision_id, []))
            if not out.ok or out.already:
                log.warning("rebuilding the cluster: recorded bind of %s/%s to %s at position %d "
                            "does not re-apply: %s", data.namespace, data.name, data.node,
                            record.position, out.message or "already bound")
            applied += 1
        elif isinstance(data, p.PodEvicted):
            cluster.advance(max(env.logicaltime, cluster.now_ns))
            await cluster.evict(data.namespace, data.name, data.uid)
    cluster.drain_changes()
    return cluster, applied


class StatsFile:
    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._last: dict[str, Any] | None = None

    def write(self, stats: dict[str, Any]) -> None:
        if self.path is None or stats == self._last:
            return
        self._last = dict(stats)
        with open(self.path, "a") as f:
            f.write(json.dumps(stats, sort_keys=True) + "\n")


async def sim_cluster_session(events: EventLog, scenario: Scenario, clock: FlowClock, *,
                              poll_s: float = 0.05, stats: StatsFile | None = None,
                              on_ready: Ready | None = None) -> None:
    """One session of the simulated cluster over a claimed log (see the module docstring)."""
    t_start = time.monotonic()
    records = await read_all(events)
    if records:
        clock.observe(max(r.envelope.logicaltime for r in records))
    t0 = cluster_birth(records)
    fresh = t0 is None
    if t0 is None:
        t0 = clock.now_ns()
    cluster, reapplied = await rebuild_cluster(scenario, records, t0)
    actuator = CountingActuator(cluster)
    frozen = FrozenClock(clock.now_ns())
    binder = BinderService(events, actuator, frozen)
    for record in records:
        binder.observe(record)
    del records
    now = clock.now_ns()
    frozen.ns = now
    cluster.advance(now)
    cluster.drain_changes()
    informer = InformerService(events, cluster, frozen, RandomIds(), ours=scenario.config.scheduler_name)
    await informer.resync()
    if on_ready is not None:
        on_ready(f"binder ready in {time.monotonic() - t_start:.2f} s: "
                 f"{'new simulated cluster' if fresh else f'cluster rebuilt ({reapplied} binds re-applied)'}"
                 f", {len(cluster.pods)} pods, {len(binder.pending)} decisions to perform")
    pid = os.getpid()

    def record_stats() -> None:
        if stats is not None:
            stats.write({"pid": pid, **actuator.stats(), "performed": binder.performed})

    while True:
        now = clock.now_ns()
        frozen.ns = now
        cluster.advance(now)
        await informer.pump(cluster.drain_changes())
        await binder.poll()
        if binder.pending:
            clock.observe(max(r.envelope.logicaltime for r in binder.pending.values()))
            now = clock.now_ns()
            frozen.ns = now
            cluster.advance(now)
            await informer.pump(cluster.drain_changes())
            await binder.perform_batch()
            await informer.pump(cluster.drain_changes())
            record_stats()
        nxt = cluster.next_event_ns()
        delay = poll_s
        if nxt is not None:
            delay = min(delay, clock.wall_seconds(nxt - clock.now_ns()))
        await anyio.sleep(max(delay, 0.005))


async def run_sim_cluster(url: str, scenario: Scenario, *, time_scale: float = 1.0,
                          poll_s: float = 0.05, stats_path: str | None = None,
                          writer: str = BINDER_TXN_ID, on_ready: Ready | None = None,
                          status: ProcessStatus | None = None) -> None:
    """`kai-es binder --scenario`: the simulated cluster, its informer and the binder."""
    clock = FlowClock(time_scale)
    stats = StatsFile(stats_path)
    ready = announcing(on_ready, status)

    async def body(events: EventLog, _: _Closable | None) -> None:
        await sim_cluster_session(events, scenario, clock, poll_s=poll_s, stats=stats,
                                  on_ready=ready)

    await _serve("binder", url, writer, body, status=status)


def describe_dead_letters(dead_letters: list[Any]) -> list[str]:
    """One line per record a reader skipped (`KafkaEventLog.dead_letters`)."""
    return [f"dead-lettered: offset {d.offset} ({d.reason})" for d in dead_letters]


def dead_letter_report(url: str) -> str:
    """Read the whole log at `url` and name every record that was skipped as undecodable."""
    events = open_log(url, readonly=True)

    async def go() -> None:
        try:
            async for _ in events.read(0):
                pass
        finally:
            await events.close()

    anyio.run(go)
    lines = describe_dead_letters(list(getattr(events, "dead_letters", [])))
    return "\n".join(lines) if lines else "no dead letters"
