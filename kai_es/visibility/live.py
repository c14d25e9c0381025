"""A log folded as it grows, holding what `kai-es serve` shows. Pure: records in, no I/O, no clock.

Contract:
- `LiveView.feed(record)` folds one record (in log order, each once, as the reducer requires);
  everything below is a function of the records fed so far. Feeding is incremental: the cost of
  a record does not depend on how many came before it.
- At each completed cycle (a CycleStarted whose CycleCompleted has been fed) the numbers of
  every queue at that cycle's cut become `last_cut`: per resource the quota, limit (-1: none),
  fair share, allocation and request of the division the cycle ran (`explain.cycle_shares`, the
  same numbers `kai-es explain --queue` reports for that cycle) and the pending demand (what
  its pending pods ask for; a parent sums its leaves), plus the pending pods and jobs per leaf.
  Quantities are integers: milli-GPU, milli-CPU, bytes.
- History for the charts: at most `HISTORY_POINTS` cut samples (time, per queue and resource —
  gpu, cpu, memory — the allocation, fair share and quota), each sample's numbers in one array
  of machine integers (Python integers for a sample with a number beyond 64 bits), its queues'
  rows shared with the samples before while the set of queues is unchanged. When full, every
  other sample is dropped and from then on only every `stride`-th completed cycle is sampled
  (the stride doubles), so memory stays bounded and the chart covers the log from its first
  cycle to its last. The last completed cycle is always the
  newest point.
- `announced`: the last verdict announced for each pod still waiting (dropped by its binding,
  pipelining or removal), as `explain --queue` keeps it.
- `recent`: the last `RECENT_EVENTS` records as (position, logical time, type, subject, payload),
  oldest first: what the decision-stream page filters.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.explain import CutNumbers, waiting_jobs
from kai_es.scheduling.fairshare import RESOURCES
from kai_es.state import ClusterState
from kai_es.state.reducer import apply, pod_key
from kai_es.visibility.positions import cluster_ranks
from kai_es.visibility.queue_metrics import pending_counts
from kai_es.visibility.timelines import JobTimelines

HISTORY_POINTS: Final = 512
RECENT_EVENTS: Final = 100_000


@dataclass(frozen=True, slots=True)
class Numbers:
    """One queue's numbers for one resource at a cut (see module docstring)."""

    quota: int
    limit: int
    fair_share: int
    allocated: int
    request: int
    pending: int


@dataclass(frozen=True, slots=True)
class QueueAtCut:
    name: str
    parent: str
    #: resource ("gpu", "cpu", "memory") -> its numbers
    resources: dict[str, Numbers]
    pending_pods: int
    pending_jobs: int


@dataclass(frozen=True, slots=True)
class Cut:
    """Every queue at one completed cycle's cut."""

    cycle: int
    position: int
    time_ns: int
    queues: dict[str, QueueAtCut]


#: the numbers a history sample keeps of each queue's resource, in this order
SAMPLED: Final = ("allocated", "fair_share", "quota")


@dataclass(frozen=True, slots=True)
class Point:
    """One history sample at a cut: per queue and resource (allocated, fair share, quota)."""

    cycle: int
    time_ns: int
    #: queue -> its row of `values` (shared by consecutive samples of the same queues)
    rows: Mapping[str, int] = field(default_factory=dict)
    #: per row, for each resource of `RESOURCES` in order, the `SAMPLED` numbers
    values: Sequence[int] = ()

    def of(self, queue: str, resource: str) -> tuple[int, int, int] | None:
        """`queue`'s (allocated, fair share, quota) of `resource` (gpu, cpu, memory) at this
        sample; None when the queue was not there."""
        row = self.rows.get(queue)
        if row is None:
            return None
        at = (row * len(RESOURCES) + RESOURCES.index(resource)) * len(SAMPLED)
        v = self.values
        return v[at], v[at + 1], v[at + 2]


def point_of(cut: Cut, rows: Mapping[str, int]) -> Point:
    """`cut` as a history sample; `rows` (queue -> row) is used when it names exactly the cut's
    queues in order, so consecutive samples share it."""
    if list(rows) != list(cut.queues):
        rows = {name: i for i, name in enumerate(cut.queues)}
    numbers = [getattr(q.resources[r], f) for q in cut.queues.values() for r in RESOURCES for f in SAMPLED]
    values: Sequence[int]
    try:
        values = array("q", numbers)
    except OverflowError:  # (a quota or time beyond 64 bits: a valid log may hold one)
        values = tuple(numbers)
    return Point(cut.cycle, cut.time_ns, rows, values)


@dataclass(slots=True)
class History:
    """Bounded samples over the whole log (see module docstring)."""

    limit: int = HISTORY_POINTS
    stride: int = 1
    points: list[Point] = field(default_factory=list)
    #: the newest cut when it was not a stride's sample (shown last; replaced by the next)
    tail: Point | None = None
    _seen: int = 0

    def add(self, point: Point) -> None:
        self._seen += 1
        if (self._seen - 1) % self.stride:
            self.tail = point
            return
        self.tail = None
        self.points.append(point)
        if len(self.points) >= self.limit:
            self.points = self.points[::2]
            self.stride *= 2  # point i is cut i * stride: the kept ones are still evenly spaced

    def all(self) -> list[Point]:
        return self.points + ([self.tail] if self.tail is not None else [])

    def newest(self) -> Point | None:
        return self.tail if self.tail is not None else (self.points[-1] if self.points else None)


