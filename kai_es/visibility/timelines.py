"""Every job's timeline kept up to date while a log is folded, so `kai-es serve` shows one without
reading the log again. Pure: records in, no I/O.

Contract:
- `JobTimelines.feed(record, state, numbers)` is called for each record right after `state`
  folded it (in log order, each once; `numbers`: the `explain.CutNumbers` of the cut when the
  record is a CycleStarted; `cycle_started`, `cycle_completed` and `event` are its three cases,
  for a caller that has told them apart already). It keeps one `explain.Timeline` per subject that names a job: the
  job key (`NS/PODGROUP`) of every observed pod and the `NS/OWNER` of every pod with an owner,
  made at the first PodObserved that names it, and feeds each only the records that can change
  it (the `Timeline` contract): records about a pod it follows (or about the pod its subject
  names), the CycleStarted whose cut has one of its pods pending, and the CycleCompleted of a cut
  it opened. So the cost of a record is that of the timelines that follow its pod, and a cycle's
  that of its pending pods, not of the jobs in the log.
- `report(target, state, first_ns, last_ns, cluster)` is `Timeline.report` for `target`
  ("NS/NAME" or "NAME", as `kai-es explain` takes it), with its event entries left as record
  positions (`explain.resolve` with those records makes it `explain`'s report over the records
  fed); None when the subject has no timeline here: a pod that is not also a job, a
  `pod/`/`job/`-prefixed target, a name not in the log, or a subject whose first record came
  before the first PodObserved naming it (an earlier record about a pod of that name, which a
  timeline started then would have missed). The caller then runs `explain` over the log.
- Pending pods at a cut are found from the state's pending index (`Job.pending` of the jobs in
  `pending_jobs`, which holds every Pending pod of this scheduler that is not terminating) and
  the pods observed terminating (kept in a set, pruned at each cut): together every pod a
  timeline's cut can consider.
- Memory: per subject a `Timeline` (its pods, their queue and phase, its entries: one record
  position per event entry, one run per stretch of equal verdicts with its first and last cut
  and, when its job's place changed in it, the changes: at most 2 * `place_changes.KEPT` of
  64 bytes each, 2 KB), per followed pod key the timelines that follow it. About 1.2 KB a job:
  225 MiB for the 200,000 jobs of the 1,000,000-event benchmark log (`tools/bench/bench_serve.py`,
  a log without unschedulable verdicts). With `limit` (serve's
  `--keep-timelines`), once more than `limit` timelines are kept, a CycleCompleted drops the
  oldest (by when their timeline was made) of those whose job has no pod in the state any more,
  down to 3/4 of `limit`: a finished job's page is then read from the log (`report` says None,
  and its name is never given a timeline again — a pod of that name coming back would start
  one half-way through its story). A job with a pod in the state is never dropped, so the
  count can stay above `limit` while that many jobs live; what a dropped job leaves is its name.
- Cost: a record about a pod, that of the timelines following it (~4.5 us on the benchmark log,
  where folding a record costs ~10); a cycle's cut, ~10 us per job waiting then.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.explain import EVENT_TYPES, CutNumbers, Timeline, Subject, record_key
from kai_es.state import ClusterState


class JobTimelines:
    """The timelines of every job of the records fed (module docstring)."""

    def __init__(self, limit: int | None = None) -> None:
        #: how many timelines to keep before finished jobs' are dropped (None: all; module docstring)
        self.limit = limit
        #: subject key -> its timeline (in the order they were made)
        self.timelines: dict[str, Timeline] = {}
        #: `prune` waits until more timelines than this are kept (set by the last prune)
        self._prune_above = 0
        #: pod key -> the timelines whose subject tracked it (`Subject.job_pods`)
        self._followers: dict[str, list[Timeline]] = {}
        #: subjects whose first record came before their timeline could be made
        self._late: set[str] = set()
        #: pod keys of records that change a timeline of that name, fed before anything followed them
        self._orphans: set[str] = set()
        #: pods observed terminating (a terminating Pending pod is not in the pending index)
        self._terminating: set[str] = set()
        #: CycleStarted position -> the timelines that opened a cut there
        self._open: dict[int, list[Timeline]] = {}

    def feed(self, record: Record, state: ClusterState, numbers: CutNumbers | None = None) -> None:
        """Record `record`, just folded into `state` (`numbers`: the cut's, for a CycleStarted)."""
        data = record.envelope.data
        if isinstance(data, p.CycleStarted):
            self.cycle_started(record, state, numbers if numbers is not None else CutNumbers(state, record.envelope.logicaltime))
        elif isinstance(data, p.CycleCompleted):
            self.cycle_completed(record, state)
        else:
            self.event(record, state)

    def cycle_completed(self, record: Record, state: ClusterState | None = None) -> None:
        """CycleCompleted `record` (folded into `state`): the timelines that opened its cut judge it."""
        basedon = record.envelope.basedon
        if basedon is not None:
            for timeline in self._open.pop(basedon, ()):
                timeline.cycle_completed(basedon, state)

    def prune(self, state: ClusterState) -> int:
        """With a `limit` exceeded, drop finished jobs' timelines, oldest first, down to 3/4 of
        it (module docstring); how many were dropped. The caller calls it between cycles (no
        cut open: a timeline in `_open` is never dropped)."""
        limit = self.limit
        if limit is None or len(self.timelines) <= max(limit, self._prune_above):
            return 0
        pods, target = state.pods, limit * 3 // 4
        opened = {id(t) for ts in self._open.values() for t in ts}
        gone: list[str] = []
        excess = len(self.timelines) - target
        for name, timeline in self.timelines.items():
            if len(gone) >= excess:
                break
            subject = timeline.subject
            if id(timeline) in opened or name in pods or any(key in pods for key in subject.job_pods):
                continue
            gone.append(name)
        for name in gone:
            timeline = self.timelines.pop(name)
            self._late.add(name)  # never started again: its first records are gone with it
            for key in timeline.subject.job_pods:
                followers = self._followers.get(key)
                if followers is None:
                    continue
                followers[:] = [t for t in followers if t is not timeline]
                if not followers:
                    del self._followers[key]
                    self._orphans.add(key)  # a later subject of that name would miss what came before
        # the next prune waits for a quarter of `limit` more (live jobs it skipped are not walked
        # again every cycle while they alone keep the count above it)
        self._prune_above = len(self.timelines) + max(1, limit // 4)
        return len(gone)

    def event(self, record: Record, state: ClusterState) -> None:
        """Any record but a cycle's start or end."""
        data = record.envelope.data
        key = record_key(data)
        if not key:
            return
        if isinstance(data, p.PodObserved):  # (where a pod's key is first kept: one string for it
            key = sys.intern(key)  # however many timelines and records hold it)
            self._observed(key, state)
        followers = self._followers.get(key)
        own = self.timelines.get(key)
        if followers is None and own is None:
            if isinstance(data, EVENT_TYPES):
                self._orphans.add(key)
            return
        if followers is not None:
            for timeline in followers:
                timeline.event(record, key, state)
        if own is not None and (followers is None or own not in followers):
            own.event(record, key, state)

    def _observed(self, key: str, state: ClusterState) -> None:
        """PodObserved of `key`, folded: the subjects that track the pod (its job's, its owner's,
        made now if new; its own name's) note it."""
        pod = state.pods.get(key)
        if pod is None:  # an observation the reducer rejected: no timeline tracks it
            return
        spec = pod.spec
        if spec.terminating:
            self._terminating.add(key)
        elif self._terminating:
            self._terminating.discard(key)
        timelines = self.timelines
        followers = self._followers.get(key)
        job = timelines.get(pod.job_key) or self._start(pod.job_key)
        if job is not None:
            followers = self._track(job, key, state, followers)
        owner = None
        if spec.owner is not None:
            name = f"{spec.namespace}/{spec.owner.name}"
            owner = timelines.get(name) or self._start(name)
            if owner is not None and owner is not job:
                followers = self._track(owner, key, state, followers)
        own = timelines.get(key)
        if own is not None and own is not job and own is not owner:
            followers = self._track(own, key, state, followers)
        if followers is None:  # no timeline follows the pod (its job's could not be made): a later
            self._orphans.add(key)  # subject of its name would have missed it

    def _track(self, timeline: Timeline, key: str, state: ClusterState,
               followers: list[Timeline] | None) -> list[Timeline] | None:
        """`timeline` tracks pod `key` (`Subject.track`); it follows it from now on if it did not."""
        subject = timeline.subject
        if key in subject.job_pods:
            if key == subject.key:  # (otherwise tracking it again changes nothing)
                subject.track(state, key)
            return followers
        subject.track(state, key)
        if key in subject.job_pods:
            if followers is None:
                followers = self._followers[key] = []
            followers.append(timeline)
        return followers

    def _start(self, name: str) -> Timeline | None:
        """A new timeline for subject `name`, or None if it cannot be indexed (module docstring)."""
        if name in self._late:
            return None
        if name in self._followers or name in self._orphans or not _plain(name):
            self._late.add(name)
            return None
        timeline = self.timelines[name] = Timeline(name, keep_events=False)
        return timeline

    def cycle_started(self, record: Record, state: ClusterState, numbers: CutNumbers) -> None:
        """CycleStarted `record`: the timelines with a pod pending now open its cut."""
        keys: list[str] = []
        jobs = state.jobs
        for bucket in state.pending_jobs.values():
            for entry in bucket:
                keys.extend(pending.pod_key for pending in jobs[entry.job_key].pending)
        for key in sorted(self._terminating):
            pod = state.pods.get(key)
            if pod is None or not pod.spec.terminating:
                self._terminating.discard(key)
            else:
                keys.append(key)
        seen: dict[Timeline, None] = {}  # (by identity, in a fixed order)
        followers, timelines = self._followers, self.timelines
        for key in keys:
            for timeline in followers.get(key, ()):
                seen[timeline] = None
            own = timelines.get(key)
            if own is not None:
                seen[own] = None
        opened = [t for t in seen if t.cycle_started(record, state, numbers)]
        if opened:
            self._open[record.position] = opened

    def report(self, target: str, state: ClusterState, first_ns: int, last_ns: int,
               cluster: Callable[[], dict[str, int]]) -> dict[str, Any] | None:
        """`target`'s report with record positions for its event entries, or None (module docstring)."""
        try:
            subject = Subject(target)
        except ValueError:
            return None
        if subject.forced:
            return None
        timeline = self.timelines.get(subject.key)
        if timeline is None:
            return None
        return timeline.report(state, first_ns, last_ns, cluster)


def _plain(name: str) -> bool:
    """Whether `name` is a subject `explain` reads as itself: NS/NAME (no `default/` added, not a
    `pod/`, `job/` or `podgroup/` target, which have two slashes)."""
    return name.count("/") == 1
