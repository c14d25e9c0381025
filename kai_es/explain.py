"""`kai-es explain`: the life of a pod, a job or a queue, read from the log alone.

Contract (pure over records; integers throughout — GPU in milli-GPU, CPU in milli-CPU, memory
in bytes, times in ns since the epoch):
- The log is folded with the reducer (`kai_es.state.reducer.apply`). At every CycleStarted (the
  cycle's cut) the state is exactly what that cycle saw, so the queue numbers reported for a
  cycle — fair share, allocation, quota, limit, demand — are recomputed there by the same
  division the scheduler runs (`kai_es.scheduling.fairshare.shares_for_state`, in the GPU unit
  of the policy version in force). Nothing is added to the log for explain: replay at the cut is
  exact, so the numbers are derived, not stored.
- A cycle "considered" a pod when the pod was Pending (and scheduled by kai-scheduler) at its
  cut and the cycle completed (its CycleCompleted is in the log). Every such pod gets a verdict
  in that cycle; the scheduler records it only when it differs (code and numbers) from the last
  one announced for the pod (`kai_es.scheduling.emit`). So a cycle without a recorded verdict
  for a considered pod repeated the last announced one; that is checked against the pod's
  folded `last_unschedulable` fingerprint, and reported as "unknown" if they disagree.
- Consecutive cycles with the same verdict are one entry of the timeline (a `wait` entry with a
  cycle count); any other event of the subject in between ends the run.
- Within a run the subject's job's place (in its queue at each cut, in the order each cycle tried
  the jobs in) is given at the first cycle and at each cycle where it changed, not per cycle
  (`visibility.place_changes`: a change is a new rank or queue; at most its first and last
  `KEPT` changes per run, those between counted).
- Events of the subject (observed, phase changes, binding and pipelining decisions, binder
  outcomes, eviction decisions with their preemptor and numbers, completion, removal) are
  entries of their own, in log order; a pod that has not finished when the log ends gets a
  last `atEnd` entry with its status then (so a pod that never ran says so).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.timefmt import format_duration, rfc3339
from kai_es.scheduling.config import config_or_default
from kai_es.scheduling.fairshare import RESOURCES, QueueShare, gpu_memory_hint, pending_request, pod_request
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.session import queued_job
from kai_es.state import ClusterState
from kai_es.state.keys import job_key_of_index
from kai_es.state.reducer import apply, pod_key, reasons_fingerprint
from kai_es.visibility import place_changes
from kai_es.visibility.place_changes import change_json
from kai_es.visibility.positions import cluster_ranks, position, queue_order, tried_ranks

#: reason code -> the rule it names, as a person says it
RULES: dict[str, str] = {
    "QueueLimit": "held by its queue's limit",
    "NonPreemptibleOverQuota": "held by quota (a non-preemptible job may not exceed it)",
    "GangUnsatisfied": "held by its gang (the minimum must be placed at once)",
    "GangIncomplete": "held by its gang (not enough members exist)",
    "NotReady": "held by its gang (not ready: too few of its pods exist without scheduling gates)",
    "NoNodeFits": "no node fits",
    "BindBackoff": "backing off after failed binds",
    "BindFailedPermanently": "the binder gave up binding it",
    "NoNodes": "the cluster has no nodes",
    "NoQueue": "it names no queue",
    "QueueNotFound": "its queue does not exist",
    "QueueNotLeaf": "its queue is a parent queue",
    "QueueLoop": "its queue's parent chain loops",
    "PodGroupNotFound": "its PodGroup does not exist",
    "InvalidRequest": "its request cannot be placed",
    "PreemptionDelay": "within its preemption delay (it may not evict anyone yet)",
    "TopologyUnsatisfied": "held by its topology constraint (no domain of the required level fits it)",
    "InvalidTopologyConstraint": "its topology constraint does not match its Topology",
    "BeyondQueueDepth": "beyond the jobs allocate considers in its queue (queueDepthPerAction)",
}

UNITS = {"gpu": "milli-GPU", "cpu": "milli-CPU", "memory": "bytes", "time": "ns since the Unix epoch"}


class ExplainError(ValueError):
    """The subject is not in the log (the message says what was looked for)."""


@dataclass(slots=True)
class _Cut:
    """What one cycle saw of the subject: its pending pods and its queue's numbers."""

    cycle: int
    position: int
    time_ns: int
    #: pod key -> (fingerprint folded at the cut, the last announced reasons we saw)
    pending: dict[str, tuple[str, list[p.Reason] | None]]
    queue: QueueAt | None
    decided: dict[str, p.Payload] = field(default_factory=dict)
    #: the subject's job's place in its queue at the cut (`visibility.positions`): (n, of)
    place: tuple[int, int] | None = None
    #: the subject's job (its first pending pod's), and its place in the order the cycle tried
    #: the jobs in, once the cycle completed with one recorded (kai-es/v13 on): (n, of)
    job: str = ""
    cluster: tuple[int, int] | None = None
    #: pending pods held by scheduling gates where they are honoured (kai-es/v14 on): key -> gates
    gated: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the subject's job's queue (whose order `place` is)
    queue_name: str = ""