class LiveView:
    """The folded state of a log and what the web view derives from it (module docstring)."""

    def __init__(self, *, history_points: int = HISTORY_POINTS, recent_events: int = RECENT_EVENTS,
                 keep_timelines: int | None = None) -> None:
        self.state = ClusterState()
        self.fed = 0
        self.first_ns = 0
        self.last_ns = 0
        #: (state position, the cluster-wide order then): one Session per position, not per queue
        self._cluster: tuple[int, dict[str, int]] | None = None
        self.last_cut: Cut | None = None
        self.history = History(limit=history_points)
        self.announced: dict[str, list[p.Reason]] = {}
        self.recent: deque[tuple[int, int, str, str, p.Payload]] = deque(maxlen=recent_events)
        self._open: dict[int, Cut] = {}
        self.timelines = JobTimelines(keep_timelines)

    def feed(self, record: Record) -> None:
        env = record.envelope
        data = env.data
        if not self.fed:
            self.first_ns = env.logicaltime
        self.fed += 1
        self.last_ns = env.logicaltime
        apply(self.state, record)
        self.recent.append((record.position, env.logicaltime, env.type, env.subject, data))
        if isinstance(data, p.PodUnschedulable):
            self.announced[pod_key(data.namespace, data.name)] = list(data.reasons)
        elif isinstance(data, (p.BindingDecided, p.PodPipelined, p.PodRemoved)):
            self.announced.pop(pod_key(data.namespace, data.name), None)
        elif isinstance(data, p.CycleStarted):
            numbers = CutNumbers(self.state, env.logicaltime)
            self._open[record.position] = cut_of(self.state, data.cycle, record.position, env.logicaltime, numbers)
            self.timelines.cycle_started(record, self.state, numbers)
            return
        elif isinstance(data, p.CycleCompleted):
            cut = self._open.pop(env.basedon if env.basedon is not None else -1, None)
            if cut is not None:
                self.last_cut = cut
                last = self.history.newest()
                self.history.add(point_of(cut, last.rows if last is not None else {}))
            self.timelines.cycle_completed(record, self.state)
            self.timelines.prune(self.state)
            return
        self.timelines.event(record, self.state)

    @property
    def position(self) -> int:
        """The position of the next record to feed (the number fed so far, from 0)."""
        return self.state.position + 1 if self.fed else 0

    def waiting(self, queue: str) -> list[dict[str, Any]]:
        """Leaf queue `queue`'s waiting jobs now, in the order a cycle takes them
        (`explain.waiting_jobs`: position, pods, request, since, rule and reasons)."""
        if queue not in self.state.queues:
            return []
        return waiting_jobs(self.state, queue, self.announced, self.last_ns, self._ranks())

    def _ranks(self) -> dict[str, int]:
        at = self.state.position
        if self._cluster is None or self._cluster[0] != at:
            self._cluster = (at, cluster_ranks(self.state, self.last_ns))
        return self._cluster[1]

    def timeline(self, target: str) -> dict[str, Any] | None:
        """Job `target`'s timeline over the records fed so far, as `kai-es explain` reports it,
        with each event entry left as its record's position (`explain.resolve`); None when it
        has none here (`JobTimelines.report`: then explain it from the log)."""
        return self.timelines.report(target, self.state, self.first_ns, self.last_ns, self._ranks)

    def queues_waiting(self) -> list[str]:
        """The leaf queues with a job waiting now, by name."""
        return sorted(q for q, jobs in self.state.pending_jobs.items() if jobs and q in self.state.queues)


def cut_of(state: ClusterState, cycle: int, position: int, time_ns: int, numbers: CutNumbers | None = None) -> Cut:
    """Every queue's numbers in `state` folded through the CycleStarted at `position`
    (`numbers`: the cut's, when the caller has them)."""
    if numbers is None:
        numbers = CutNumbers(state, time_ns)
    shares = numbers.shares()[0]
    pending = numbers.sums()  # a queue's pending demand: its own and its descendants' (a loop ends it)
    counts = pending_counts(state)
    parents = {name: q.spec.parent for name, q in state.queues.items()}
    queues: dict[str, QueueAtCut] = {}
    for name in sorted(parents):
        if name not in shares["gpu"]:
            continue
        resources = {}
        for r, resource in enumerate(RESOURCES):
            s = shares[resource][name]
            resources[resource] = Numbers(s.quota, s.limit, s.fair_share, s.allocated, s.request, pending[name][r])
        pods, jobs = counts.get(name, (0, 0))
        queues[name] = QueueAtCut(name, parents[name], resources, pods, jobs)
    return Cut(cycle, position, time_ns, queues)


def tree_order(queues: dict[str, str]) -> list[tuple[str, int]]:
    """(queue, depth) for queues given as name -> parent: each parent before its children,
    siblings by name; a queue whose parent is missing (or whose chain loops) is a root."""
    children: dict[str, list[str]] = {}
    roots = []
    for name in sorted(queues):
        parent = queues[name]
        if parent and parent in queues and parent != name and not _loops(queues, name):
            children.setdefault(parent, []).append(name)
        else:
            roots.append(name)
    out: list[tuple[str, int]] = []
    stack = [(r, 0) for r in reversed(roots)]
    while stack:
        name, depth = stack.pop()
        out.append((name, depth))
        stack.extend((c, depth + 1) for c in reversed(children.get(name, [])))
    return out


def _loops(queues: dict[str, str], name: str) -> bool:
    seen = {name}
    at = queues[name]
    while at in queues:
        if at in seen:
            return True
        seen.add(at)
        at = queues[at]
    return False
