"""Replay of a log spread over processes (`kai-es replay --jobs N`): a file log, or a Kafka log.

Why processes: folding and re-running cycles are CPU-bound Python, so threads would share one
core. A share re-runs the cycles of its own stretch and stops reading once they are all
complete; the last share runs in this process and reads to the end. A cycle needs the state at
its cut, which a share gets in one of two ways:

- From a checkpoint (`adapters.file_checkpoints`: past snapshots the scheduler kept beside the
  log). Shares of about equal length then start at the checkpoints nearest the even cuts, so
  the work spreads evenly over any number of processes. A share checks its checkpoint against
  the log before it trusts it (`services.snapshotting.validated`: the restored state has
  the digest the log's CycleCompleted records there), and the share before it checks that its
  own fold reaches that digest at the cut (`Share.stop_digest`), so every state a cycle runs
  from is one the log folds to. A checkpoint that fails its check, or a share that meets a record
  it cannot judge from there (`ReplayResult.needs_prefix`), falls back to folding from 0.
- Else by folding the log from 0: share j folds [0, s_j+1) and re-runs cycles in [s_j, s_j+1),
  and the stretches are chosen so that every process has about the same work (the earlier
  shares get longer ones).

The verdict is `kai_es.replay.merge` of the shares' results, which is the verdict one process
would reach (the tests check this on every golden log, with and without checkpoints).

A Kafka log (`replay_kafka`) has no checkpoints here (its snapshot topic keeps only the newest
snapshot): its shares fold from 0. Each share reads the topic through a reader process of its
own (`adapters.kafka_frames`): records stream through the replay instead of being collected
first, so memory does not grow with the log, and the consumer's work runs beside the fold. A
record that does not decode is skipped and dead-lettered, as every reader of a Kafka log does
(the scheduler folded the log without it).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio
import msgspec

from kai_es.adapters.file_checkpoints import list_checkpoints
from kai_es.adapters.file_log import CorruptLogError, FileEventLog
from kai_es.app import bulk_fold, packer_from_env
from kai_es.events import DecodeError, Envelope, Record, decode
from kai_es.events import payloads as p
from kai_es.replay import DECISIONS, ReplayResult, Share, merge, replay_frames
from kai_es.scheduling.packing import Packer
from kai_es.ports import StoredSnapshot
from kai_es.services.snapshotting import validated
from kai_es.state import ClusterState

if TYPE_CHECKING:  # (the Kafka backend is imported where a Kafka log is replayed: aiokafka is heavy)
    from kai_es.adapters.kafka_checkpoints import KafkaCheckpoint
    from kai_es.adapters.kafka_frames import Skipped
    from kai_es.adapters.kafka_log import KafkaEventLog

_log = logging.getLogger(__name__)

#: re-running the cycles of a stretch costs about this many times folding it, as a fraction
#: (measured on the 1,000,000-event benchmark log: ~6.9 s of cycles against ~4.6 s of folding)
CYCLE_TO_FOLD = (3, 2)
#: below this many records a second process costs more than it saves
MIN_RECORDS_PER_JOB = 20_000


class Frames(Protocol):
    """A log read by ranges: a `FileEventLog`, or a Kafka log through `kafka_frames.KafkaRange`."""

    def frames(self, start: int, end: int) -> Iterable[tuple[int, bytes | memoryview | None]]:
        """(position, body) of the records at `start` <= position < `end` (None: no body)."""

    def bodies_at(self, positions: Iterable[int]) -> Mapping[int, bytes | memoryview | None]:
        """The body of the record at each of `positions` that has one."""


class Checkpoint(Protocol):
    """A checkpoint as a replay uses it (`file_checkpoints.Checkpoint`,
    `kafka_checkpoints.KafkaCheckpoint`)."""

    @property
    def position(self) -> int: ...
    @property
    def completed_position(self) -> int: ...
    @property
    def where(self) -> str: ...
    def load(self) -> StoredSnapshot: ...


C = TypeVar("C", bound=Checkpoint)


def default_jobs() -> int:
    """The CPUs this process may run on (at most 8: each share re-folds a prefix of the log)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def plan_shares(end: int, jobs: int, ratio: tuple[int, int] = CYCLE_TO_FOLD,
                min_records: int = MIN_RECORDS_PER_JOB) -> list[Share]:
    """`jobs` consecutive shares of positions [0, end) that take about equal time when a share's
    time is fold(prefix up to its stop) + ratio * (its own stretch); fewer when a share would
    get under `min_records` records."""
    jobs = max(1, min(jobs, end // max(1, min_records)))
    if jobs == 1:
        return [Share()]
    num, den = ratio

    def bounds(budget: int) -> list[int]:
        # share j's stop s' solves s' * den + (s' - s) * num = budget (in units of 1/den records)
        out, s = [0], 0
        for _ in range(jobs):
            s = (budget + num * s) // (den + num)
            out.append(s)
        return out

    lo, hi = 0, end * (num + den)
    while lo < hi:  # the smallest budget whose last stop reaches the end
        mid = (lo + hi) // 2
        if bounds(mid)[-1] >= end:
            hi = mid
        else:
            lo = mid + 1
    starts = sorted(set(bounds(lo)[:jobs]))  # an empty stretch is no share
    return [Share(start, stop) for start, stop in zip(starts, [*starts[1:], None])]


def plan_checkpointed(log: Frames, end: int, jobs: int, checkpoints: Sequence[C],
                      min_records: int = MIN_RECORDS_PER_JOB, ratio: tuple[int, int] = CYCLE_TO_FOLD
                      ) -> list[tuple[Share, C | None]]:
    """The shares of a replay of positions [0, end) over up to `jobs` processes, each with the
    checkpoint it starts from (None: it folds from 0). A share's time is taken as fold + `ratio`
    x re-run of what it reads: from checkpoints, the cuts are the ones that make the longest
    share shortest (among the checkpoints whose cycle's CycleCompleted in the log records a
    digest, the next share's `stop_digest` then); they are used when that longest share costs
    less than the costliest of `plan_shares`, which fold from 0."""
    jobs = max(1, min(jobs, end // max(1, min_records)))
    refold = plan_shares(end, jobs, ratio, min_records)
    plain: list[tuple[Share, C | None]] = [(share, None) for share in refold]
    if jobs == 1:
        return plain
    candidates = [cp for cp in checkpoints if 0 < cp.position < cp.completed_position < end]
    completed = _records_at(log, [cp.completed_position for cp in candidates])  # (one read for all)
    by_position: dict[int, tuple[C, str]] = {}
    for cp in candidates:
        if cp.position not in by_position:
            digest = _recorded_digest(completed.get(cp.completed_position), cp)
            if digest is not None:
                by_position[cp.position] = (cp, digest)
    cuts = even_cuts(sorted(by_position), end, jobs)
    num, den = ratio
    longest = max(b - a for a, b in zip([0, *cuts], [*cuts, end]))
    costliest = max((share.stop or end) * den + ((share.stop or end) - share.start) * num for share in refold)
    if not cuts or longest * (num + den) >= costliest:
        return plain
    starts = [0, *cuts]
    stops: list[int | None] = [*cuts, None]
    return [(Share(start, stop, stop_digest=by_position[stop][1] if stop is not None else None),
             by_position[start][0] if start else None) for start, stop in zip(starts, stops)]


def even_cuts(positions: list[int], end: int, jobs: int) -> list[int]:
    """Up to `jobs` - 1 of the sorted `positions` (0 < each < end) that cut [0, end) into
    stretches whose longest is the shortest possible (the least such length, found by bisection,
    each cut then the furthest one within that length of the previous)."""

    def cuts_within(length: int) -> list[int] | None:
        out: list[int] = []
        at, k = 0, 0
        while end - at > length:
            best = None
            while k < len(positions) and positions[k] <= at + length:
                best = positions[k]
                k += 1
            if best is None or len(out) == jobs - 1:
                return None
            out.append(best)
            at = best
        return out

    lo, hi = 1, end
    while lo < hi:
        mid = (lo + hi) // 2
        if cuts_within(mid) is not None:
            hi = mid
        else:
            lo = mid + 1
    return cuts_within(lo) or []


def _records_at(log: Frames, positions: Iterable[int]) -> dict[int, Envelope]:
    """The events at `positions` that exist and decode."""
    found = {}
    for position, body in log.bodies_at(positions).items():
        try:
            found[position] = decode(body)
        except DecodeError:
            continue
    return found


def _record_at(log: Frames, position: int) -> Envelope | None:
    """The event at `position` (None: there is none, or it does not decode)."""
    return _records_at(log, [position]).get(position)


def _recorded_digest(env: Envelope | None, cp: Checkpoint) -> str | None:
    """The state digest the CycleCompleted of `cp`'s cycle, `env` (the log's record at
    `cp.completed_position`), records (None: it is no CycleCompleted based on `cp`'s cut, or
    records none)."""
    if env is not None and isinstance(env.data, p.CycleCompleted) and env.basedon == cp.position:
        return env.statedigest or None
    return None


def _restored(log: Frames, cp: Checkpoint) -> ClusterState | None:
    """`cp`'s state if it passes the checks a restarting scheduler makes against the log
    (`snapshotting.validated`, which warns why not); else None."""
    try:
        snap = cp.load()
    except (OSError, ValueError) as exc:
        _log.warning("checkpoint %s not used: %s; folding the log from the beginning", cp.where, exc)
        return None
    if snap.position != cp.position:
        _log.warning("checkpoint %s not used: it holds position %d", cp.where, snap.position)
        return None
    return validated(snap, _record_at(log, snap.completed_position))


def _decisions_before(log: Frames, start: int, ids: set[str]) -> dict[str, Record]:
    """The last decision record (BindingDecided, EvictionDecided) with each of `ids` as its
    event id before position `start`, read backwards in growing windows; only bodies holding
    the id are decoded."""
    wanted = {id_: b'"id":' + msgspec.json.encode(id_) for id_ in ids}
    found: dict[str, Record] = {}
    hi, window = start, 1024
    while wanted and hi > 0:
        lo = max(0, hi - window)
        hits: dict[str, Record] = {}
        for position, view in log.frames(lo, hi):
            body = bytes(view) if view is not None else b""
            for id_, needle in wanted.items():
                if needle in body:
                    try:
                        env = decode(body)
                    except DecodeError:  # (a record every reader skips: no decision)
                        break
                    if env.id == id_ and isinstance(env.data, DECISIONS):
                        hits[id_] = Record(position, env)
        for id_, record in hits.items():
            del wanted[id_]
            found[id_] = record
        hi, window = lo, window * 2
    return found


def _run_share(log: Frames, end: int, share: Share, packer: Packer, checkpoint: Checkpoint | None,
               progress: Callable[[int], None] | None = None,
               undecodable: Callable[[int, bytes | memoryview | None, str], None] | None = None) -> ReplayResult:
    """One share's result: from `checkpoint` when it is valid and the share can be judged from
    there, else folding from 0 (`undecodable`: as `replay_frames`)."""
    if checkpoint is not None:
        state = _restored(log, checkpoint)
        if state is not None:
            result = replay_frames(log.frames(share.start, end), packer, share=share, progress=progress,
                                   resume=state, lookup=lambda ids: _decisions_before(log, share.start, ids),
                                   undecodable=undecodable)
            if not result.needs_prefix:
                return result
            _log.warning("the share from checkpoint %s met a record it cannot judge from there (one "
                         "based on a cycle before it); folding the log from the beginning", checkpoint.where)
    return replay_frames(log.frames(0, end), packer, share=share, progress=progress, undecodable=undecodable)


#: a worker's folded states, kept until the worker process ends (`_replay_share`)
_KEPT: list[ClusterState] = []
#: the log a replay opened, by key, for the workers it forks: a file's index (a scan of the
#: whole file, 0.2 s for 1,000,000 records) and read-only map are theirs without a second scan,
#: and a Kafka log's clients and security settings, which do not pickle, are theirs as they are
_OPENED: dict[str, Frames] = {}


def _skipping(skipped: list[Skipped]) -> Callable[[int, bytes | memoryview | None, str], None]:
    """A `replay_frames` `undecodable` that records each record it is given in `skipped`."""

    def undecodable(position: int, body: bytes | memoryview | None, reason: str) -> None:
        skipped.append((position, None if body is None else bytes(body), reason))

    return undecodable


def _replay_share(key: str, end: int, share: Share, packer_kind: str | None, checkpoint: Checkpoint | None,
                  skips: bool) -> tuple[ReplayResult, list[Skipped]]:
    """One share's result and the records it skipped (`skips`: undecodable ones are skipped, as
    on Kafka, else they raise), in a worker process that does nothing else before it ends; the
    log is the one registered under `key`, else (a spawned worker) the file at `key`. Its state
    stays in the process (the digest travels) and is neither freed nor scanned by a collection
    (`bulk_fold(keep=True)`): the worker ends with `os._exit`, and freeing ~1 GB of objects one
    by one would only delay the result the replay waits for."""
    skipped: list[Skipped] = []
    try:
        log = _OPENED.get(key) or FileEventLog(Path(key), readonly=True)
        with bulk_fold(keep=True):
            result = _run_share(log, end, share, packer_from_env(packer_kind), checkpoint,
                                undecodable=_skipping(skipped) if skips else None)
    except CorruptLogError as exc:  # its constructor does not survive pickling: keep the message
        raise DecodeError(str(exc)) from None
    _KEPT.append(result.state)
    result.state = ClusterState()
    return result, skipped


def _spread(log: Frames, key: str, end: int, shares: Sequence[tuple[Share, Checkpoint | None]],
            packer_kind: str | None, packer: Packer, progress: Callable[[int], None] | None, *,
            context: multiprocessing.context.BaseContext, shared: bool, skips: bool
            ) -> tuple[ReplayResult, list[Skipped]]:
    """The merged result of `shares` of `log` (each but the last in a worker process started in
    `context`, the last here) and the records they skipped (`skips`, as `_replay_share`);
    `shared`: the workers are forked and use `log` itself (`_OPENED[key]`)."""
    skipped: list[Skipped] = []
    undecodable = _skipping(skipped) if skips else None
    if len(shares) == 1:
        with bulk_fold():
            return _run_share(log, end, Share(), packer, None, progress, undecodable), skipped
    if shared:
        _OPENED[key] = log
    try:
        with ProcessPoolExecutor(max_workers=len(shares) - 1, mp_context=context) as pool:
            futures = [pool.submit(_replay_share, key, end, share, packer_kind, cp, skips)
                       for share, cp in shares[:-1]]
            with bulk_fold():
                share, cp = shares[-1]
                last = _run_share(log, end, share, packer, cp, progress, undecodable)
            parts = [f.result() for f in futures]
    finally:
        _OPENED.pop(key, None)
    for _, found in parts:
        skipped.extend(found)
    return merge([*(part for part, _ in parts), last]), skipped


def replay_file(path: str | os.PathLike[str] | FileEventLog, *, packer_kind: str | None = None,
                jobs: int | None = None, min_records: int = MIN_RECORDS_PER_JOB,
                progress: Callable[[int], None] | None = None, checkpoints: bool = True) -> ReplayResult:
    """Replay the file log at `path` (or an open one) over up to `jobs` processes (default:
    `default_jobs()`), each given at least `min_records` records, the later ones started from
    the log's checkpoints when it has them near the cuts (and `checkpoints`). `progress` is
    called now and then with the number of records this process's share has folded."""
    log = path if isinstance(path, FileEventLog) else FileEventLog(Path(path), readonly=True)
    end = log.record_count()
    shares = plan_checkpointed(log, end, jobs or default_jobs(), list_checkpoints(log.path) if checkpoints else (),
                               min_records)
    packer = packer_from_env(packer_kind)  # fail here, before any process starts
    forked = "fork" in multiprocessing.get_all_start_methods()
    result, _ = _spread(log, str(log.path), end, shares, packer_kind, packer, progress,
                        context=multiprocessing.get_context("fork" if forked else "spawn"),
                        shared=forked and log.readonly, skips=False)
    return result


def kafka_checkpoints(log: KafkaEventLog) -> list[KafkaCheckpoint]:
    """The checkpoints the scheduler kept beside the Kafka log `log` (none when it kept none)."""
    from kai_es.adapters.kafka_checkpoints import KafkaCheckpointStore  # noqa: PLC0415 - optional backend

    store = KafkaCheckpointStore(log.bootstrap, log.topic, security=log.security, create=False)

    async def listed() -> list[KafkaCheckpoint]:
        try:
            return await store.checkpoints()
        finally:
            await store.close()

    return anyio.run(listed)


def replay_kafka(log: KafkaEventLog, *, packer_kind: str | None = None, jobs: int | None = None,
                 min_records: int = MIN_RECORDS_PER_JOB, progress: Callable[[int], None] | None = None,
                 end: int | None = None, checkpoints: bool = True) -> ReplayResult:
    """Replay the Kafka log `log` up to `end` (default: its last stable offset now) over up to
    `jobs` processes, the later ones started from the log's checkpoints when it has them near
    the cuts (and `checkpoints`), as `replay_file` does; the records skipped as undecodable are
    dead-lettered (`log.dead_letters` names them afterwards)."""
    from kai_es.adapters.kafka_frames import KafkaRange, dead_letter_all, end_offset  # noqa: PLC0415

    if end is None:
        end = end_offset(log)
    jobs = jobs or default_jobs()
    kept = kafka_checkpoints(log) if checkpoints and jobs > 1 else []
    source = KafkaRange(log)
    shares = plan_checkpointed(source, end, jobs, kept, min_records)
    packer = packer_from_env(packer_kind)  # fail here, before any process starts
    result, skipped = _spread(source, f"{log.bootstrap}/{log.topic}", end, shares, packer_kind, packer, progress,
                              context=multiprocessing.get_context("fork"), shared=True, skips=True)
    if skipped:  # (a share reads what comes before its stop, and some what comes after its start)
        dead_letter_all(log, sorted({s[0]: s for s in skipped}.values()))
    return result