@dataclass(slots=True)
class _Run:
    """Consecutive cycles with one verdict (the `wait` entry of a timeline)."""

    key: tuple[Any, ...]
    verdicts: list[dict[str, Any]]
    first: _Cut
    last: _Cut
    cycles: int = 1
    #: the job's place at each cut where it changed, the first cut's first (bounded:
    #: `place_changes.PlaceChanges`); None while it has not changed since the first cut, as in most runs
    moves: place_changes.PlaceChanges | None = None

    def extend(self, cut: _Cut) -> None:
        """One more cycle in the run: completed cut `cut`, its place noted if it moved."""
        if place_changes.moved(self.last, cut):
            if self.moves is None:
                self.moves = place_changes.PlaceChanges(self.first)
            self.moves.add(cut)
        self.cycles += 1
        self.last = cut

    def as_json(self) -> dict[str, Any]:
        """The entry as it stands (its verdicts copied: a later cycle that extends the run
        updates them)."""
        moves: Iterable[place_changes.Placed] = self.moves if self.moves is not None else (self.first,)
        elided = self.moves.elided if self.moves is not None else 0
        return {"kind": "wait", "cycles": self.cycles,
                "firstCycle": self.first.cycle, "lastCycle": self.last.cycle,
                "from": _at(self.first.position, self.first.time_ns),
                "until": _at(self.last.position, self.last.time_ns),
                "verdicts": [dict(v) for v in self.verdicts],
                "queueAtFirst": _queue_json(self.first.queue), "queueAtLast": _queue_json(self.last.queue),
                "positionAtFirst": _position_json(self.first),
                "positionAtLast": _position_json(self.last),
                "positionChanges": [change_json(c) for c in moves], "positionChangesElided": elided}


def _position_json(cut: _Cut) -> dict[str, int] | None:
    """The cut's place in the queue, and in the order the cycle tried when it recorded one."""
    place = cut.place
    if place is None:
        return None
    if cut.cluster is None:
        return {"inQueue": place[0], "of": place[1]}
    return {"inQueue": place[0], "of": place[1], "inCluster": cut.cluster[0], "clusterOf": cut.cluster[1]}


def _at(position: int, ns: int) -> dict[str, Any]:
    return {"position": position, "logicaltime": ns, "time": rfc3339(ns)}


def queue_numbers(state: ClusterState, shares: dict[str, dict[str, QueueShare]], hint: int,
                  name: str) -> dict[str, Any] | None:
    """Queue `name`'s numbers per resource at this state: quota, limit (-1: none), allocated,
    fair share, request (allocated + pending, capped by the limit, as the division counts it)
    and pending (what its pending pods ask for, its leaves' summed for a parent). None when the
    queue does not exist."""
    return _queue_json(_queue_at(state, shares, pending_sums(state, pending_request(state, hint)), name))


#: a queue's numbers at a cut, compact (a timeline keeps one per cut it shows; `_queue_json` makes
#: `queue_numbers`'s dict of it): name, parent (None: a root), then per resource of `RESOURCES`
#: (quota, limit, allocated, fair share, request, pending)
QueueAt = tuple[Any, ...]


def _queue_at(state: ClusterState, shares: dict[str, dict[str, QueueShare]], sums: dict[str, list[int]],
              name: str) -> QueueAt | None:
    if name not in state.queues or name not in shares["gpu"]:
        return None
    pending = sums[name]
    gpu, cpu, memory = (shares[resource][name] for resource in RESOURCES)
    return (name, state.queues[name].spec.parent or None,
            (gpu.quota, gpu.limit, gpu.allocated, gpu.fair_share, gpu.request, pending[0]),
            (cpu.quota, cpu.limit, cpu.allocated, cpu.fair_share, cpu.request, pending[1]),
            (memory.quota, memory.limit, memory.allocated, memory.fair_share, memory.request, pending[2]))


def _queue_json(numbers: QueueAt | None) -> dict[str, Any] | None:
    if numbers is None:
        return None
    out: dict[str, Any] = {"name": numbers[0], "parent": numbers[1]}
    for resource, (quota, limit, allocated, fair_share, request, pending) in zip(RESOURCES, numbers[2:]):
        out[resource] = {"quota": quota, "limit": limit, "allocated": allocated, "fairShare": fair_share,
                         "request": request, "pending": pending}
    return out


def pending_sums(state: ClusterState, demand: dict[str, tuple[int, int, int]]) -> dict[str, list[int]]:
    """Every queue's pending demand per resource: what the pending pods of the queue and of each
    queue whose parent chain reaches it ask for (`demand`: `fairshare.pending_request`). A
    queue's demand is added to each queue of its chain once (a chain that loops ends there)."""
    parents = {q: state.queues[q].spec.parent for q in state.queues}
    sums = {q: [0, 0, 0] for q in parents}
    for leaf, asks in demand.items():
        seen: set[str] = set()
        at = leaf
        while at in sums and at not in seen:
            seen.add(at)
            total = sums[at]
            for r in range(3):
                total[r] += asks[r]
            at = parents[at]
    return sums


class CutNumbers:
    """What timelines read at one cycle's cut, each computed once however many jobs ask: the
    division the cycle ran (`cycle_shares`), the pending demand (`pending_sums`), each queue's
    numbers (`queue_numbers`) and each queue's order of waiting jobs (`positions.position`).
    The state must stay at the cut while this is used."""

    __slots__ = ("state", "now_ns", "_shares", "_sums", "_numbers", "_places")

    def __init__(self, state: ClusterState, now_ns: int) -> None:
        self.state = state
        self.now_ns = now_ns
        self._shares: tuple[dict[str, dict[str, QueueShare]], int] | None = None
        self._sums: dict[str, list[int]] | None = None
        self._numbers: dict[str, QueueAt | None] = {}
        self._places: dict[str, tuple[int, int]] | None = None

    def shares(self) -> tuple[dict[str, dict[str, QueueShare]], int]:
        """`cycle_shares` at the cut: (shares, the GPU memory hint)."""
        if self._shares is None:
            self._shares = cycle_shares(self.state, self.now_ns)
        return self._shares

    def sums(self) -> dict[str, list[int]]:
        """`pending_sums` at the cut."""
        if self._sums is None:
            self._sums = pending_sums(self.state, pending_request(self.state, self.shares()[1]))
        return self._sums

    def numbers(self, name: str) -> QueueAt | None:
        """`queue_numbers` of queue `name` at the cut, compact (`_queue_json` makes the dict)."""
        if name not in self._numbers:
            shares = self.shares()[0]
            self._numbers[name] = (_queue_at(self.state, shares, self.sums(), name)
                                   if name in self.state.queues and name in shares["gpu"] else None)
        return self._numbers[name]

    def place(self, job_key: str) -> tuple[int, int] | None:
        """`positions.position(state, job_key)` at the cut (every queue's order made at once)."""
        job = self.state.jobs.get(job_key)
        if job is None or not job.pending:
            return None
        if self._places is None:
            self._places = {}
            jobs = self.state.jobs
            for bucket in self.state.pending_jobs.values():  # `positions.queue_order` of each queue
                order = sorted(queued_job(j) for j in (jobs[job_key_of_index(k)] for k in bucket) if j.pending)
                for n, entry in enumerate(order, 1):
                    self._places[entry.job_key] = (n, len(order))
        return self._places.get(job_key)


