"""Replay of a file log spread over processes (`kai-es replay --jobs N`).

Why processes: folding and re-running cycles are CPU-bound Python, so threads would share one
core. Every share must fold the log from its start (a cycle needs the state at its cut), but only
re-runs the cycles of its own stretch and stops reading once they are all complete; the last
share runs in this process and reads to the end. Stretches are chosen so that every process has
about the same work: share j folds [0, s_j+1) and re-runs cycles in [s_j, s_j+1), so the earlier
shares get longer stretches. The verdict is `kai_es.replay.merge` of the shares' results, which
is the verdict one process would reach (the tests check this on every golden log).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kai_es.adapters.file_log import CorruptLogError, FileEventLog
from kai_es.app import bulk_fold, packer_from_env
from kai_es.events import DecodeError
from kai_es.replay import ReplayResult, Share, merge, replay_frames
from kai_es.state import ClusterState

#: re-running the cycles of a stretch costs about this many times folding it, as a fraction
#: (measured on the 1,000,000-event benchmark log: ~6.9 s of cycles against ~4.6 s of folding)
CYCLE_TO_FOLD = (3, 2)
#: below this many records a second process costs more than it saves
MIN_RECORDS_PER_JOB = 20_000


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


#: a worker's folded states, kept until the worker process ends (`_replay_share`)
_KEPT: list[ClusterState] = []


def _replay_share(path: str, end: int, share: Share, packer_kind: str | None) -> ReplayResult:
    """One share's result, in a worker process that does nothing else before it ends. Its state
    stays in the process (the digest travels) and is neither freed nor scanned by a collection
    (`bulk_fold(keep=True)`): the worker ends with `os._exit`, and freeing ~1 GB of objects one
    by one would only delay the result the replay waits for."""
    try:
        log = FileEventLog(Path(path), readonly=True)
        with bulk_fold(keep=True):
            result = replay_frames(log.frames(0, end), packer_from_env(packer_kind), share=share)
    except CorruptLogError as exc:  # its constructor does not survive pickling: keep the message
        raise DecodeError(str(exc)) from None
    _KEPT.append(result.state)
    result.state = ClusterState()
    return result


def replay_file(path: str | os.PathLike[str] | FileEventLog, *, packer_kind: str | None = None,
                jobs: int | None = None, min_records: int = MIN_RECORDS_PER_JOB,
                progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Replay the file log at `path` (or an open one) over up to `jobs` processes (default:
    `default_jobs()`), each given at least `min_records` records. `progress` is called now and
    then with the number of records this process has folded (it folds the whole log)."""
    log = path if isinstance(path, FileEventLog) else FileEventLog(Path(path), readonly=True)
    path = log.path
    end = log.record_count()
    shares = plan_shares(end, jobs or default_jobs(), min_records=min_records)
    packer = packer_from_env(packer_kind)  # fail here, before any process starts
    if len(shares) == 1:
        with bulk_fold():
            return replay_frames(log.frames(0, end), packer, progress=progress)
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=len(shares) - 1, mp_context=context) as pool:
        futures = [pool.submit(_replay_share, str(path), end, share, packer_kind)
                   for share in shares[:-1]]
        with bulk_fold():
            last = replay_frames(log.frames(0, end), packer, share=shares[-1], progress=progress)
        parts = [f.result() for f in futures]
    return merge([*parts, last])