def cycle_shares(state: ClusterState, now_ns: int) -> tuple[dict[str, dict[str, QueueShare]], int]:
    """The division the cycle at `now_ns` ran (time-based fair share included, when on)."""
    config = config_or_default(state.config)
    division = policy_for(config.policy_version).rules.fair_share_division
    hint = gpu_memory_hint(state)
    return division.shares(state, config, now_ns), hint


def _reasons_json(reasons: list[p.Reason]) -> list[dict[str, Any]]:
    return [{"code": r.code, "message": r.message, "numbers": dict(r.numbers)} for r in reasons]


def _rule(reasons: list[p.Reason]) -> str:
    """The rule that held the pod back: the first reason's (a gang's reason comes before the
    member's no-fit detail), but a gang held by its topology constraint (kai-es/v5: its
    GangUnsatisfied reason is followed by TopologyUnsatisfied) is held by that."""
    if not reasons:
        return ""
    if len(reasons) > 1 and reasons[0].code == "GangUnsatisfied" and reasons[1].code == "TopologyUnsatisfied":
        return "TopologyUnsatisfied"
    return reasons[0].code



class _Span:
    """The first and last logical time of the records folded so far (0 before any)."""

    def __init__(self) -> None:
        self.first_ns = 0
        self.last_ns = 0
        self._any = False

    def folded(self, records: Iterable[Record], state: ClusterState) -> Iterator[Record]:
        """Each record, after folding it into `state` and noting its time."""
        for record in records:
            t = record.envelope.logicaltime
            if not self._any:
                self.first_ns, self._any = t, True
            self.last_ns = t
            apply(state, record)
            yield record

class Subject:
    """Which pods the explanation follows: one pod (`ns/name`) or every member of a job (its
    PodGroup `ns/name`, or the owner `ns/name` of its pods, e.g. a PyTorchJob)."""

    __slots__ = ("key", "forced", "pod_seen", "job_pods")

    def __init__(self, target: str) -> None:
        kind, _, rest = target.partition("/")
        self.forced = ""
        if kind in ("pod", "job", "podgroup") and rest.count("/") == 1:
            self.forced = "job" if kind != "pod" else "pod"
            target = rest
        if target.count("/") == 0:
            target = f"default/{target}"
        if target.count("/") != 1:
            raise ExplainError(f"{target!r}: name a pod or job as NAMESPACE/NAME (or pod/NS/NAME, job/NS/NAME)")
        self.key = target
        self.pod_seen = False
        #: the pods it follows as the job's (a tuple while they are few: most jobs have one)
        self.job_pods: tuple[str, ...] | set[str] = ()

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]

    def track(self, state: ClusterState, key: str) -> None:
        """Note pod `key` (just observed) if it is the subject or a member of the subject job."""
        pod = state.pods.get(key)
        if pod is None:
            return
        if key == self.key:
            self.pod_seen = True
        owner = pod.spec.owner
        if pod.job_key == self.key or (pod.spec.namespace == self.namespace and owner is not None
                                       and owner.name == self.name):
            if key not in self.job_pods:
                if isinstance(self.job_pods, set):
                    self.job_pods.add(key)
                else:
                    self.job_pods = (*self.job_pods, key) if len(self.job_pods) < 8 else {*self.job_pods, key}

    def follows(self, key: str) -> bool:
        if self.forced == "pod" or (not self.forced and self.pod_seen):
            return key == self.key
        return key in self.job_pods or (self.forced != "job" and key == self.key)

    @property
    def mode(self) -> str:
        if self.forced:
            return self.forced
        return "pod" if self.pod_seen else "job"


def record_key(data: p.Payload) -> str:
    """The pod key a record is about, as a timeline reads it ("" for none): the namespace and name
    of any payload that has both."""
    keyed = _KEYED.get(type(data))
    if keyed is None:
        keyed = _KEYED[type(data)] = hasattr(data, "namespace") and hasattr(data, "name")
    return pod_key(data.namespace, data.name) if keyed else ""  # type: ignore[attr-defined]


#: payload type -> whether it has a namespace and a name (`record_key`)
_KEYED: dict[type[p.Payload], bool] = {}


#: the payloads a timeline follows that change it for a pod it follows (`Timeline.event`); a
#: record of any other type about a followed pod changes at most `queue_of`, and only for a pod
#: in the state
EVENT_TYPES: tuple[type[p.Payload], ...] = (
    p.PodObserved, p.PodUnschedulable, p.PodPipelined, p.BindingDecided, p.PodBound, p.PodBindFailed,
    p.EvictionDecided, p.PodEvicted, p.PodEvictionFailed, p.PodRemoved)


class Timeline:
    """One subject's timeline, fed record by record after each is folded (what `explain` does
    over a whole log). Fed every record it folds, in order:

    - a PodObserved of pod `key`: `subject.track(state, key)` then `event`;
    - a CycleStarted: `cycle_started` (with the cut's `CutNumbers`);
    - a CycleCompleted: `cycle_completed`;
    - any other record: `event` with its `record_key`.

    A caller may leave out a record that cannot change the timeline: an `event` of a pod it
    does not follow, a `cycle_started` when none of its pods is pending then, a
    `cycle_completed` of a cut it did not open (`open_cuts`). With `keep_events=False` an event
    entry is kept as the position of its record, and `resolve` turns the report's positions
    back into the entries (the entry is a function of the record and of the previous ones)."""

    __slots__ = ("subject", "entries", "announced", "open_cuts", "queue_of", "phase", "keep_events", "_steady")

    def __init__(self, target: str, *, keep_events: bool = True) -> None:
        self.subject = Subject(target)
        self.entries: list[dict[str, Any] | _Run | int] = []
        #: (None while empty, as most are: a timeline is kept for every job of a log)
        self.announced: dict[str, list[p.Reason]] | None = None
        self.open_cuts: dict[int, _Cut] | None = None
        self.queue_of: dict[str, str] = {}
        self.phase: dict[str, str] = {}
        self.keep_events = keep_events
        #: the run the last completed cut began or extended when nothing was decided in it
        self._steady: _Run | None = None

    def cycle_started(self, record: Record, state: ClusterState, numbers: CutNumbers) -> bool:
        """Open the cut of CycleStarted `record` if one of the subject's pods is pending at it
        (True then)."""
        cut = _cut(state, self.subject, record, self.announced, numbers)
        if cut is None:
            return False
        if self.open_cuts is None:
            self.open_cuts = {}
        self.open_cuts[record.position] = cut
        return True

    def cycle_completed(self, basedon: int | None, state: ClusterState | None = None) -> None:
        """The cycle of cut `basedon` completed (`state`: folded through its CycleCompleted, for
        the place in the order it tried; None: not shown)."""
        if self.open_cuts is None:
            return
        cut = self.open_cuts.pop(basedon if basedon is not None else -1, None)
        if cut is None:
            return
        if state is not None and cut.job and state.tried_order_cycle == cut.cycle:
            ranks = tried_ranks(state)
            at = ranks.get(cut.job) if ranks is not None else None
            if ranks is not None and at is not None:
                cut.cluster = (at + 1, len(ranks))
        if not self.open_cuts:
            self.open_cuts = None
        entries = self.entries
        run = self._steady
        if run is not None and not cut.decided and entries and entries[-1] is run and run.last.pending == cut.pending:
            # the cycle before extended or began this run with the same pods pending, their same
            # fingerprints and last verdicts, and nothing decided then or now: `_verdict` would
            # find the same verdicts and extend the run, changing nothing else in it
            run.extend(cut)
            return
        _verdict(cut, entries)
        last = entries[-1] if entries else None
        self._steady = last if isinstance(last, _Run) and last.last is cut and not cut.decided else None

    def event(self, record: Record, key: str, state: ClusterState) -> None:
        """A record other than a cycle's start or end, about pod `key` ("" for none)."""
        subject = self.subject
        if not key:
            return
        if subject.forced == "pod" or (not subject.forced and subject.pod_seen):  # subject.follows(key), inlined:
            if key != subject.key:  # this is the hot path of `kai-es serve`'s fold
                return
        elif key not in subject.job_pods and (subject.forced == "job" or key != subject.key):
            return
        env = record.envelope
        data = env.data
        pod = state.pods.get(key)
        if pod is not None:
            job = state.jobs.get(pod.job_key)
            if job is not None:
                self.queue_of[key] = job.queue
        cut = self.open_cuts.get(env.basedon) if env.basedon is not None and self.open_cuts is not None else None
        if isinstance(data, p.PodUnschedulable):
            if self.announced is None:
                self.announced = {}
            self.announced[key] = list(data.reasons)
            if cut is not None:
                cut.decided[key] = data
            return
        if isinstance(data, p.PodPipelined) and cut is not None:
            cut.decided[key] = data
            return
        entry: dict[str, Any] | int | None
        if self.keep_events:
            entry = _event(record, key, data, self.phase)
        else:  # the entry is made from its record when asked (`resolve`): here only whether there is one
            entry = record.position if _advance(key, data, self.phase)[0] else None
        if entry is not None:
            if isinstance(data, (p.BindingDecided, p.PodPipelined)):
                if self.announced is not None:
                    self.announced.pop(key, None)
                    if not self.announced:
                        self.announced = None
                if cut is not None:
                    cut.decided[key] = data
            self.entries.append(entry)

    def report(self, state: ClusterState, first_ns: int, last_ns: int,
               cluster: Callable[[], dict[str, int]]) -> dict[str, Any]:
        """The report of `explain` over the records fed so far (`state` folded through them,
        `first_ns`/`last_ns` their first and last logical time, `cluster()` the cluster-wide
        order then as `positions.cluster_ranks(state, last_ns)`). Nothing it returns is
        changed by feeding more; with `keep_events=False` its timeline holds record positions
        (`resolve`). Raises ExplainError when the subject is not in the records."""
        subject = self.subject
        if not subject.pod_seen and not subject.job_pods:
            raise ExplainError(f"the log has no pod or job {subject.key!r} (a job is named by its PodGroup "
                               "or by the owner of its pods, e.g. default/my-pytorchjob)")
        timeline: list[dict[str, Any] | int] = [e.as_json() if isinstance(e, _Run) else e for e in self.entries]
        queue_of = self.queue_of
        pods = sorted(k for k in {*queue_of, *subject.job_pods, *((subject.key,) if subject.pod_seen else ())}
                      if subject.follows(k))
        ranks: dict[str, int] | None = None
        for key in pods:  # where each pod stands when the log ends (a pod that never ran says so)
            pod = state.pods.get(key)
            if pod is not None and self.phase.get(key) not in ("Succeeded", "Failed"):
                end: dict[str, Any] = {"kind": "atEnd", "pod": key, **_at(state.position, last_ns),
                                       "status": pod.status, "node": pod.node or None}
                place = position(state, pod.job_key)
                if place is not None:
                    if ranks is None:
                        ranks = cluster()
                    end["place"] = {"inQueue": place[0], "of": place[1], **_cluster_place(ranks, pod.job_key)}
                timeline.append(end)
        return {
            "subject": {"kind": subject.mode, "namespace": subject.namespace, "name": subject.name,
                        "pods": pods, "queues": sorted(set(queue_of[k] for k in pods if k in queue_of))},
            "units": UNITS,
            "log": {"from": first_ns, "until": last_ns},
            "timeline": timeline,
        }


def event_positions(report: dict[str, Any]) -> list[int]:
    """The record positions a `Timeline.report` (keep_events=False) holds in place of entries."""
    return [e for e in report["timeline"] if isinstance(e, int)]


def resolve(report: dict[str, Any], records: dict[int, Record]) -> dict[str, Any]:
    """`report` with each record position of its timeline replaced by that record's entry
    (`records`: position -> record, for every `event_positions(report)`), as `explain` makes
    it: an entry depends on its record and on the phase the previous entries left its pod in."""
    phase: dict[str, str] = {}
    timeline = []
    for e in report["timeline"]:
        if isinstance(e, int):
            record = records[e]
            data = record.envelope.data
            entry = _event(record, record_key(data), data, phase)
            if entry is None:
                raise ValueError(f"the record at position {e} is not an entry of this timeline")
            e = entry
        timeline.append(e)
    return {**report, "timeline": timeline}


def explain(records: Iterable[Record], target: str) -> dict[str, Any]:
    """The timeline of pod or job `target` (see module docstring); raises ExplainError when the
    log has no such pod or job. The shape is documented in docs/explain.md."""
    timeline = Timeline(target)
    state = ClusterState()
    span = _Span()
    for record in span.folded(records, state):
        env = record.envelope
        data = env.data
        if isinstance(data, p.CycleStarted):
            timeline.cycle_started(record, state, CutNumbers(state, env.logicaltime))
        elif isinstance(data, p.CycleCompleted):
            timeline.cycle_completed(env.basedon, state)
        else:
            key = record_key(data)
            if isinstance(data, p.PodObserved):
                timeline.subject.track(state, key)
            timeline.event(record, key, state)
    return timeline.report(state, span.first_ns, span.last_ns, lambda: cluster_ranks(state, span.last_ns))


def _cut(state: ClusterState, subject: Subject, record: Record,
         announced: dict[str, list[p.Reason]] | None, numbers: CutNumbers) -> _Cut | None:
    """What cycle `record` (a CycleStarted, folded) sees of the subject, or None if nothing."""
    pending: dict[str, tuple[str, list[p.Reason] | None]] = {}
    queue = ""
    job_key = ""
    keys: Iterable[str]  # the pods it follows, in order (once a cycle for every waiting job kept by serve)
    if subject.forced:
        keys = [k for k in sorted({*subject.job_pods, *((subject.key,) if subject.pod_seen else ())})
                if subject.follows(k)]
    elif subject.pod_seen:
        keys = (subject.key,)
    else:
        keys = subject.job_pods if len(subject.job_pods) < 2 else sorted(subject.job_pods)
    pods, jobs, scheduler = state.pods, state.jobs, state.scheduler_name
    gated: dict[str, tuple[str, ...]] = {}
    for key in keys:
        pod = pods.get(key)
        if pod is None or pod.status != "Pending" or pod.spec.scheduler_name != scheduler:
            continue
        pending[key] = (pod.last_unschedulable, announced.get(key) if announced is not None else None)
        if pod.spec.scheduling_gates and state.honours_gates:
            gated[key] = tuple(pod.spec.scheduling_gates)
        if not queue:
            job = jobs.get(pod.job_key)
            if job is not None:
                queue = job.queue
                job_key = pod.job_key
    if not pending:
        return None
    env = record.envelope
    assert isinstance(env.data, p.CycleStarted)
    return _Cut(env.data.cycle, record.position, env.logicaltime, pending, numbers.numbers(queue) if queue else None,
                place=numbers.place(job_key) if job_key else None, job=job_key, gated=gated, queue_name=queue)


#: reason numbers that change with each failed search while the verdict stays the same
#: (`rules.search_backoff`): consecutive cycles differing only in them are one wait
_BACKOFF_NUMBERS = re.compile(r",?(retry_at_ns|search_failures)=-?\d+")


def _without_backoff(key: tuple[Any, ...]) -> tuple[Any, ...]:
    if key[0] == "pending" and len(key) > 1:
        return ("pending", _BACKOFF_NUMBERS.sub("", key[1]))
    return key


def _verdict(cut: _Cut, entries: list[dict[str, Any] | _Run | int]) -> None:
    """Fold a completed cycle's verdict on the subject into the timeline (collapsing)."""
    kinds: Counter[tuple[Any, ...]] = Counter()
    detail: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, (fingerprint, last) in sorted(cut.pending.items()):
        decided = cut.decided.get(key)
        if isinstance(decided, p.BindingDecided):
            continue  # an entry of its own
        gates = cut.gated.get(key)
        if gates is not None:  # not pending for kai-es: the cycle decides nothing for it
            k: tuple[Any, ...] = ("gated", gates)
            detail.setdefault(k, {"status": "Pending", "recorded": False, "rule": "", "reasons": [], "pods": [],
                                  "gates": list(gates), "note": "gated: waiting for its scheduling gates to be "
                                                                f"removed ({', '.join(gates)})"})
        elif isinstance(decided, p.PodPipelined):
            k = ("pipelined", decided.node, tuple(decided.waiting_for))
            detail.setdefault(k, {"status": "Pipelined", "node": decided.node,
                                  "waitingFor": list(decided.waiting_for), "pods": []})
        elif isinstance(decided, p.PodUnschedulable):
            reasons = list(decided.reasons)
            k = ("pending", reasons_fingerprint(reasons))
            detail.setdefault(k, {"status": "Pending", "recorded": True, "rule": _rule(reasons),
                                  "reasons": _reasons_json(reasons), "pods": []})
        elif last is not None and reasons_fingerprint(last) == fingerprint:
            k = ("pending", fingerprint)
            detail.setdefault(k, {"status": "Pending", "recorded": False, "rule": _rule(last),
                                  "reasons": _reasons_json(last), "pods": []})
        else:
            k = ("unknown",)
            detail.setdefault(k, {"status": "Pending", "recorded": False, "rule": "", "reasons": [],
                                  "pods": [], "note": "considered; no verdict recorded for it"})
        kinds[k] += 1
        detail[k]["pods"].append(key)
    if not kinds:
        return
    run_key = tuple(sorted((_without_backoff(k), n) for k, n in kinds.items()))
    verdicts = [detail[k] for k in sorted(detail, key=_without_backoff)]
    last_entry = entries[-1] if entries else None
    if isinstance(last_entry, _Run) and last_entry.key == run_key:
        last_entry.extend(cut)
        for old, new in zip(last_entry.verdicts, verdicts):
            old["recorded"] = old.get("recorded", False) or new.get("recorded", False)
            old["reasons"] = new["reasons"]  # a search back-off's numbers move on: the latest
        return
    entries.append(_Run(run_key, verdicts, cut, cut))


def _event(record: Record, key: str, data: p.Payload, phase: dict[str, str]) -> dict[str, Any] | None:
    """The timeline entry of one event of a followed pod, or None if it changes nothing a
    reader of the timeline needs (a re-observation in the same phase)."""
    entry, was = _advance(key, data, phase)
    return _entry(record, key, data, was) if entry else None


#: the events of a followed pod that are always an entry of their own
_ENTRY_TYPES = (p.BindingDecided, p.PodPipelined, p.PodBound, p.PodBindFailed, p.EvictionDecided, p.PodEvicted,
                p.PodEvictionFailed, p.PodRemoved)


def _advance(key: str, data: p.Payload, phase: dict[str, str]) -> tuple[bool, str | None]:
    """Whether event `data` of followed pod `key` is an entry (a PodObserved only when it changes
    the pod's phase), and the pod's phase before it; notes the phase it leaves in `phase`."""
    if isinstance(data, p.PodObserved):
        was = phase.get(key)
        phase[key] = data.phase
        return was != data.phase, was
    if isinstance(data, p.PodRemoved):
        phase.pop(key, None)
        return True, None
    return isinstance(data, _ENTRY_TYPES), None


def _entry(record: Record, key: str, data: p.Payload, was: str | None) -> dict[str, Any] | None:
    """The entry of an event `_advance` found is one (`was`: the pod's phase before it)."""
    env = record.envelope
    base: dict[str, Any] = {"pod": key, **_at(record.position, env.logicaltime)}
    if isinstance(data, p.PodObserved):
        kind = "observed" if was is None else "phase"
        return {"kind": kind, **base, "phase": data.phase, "node": data.node_name or None,
                "queue": data.queue or None, "podgroup": data.podgroup}
    if isinstance(data, p.BindingDecided):
        return {"kind": "bindingDecided", **base, "node": data.node, "gpuDevices": list(data.gpu_devices),
                "cycleCut": env.basedon}
    if isinstance(data, p.PodPipelined):
        return {"kind": "pipelined", **base, "node": data.node, "waitingFor": list(data.waiting_for),
                "cycleCut": env.basedon}
    if isinstance(data, p.PodBound):
        return {"kind": "bound", **base, "node": data.node}
    if isinstance(data, p.PodBindFailed):
        return {"kind": "bindFailed", **base, "node": data.node, "message": data.message, "final": data.final}
    if isinstance(data, p.EvictionDecided):
        return {"kind": "evictionDecided", **base, "node": data.node, "action": data.action,
                "preemptor": data.preemptor or None, "reason": data.reason, "numbers": dict(data.numbers),
                "toNode": data.to_node or None, "cycleCut": env.basedon}
    if isinstance(data, p.PodEvicted):
        return {"kind": "evicted", **base, "node": data.node}
    if isinstance(data, p.PodEvictionFailed):
        return {"kind": "evictionFailed", **base, "node": data.node, "message": data.message}
    if isinstance(data, p.PodRemoved):
        return {"kind": "removed", **base}
    return None


# --- queues ----------------------------------------------------------------------------------


def explain_queue(records: Iterable[Record], name: str) -> dict[str, Any]:
    """Queue `name`'s numbers at every completed cycle's cut (fair share, allocation, quota,
    limit, request and pending demand per resource), consecutive equal cuts collapsed into one
    run. Raises ExplainError when the log never observed the queue."""
    state = ClusterState()
    runs: list[dict[str, Any]] = []
    open_cuts: dict[int, tuple[int, int, dict[str, Any] | None]] = {}
    seen = False
    span = _Span()
    announced: dict[str, list[p.Reason]] = {}
    for record in span.folded(records, state):
        env = record.envelope
        data = env.data
        if isinstance(data, p.QueueObserved) and data.name == name:
            seen = True
        elif isinstance(data, p.PodUnschedulable):
            announced[pod_key(data.namespace, data.name)] = list(data.reasons)
        elif isinstance(data, (p.BindingDecided, p.PodPipelined, p.PodRemoved)):
            announced.pop(pod_key(data.namespace, data.name), None)
        if isinstance(data, p.CycleStarted) and name in state.queues:
            shares, hint = cycle_shares(state, env.logicaltime)
            open_cuts[record.position] = (data.cycle, env.logicaltime, queue_numbers(state, shares, hint, name))
        elif isinstance(data, p.CycleCompleted) and env.basedon in open_cuts:
            cycle, ns, numbers = open_cuts.pop(env.basedon)
            at = _at(env.basedon, ns)
            if runs and runs[-1]["numbers"] == numbers:
                runs[-1].update(cycles=runs[-1]["cycles"] + 1, lastCycle=cycle, until=at)
            else:
                runs.append({"cycles": 1, "firstCycle": cycle, "lastCycle": cycle, "from": at, "until": at,
                             "numbers": numbers})
    if not seen:
        raise ExplainError(f"the log never observed a queue named {name!r}")
    return {"queue": name, "units": UNITS, "log": {"from": span.first_ns, "until": span.last_ns}, "runs": runs,
            "pending": waiting_jobs(state, name, announced, span.last_ns)}


def _cluster_place(cluster: dict[str, int], job_key: str) -> dict[str, int | None]:
    """The job's place in the cluster-wide order (`positions.cluster_order`, as job -> index):
    inCluster (None: not in it, e.g. its queue is missing) and clusterOf."""
    at = cluster.get(job_key)
    return {"inCluster": at + 1 if at is not None else None, "clusterOf": len(cluster)}



def waiting_jobs(state: ClusterState, name: str, announced: dict[str, list[p.Reason]],
                 now_ns: int, cluster: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The queue's waiting jobs at the end of the log, in the order a cycle takes them: each
    with its position in the queue and in the cluster-wide order of a cycle at `now_ns`, pods
    waiting, what it asks for, since when, and the last verdict announced for its first waiting
    pod (the rule and its numbers). `cluster`: `positions.cluster_ranks(state, now_ns)`
    when the caller has it (computed here otherwise)."""
    out: list[dict[str, Any]] = []
    order = queue_order(state, name)
    if cluster is None:
        cluster = cluster_ranks(state, now_ns) if order else {}
    hint = max((node.spec.gpu_memory_mib for node in state.nodes.values()), default=0)
    for n, key in enumerate(order, 1):
        job = state.jobs[key]
        waiting = sorted(entry.pod_key for entry in job.pending)
        reasons = next((announced[k] for k in waiting if k in announced), [])
        gpu = sum(pod_request(state.pods[k].spec, hint)[0] for k in waiting)
        out.append({"position": n, "of": len(order), **_cluster_place(cluster, key), "job": key,
                    "priority": job.priority,
                    "pods": waiting, "gpuRequested": gpu, "since": job.created_ns or None,
                    "rule": _rule(reasons), "reasons": _reasons_json(reasons)})
    return out


# --- text ------------------------------------------------------------------------------------


def _gpu(milli: int) -> str:
    return f"{milli / 1000:.1f}" if milli % 100 == 0 else f"{milli / 1000:.3f}"


def _queue_phrase(q: dict[str, Any] | None) -> str:
    if q is None:
        return ""
    g = q["gpu"]
    over = " (over fair share)" if g["allocated"] > g["fairShare"] else ""
    quota = "no quota" if g["quota"] < 0 else f"quota {_gpu(g['quota'])}"
    limit = "" if g["limit"] < 0 else f", limit {_gpu(g['limit'])}"
    return (f"queue {q['name']}: {_gpu(g['allocated'])} of {_gpu(g['fairShare'])} GPU fair share allocated"
            f"{over}; {quota}{limit}; pending {_gpu(g['pending'])} GPU")


def render_text(report: dict[str, Any]) -> list[str]:
    """One line per timeline entry: time since the log's first event, then what happened."""
    start = report["log"]["from"]
    subject = report["subject"]
    lines = [f"{subject['kind']} {subject['namespace']}/{subject['name']}"
             f" ({len(subject['pods'])} pod(s); queue {', '.join(subject['queues']) or '-'})"]

    def when(at: dict[str, Any]) -> str:
        return f"t+{format_duration(at['logicaltime'] - start):<10} @{at['position']:<7}"

    many = len(subject["pods"]) > 1
    for e in report["timeline"]:
        who = f"{e['pod']}: " if many and "pod" in e else ""
        kind = e["kind"]
        if kind == "wait":
            span = (f"cycle {e['firstCycle']}" if e["cycles"] == 1 else
                    f"cycles {e['firstCycle']}-{e['lastCycle']}, until t+"
                    f"{format_duration(e['until']['logicaltime'] - start)}")
            for v in e["verdicts"]:
                pods = f"{len(v['pods'])} pod(s) " if many else ""
                if v["status"] == "Pipelined":
                    what = f"onto {v['node']}, waiting for {', '.join(v['waitingFor']) or 'capacity'} to be released"
                elif v["rule"]:
                    what = f"{RULES.get(v['rule'], v['rule'])}: " + " | ".join(
                        f"{r['code']}: {r['message']}" for r in v["reasons"])
                else:
                    what = v.get("note", "pending")
                state = "pipelined" if v["status"] == "Pipelined" else "pending"
                lines.append(f"{when(e['from'])} {pods}{state} for {e['cycles']} cycle(s) ({span}): {what}")
            place, first_place = e.get("positionAtLast"), e.get("positionAtFirst")
            if place:
                moved = (f" (at the first of these cycles: #{first_place['inQueue']} of {first_place['of']}"
                         + (f", #{first_place['inCluster']} of {first_place['clusterOf']} tried"
                            if "inCluster" in first_place else "") + ")"
                         if first_place and first_place != place else "")
                tried = (f", #{place['inCluster']} of {place['clusterOf']} jobs the cycle tried"
                         if "inCluster" in place else "")
                lines.append(f"{'':30} #{place['inQueue']} of {place['of']} waiting in its queue{tried}{moved}")
            lines += _changes_text(e, start)
            q = _queue_phrase(e["queueAtLast"])
            if q:
                first = _queue_phrase(e["queueAtFirst"])
                lines.append(f"{'':30} {q}" + (f" (at the first of these cycles: {first.split(': ', 1)[1]})"
                                                 if first != q else ""))
        elif kind == "observed":
            lines.append(f"{when(e)} {who}observed {e['phase']}" + (f" on {e['node']}" if e["node"] else ""))
        elif kind == "phase":
            lines.append(f"{when(e)} {who}now {e['phase']}" + (f" on {e['node']}" if e["node"] else ""))
        elif kind == "bindingDecided":
            lines.append(f"{when(e)} {who}scheduler decided to bind it to {e['node']}"
                         + (f" (GPUs {e['gpuDevices']})" if e["gpuDevices"] else ""))
        elif kind == "pipelined":
            lines.append(f"{when(e)} {who}pipelined onto {e['node']}")
        elif kind == "bound":
            lines.append(f"{when(e)} {who}bound to {e['node']}")
        elif kind == "bindFailed":
            lines.append(f"{when(e)} {who}bind to {e['node']} failed: {e['message']}")
        elif kind == "evictionDecided":
            by = f" to make room for {e['preemptor']}" if e["preemptor"] else ""
            nums = ", ".join(f"{k}={v}" for k, v in sorted(e["numbers"].items()))
            what = f"moved from {e['node']} to {e['toNode']}" if e.get("toNode") else "evicted"
            lines.append(f"{when(e)} {who}{what} by {e['action']}{by}: {e['reason']}" + (f" [{nums}]" if nums else ""))
        elif kind == "evicted":
            lines.append(f"{when(e)} {who}evicted from {e['node']}")
        elif kind == "evictionFailed":
            lines.append(f"{when(e)} {who}eviction from {e['node']} failed: {e['message']}")
        elif kind == "removed":
            lines.append(f"{when(e)} {who}removed")
        elif kind == "atEnd":
            place = e.get("place")
            where = ""
            if place:
                where = f", #{place['inQueue']} of {place['of']} in its queue" + (
                    f", #{place['inCluster']} of {place['clusterOf']} in the cluster" if place["inCluster"] else "")
            lines.append(f"{when(e)} {who}at the log's end: {e['status']}" + (f" on {e['node']}" if e["node"] else "")
                         + where)
    return lines


def _changes_text(wait: dict[str, Any], start: int) -> list[str]:
    """A wait's changes of place, a line each with its time since `start` (the log's first), when
    its place changed; none when it stood still (the line above says where)."""
    changes = wait.get("positionChanges") or []
    if len(changes) < 2:
        return []
    elided = wait.get("positionChangesElided", 0)
    lines = [f"{'':30} its place changed {len(changes) - 1 + elided} time(s) in these cycles:"]
    for n, c in enumerate(changes):
        if elided and n == len(changes) // 2:  # (`PlaceChanges.add` drops from the middle)
            lines.append(f"{'':33}... {elided} more change(s) ...")
        place = c["place"]
        if place is None:
            where = f"not in the order of its queue {c['queue'] or '-'}"
        else:
            where = f"#{place['inQueue']} of {place['of']} in queue {c['queue'] or '-'}" + (
                f", #{place['inCluster']} of {place['clusterOf']} in the cluster" if "inCluster" in place else "")
        lines.append(f"{'':33}cycle {c['cycle']} (t+{format_duration(c['logicaltime'] - start)}): {where}")
    return lines


def _render_waiting(report: dict[str, Any]) -> list[str]:
    waiting = report.get("pending") or []
    if not waiting:
        return [f"queue {report['queue']}: no job waits at the end of the log"]
    end = report["log"]["until"]
    lines = [f"queue {report['queue']}: {len(waiting)} job(s) waiting at the end of the log, in the order a cycle "
             "takes them"]
    for w in waiting:
        since = f"waiting {format_duration((end - w['since']) // 10**9 * 10**9)}" if w["since"] and end else "waiting"
        why = f"{w['reasons'][0]['code']}: {w['reasons'][0]['message']}" if w["reasons"] else "no verdict recorded yet"
        cluster = f" (#{w['inCluster']} of {w['clusterOf']} in the cluster)" if w.get("inCluster") else ""
        lines.append(f"  #{w['position']} of {w['of']}{cluster}  {w['job']}  ({len(w['pods'])} pod(s), "
                     f"{_gpu(w['gpuRequested'])} GPU, priority {w['priority']}, {since}): {why}")
    return lines


def render_queue_text(report: dict[str, Any]) -> list[str]:
    start = report["log"]["from"]
    lines = [f"queue {report['queue']}: per cycle cut (GPU; CPU in cores; memory in GiB)",
             f"{'from':>12} {'until':>12} {'cycles':>6}  {'GPU alloc':>9} {'fair':>7} {'quota':>7} "
             f"{'pending':>7}  {'CPU alloc':>9} {'fair':>7}  {'mem alloc':>9} {'fair':>7}"]
    for r in report["runs"]:
        n = r["numbers"]
        if n is None:
            continue
        g, c, m = n["gpu"], n["cpu"], n["memory"]
        lines.append(
            f"{'t+' + format_duration(r['from']['logicaltime'] - start):>12} "
            f"{'t+' + format_duration(r['until']['logicaltime'] - start):>12} {r['cycles']:>6}  "
            f"{_gpu(g['allocated']):>9} {_gpu(g['fairShare']):>7} "
            f"{('-' if g['quota'] < 0 else _gpu(g['quota'])):>7} {_gpu(g['pending']):>7}  "
            f"{c['allocated'] / 1000:>9.1f} {c['fairShare'] / 1000:>7.1f}  "
            f"{m['allocated'] / 2**30:>9.1f} {m['fairShare'] / 2**30:>7.1f}")
    return lines + _render_waiting(report)
