"""Run summaries computed from the log alone (an audit consumer): per-queue wait times and
GPU-hours, cluster GPU utilization, and the allocation timeline behind the plot.

Contract: pure over records; integers throughout (times in ns, GPU in milli-GPU, GPU time in
milli-GPU·ns); percentages are derived only when rendered. The measured span runs from the first
record to the last, or to `end_ns` when the run went on past its last record (a simulation that
ran to its time limit with nothing more to log): allocations and capacity then hold until
`end_ns`. A pod still pending at the end waited from when it was first seen to the end: that
wait is counted (censored: a lower bound of its real wait) with the waits of its queue.
A parent queue shows the totals of its leaves.

At every cycle's cut (its CycleStarted) the summary also samples what the scheduler saw: each
queue's GPU fair share and quota (the division the cycle ran, `kai_es.explain.cycle_shares`),
and the GPUs stranded by fragmentation (`kai_es.fragmentation`). The fair
share error is the sum over leaf queues of |allocated - fair share| GPU, integrated over time
with the fair share of the latest cut; stranded GPU time likewise. At the end the summary holds
the fragmentation of the final state and the last `PodUnschedulable` reason codes of the pods
still pending. Jobs (pod groups) get an outcome each: when their first pod arrived and was
first bound (None: never), for comparing runs.
"""

from __future__ import annotations

import heapq

from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.timefmt import rfc3339
from kai_es.fragmentation import Fragmentation, analyse
from kai_es.explain import cycle_shares
from kai_es.scheduling.plan import VerificationError
from kai_es.state import ClusterState
from kai_es.state.model import QueueState
from kai_es.state.reducer import apply, pod_key

_ALLOCATION_TYPES = (p.BindingDecided, p.PodBound, p.PodBindFailed, p.PodObserved, p.PodRemoved,
                     p.PodEvicted, p.EvictionDecided, p.NodeObserved, p.NodeRemoved, p.QueueObserved)
#: the same, for a dispatch on `type(data)` (payload classes have no subclasses)
_ALLOCATION_KINDS = frozenset(_ALLOCATION_TYPES)


@dataclass(slots=True)
class QueueSummary:
    name: str
    parent: str = ""
    scheduled: int = 0
    waits_ns: list[int] = field(default_factory=list)
    gpu_milli_ns: int = 0
    pending_at_end: int = 0
    #: how many of `waits_ns` are censored (pods still pending at the end, waited up to the end)
    censored: int = 0
    evictions: int = 0

    @property
    def max_wait_ns(self) -> int | None:
        return max(self.waits_ns) if self.waits_ns else None

    def percentile_ns(self, pct: int) -> int | None:
        """Nearest-rank percentile of the wait times, censored ones included (None when no pod
        of the queue was scheduled or left waiting)."""
        if not self.waits_ns:
            return None
        ordered = sorted(self.waits_ns)
        rank = max(1, -(-pct * len(ordered) // 100))
        return ordered[rank - 1]


@dataclass(slots=True)
class Summary:
    start_ns: int = 0
    end_ns: int = 0
    pods_seen: int = 0
    pods_scheduled: int = 0
    pending_at_end: int = 0
    cycles: int = 0
    gpu_capacity_milli_ns: int = 0
    gpu_allocated_milli_ns: int = 0
    queues: dict[str, QueueSummary] = field(default_factory=dict)
    #: (time ns, queue, allocated milli-GPU) whenever a queue's allocation changed
    timeline: list[tuple[int, str, int]] = field(default_factory=list)
    #: (time ns, cluster capacity milli-GPU) whenever it changed
    capacity: list[tuple[int, int]] = field(default_factory=list)
    #: (cut time ns, queue, GPU fair share milli, GPU quota milli or -1) whenever one changed
    fair: list[tuple[int, str, int, int]] = field(default_factory=list)
    #: (cut time ns, stranded milli-GPU) whenever it changed
    stranded: list[tuple[int, int]] = field(default_factory=list)
    fair_error_milli_ns: int = 0
    stranded_milli_ns: int = 0
    evictions: int = 0
    fragmentation: Fragmentation = field(default_factory=Fragmentation)
    #: reason code -> pending pods whose last PodUnschedulable named it (at the end)
    pending_reasons: dict[str, int] = field(default_factory=dict)
    #: job key (namespace/podgroup) -> its outcome
    jobs: dict[str, JobOutcome] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, object]:
        """Pickled (a what-if's worker hands its summary to the what-if) with the jobs and the
        timeline as columns of plain values: 200,000 job outcomes and 400,000 timeline tuples
        pickled and unpickled one object at a time cost 1.1 s and 0.75 s on the benchmark."""
        state: dict[str, object] = {name: getattr(self, name) for name in self.__slots__}
        jobs = self.jobs.values()
        state["jobs"] = (list(self.jobs), [j.queue for j in jobs], [j.arrived_ns for j in jobs],
                         [j.started_ns for j in jobs], [j.pods for j in jobs], [j.evictions for j in jobs])
        timeline = self.timeline
        state["timeline"] = ([e[0] for e in timeline], [e[1] for e in timeline], [e[2] for e in timeline])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if name not in ("jobs", "timeline"):
                setattr(self, name, value)
        keys, queues, arrived, started, pods, evictions = state["jobs"]
        self.jobs = {k: JobOutcome(q, a, s, n, e) for k, q, a, s, n, e in zip(keys, queues, arrived, started, pods, evictions)}
        self.timeline = list(zip(*state["timeline"]))

    @property
    def utilization_permille(self) -> int:
        if not self.gpu_capacity_milli_ns:
            return 0
        return self.gpu_allocated_milli_ns * 1000 // self.gpu_capacity_milli_ns


@dataclass(slots=True)
class JobOutcome:
    queue: str
    arrived_ns: int
    started_ns: int | None = None
    pods: int = 0
    evictions: int = 0


def summarize(records: Iterable[Record], *, end_ns: int | None = None, verify: bool = False) -> Summary:
    """Fold `records` and measure up to the last record's time or `end_ns` if that is later
    (see module docstring). `verify` (verification mode): every queue allocation the observer
    takes as unchanged is checked, else `VerificationError`."""
    state = ClusterState()
    observer = SummaryObserver(state, verify=verify)
    for record in records:
        apply(state, record)
        observer.observe(record)
    return observer.finish(end_ns)


class SummaryObserver:
    """`summarize` for a fold someone else runs: call `observe(record)` right after each record
    is applied to `state` (every record of the log, in order), then `finish`. Lets a run be
    summarised from the fold its scheduler does anyway."""

    def __init__(self, state: ClusterState, *, verify: bool = False) -> None:
        self._end: list[int | None] = [None]
        self._gen = _observe(state, self._end, verify)
        next(self._gen)

    def observe(self, record: Record) -> None:
        self._gen.send(record)

    def finish(self, end_ns: int | None = None) -> Summary:
        self._end[0] = end_ns
        try:
            self._gen.send(None)
        except StopIteration as stop:
            result: Summary = stop.value
            return result
        raise AssertionError("the summary observer did not finish")


def _accrue(s: Summary, dt: int, capacity: int, alloc: dict[str, int], fair_error: int,
            stranded: int) -> None:
    """Add `dt` ns of the current capacity, allocation, fair-share error and stranded GPUs."""
    s.gpu_capacity_milli_ns += capacity * dt
    for q, milli in alloc.items():
        s.gpu_allocated_milli_ns += milli * dt
        s.queues[q].gpu_milli_ns += milli * dt
    s.fair_error_milli_ns += fair_error * dt
    s.stranded_milli_ns += stranded * dt


def _observe(state: ClusterState, end: list[int | None], verify: bool) -> Generator[None, Record | None, Summary]:
    s = Summary()
    first_seen: dict[str, int] = {}
    scheduled: set[str] = set()
    alloc: dict[str, int] = {}
    capacity = 0
    last_t: int | None = None
    fair: dict[str, tuple[int, int]] = {}
    leaves: set[str] = set()
    stranded = 0
    last_reasons: dict[str, tuple[str, ...]] = {}
    # time passed at the current capacity, allocation, fair shares and stranded GPUs, not yet
    # added: accrued once before any of them changes (the sums are linear in the time), not at
    # every record whose time moved on
    unaccrued = 0
    queue_names: list[str] = []
    # `state.allocation_changes` when `alloc` was last brought up to date with every queue
    seen_changes = -2
    # payload classes are final (no payload subclasses another), so `type(data) is C` is
    # `isinstance(data, C)`: one dispatch per record instead of a chain of isinstance calls
    allocation_types = _ALLOCATION_KINDS
    pods, jobs, queues_of = state.pods, state.jobs, s.queues
    while True:
        record = yield
        if record is None:
            break
        env = record.envelope
        t = env.logicaltime
        if last_t is None:
            s.start_ns = last_t = t
        if t > last_t:
            unaccrued += t - last_t
            last_t = t
        data = env.data
        kind = type(data)
        if kind is p.CycleStarted:
            if unaccrued:
                _accrue(s, unaccrued, capacity, alloc, _fair_error(alloc, fair, leaves), stranded)
                unaccrued = 0
            s.cycles += 1
            leaves = _leaves(state)
            _sample_fair(s, state, t, fair)
            now_stranded = analyse(state, shapes=False).stranded_milli
            if now_stranded != stranded or not s.stranded:
                s.stranded.append((t, now_stranded))
                stranded = now_stranded
            continue
        if kind is p.PodUnschedulable:
            assert isinstance(data, p.PodUnschedulable)
            last_reasons[data.uid] = tuple(sorted({r.code for r in data.reasons}))
            continue
        if kind not in allocation_types:
            continue
        if kind is p.PodEvicted:
            assert isinstance(data, p.PodEvicted)
            s.evictions += 1
            pod = pods.get(pod_key(data.namespace, data.name))
            if pod is not None and pod.job_key in jobs:
                queue = jobs[pod.job_key].queue
                s.queues.setdefault(queue, QueueSummary(queue)).evictions += 1
                if pod.job_key in s.jobs:
                    s.jobs[pod.job_key].evictions += 1
        elif kind is p.PodObserved:
            assert isinstance(data, p.PodObserved)
            uid = data.uid
            if uid not in first_seen and data.scheduler_name == state.scheduler_name:
                first_seen[uid] = t
                s.pods_seen += 1
                pod = pods.get(pod_key(data.namespace, data.name))
                if pod is not None and pod.job_key in jobs:
                    job = s.jobs.get(pod.job_key)
                    if job is None:
                        job = s.jobs[pod.job_key] = JobOutcome(queue=jobs[pod.job_key].queue, arrived_ns=t)
                    job.pods += 1
                    if data.node_name and job.started_ns is None:
                        job.started_ns = t  # first seen running (bound before the log began): no wait
        elif kind is p.PodBound:
            assert isinstance(data, p.PodBound)
            if data.uid not in scheduled and data.uid in first_seen:
                scheduled.add(data.uid)
                pod = pods.get(pod_key(data.namespace, data.name))
                queue = jobs[pod.job_key].queue if pod is not None and pod.job_key in jobs else ""
                qs = s.queues.setdefault(queue, QueueSummary(queue))
                qs.scheduled += 1
                qs.waits_ns.append(t - first_seen[data.uid])
                s.pods_scheduled += 1
                if pod is not None and pod.job_key in s.jobs and s.jobs[pod.job_key].started_ns is None:
                    s.jobs[pod.job_key].started_ns = t
        # an allocation type: capacity changes only with nodes (summing every node per pod event
        # cost O(nodes))
        node_event = kind is p.NodeObserved or kind is p.NodeRemoved
        new_capacity = (sum(state.nodes[n].spec.gpus for n in state.node_names) * 1000
                        if node_event else capacity)
        queues = state.queues
        moved = state.allocation_changes - seen_changes
        seen_changes += moved
        if len(queue_names) != len(queues) or kind is p.QueueObserved:
            queue_names = sorted(queues)
            moved = 2  # (a queue is new: every queue is looked at)
        # `alloc` matched every queue, each with its summary, when the reducer's count was last
        # seen: since then none changed, or (one change) only the queue the reducer names
        if moved == 0:
            changed = []
        elif moved == 1:  # `_allocation_changes` of the named queue, written out (most records)
            name = state.allocation_changed
            named = queues.get(name)
            changed = [] if named is None or (alloc.get(name, 0) == named.allocated_milli_gpu and name in queues_of) \
                else [(name, named.allocated_milli_gpu)]
        else:
            changed = _allocation_changes(queue_names, queues, alloc, queues_of)
        if verify and changed != _allocation_changes(queue_names, queues, alloc, queues_of):
            raise VerificationError(f"record {record.position}: a queue's allocation changed and the reducer "
                                    "did not count it, or named another queue")
        if not changed and new_capacity == capacity:
            continue
        if unaccrued and (new_capacity != capacity or any(alloc.get(name, 0) != milli for name, milli in changed)):
            _accrue(s, unaccrued, capacity, alloc, _fair_error(alloc, fair, leaves), stranded)
            unaccrued = 0
        if new_capacity != capacity:
            capacity = new_capacity
            if s.capacity and s.capacity[-1][0] == t:
                s.capacity.pop()
            s.capacity.append((t, capacity))
        for name, milli in changed:
            queues_of.setdefault(name, QueueSummary(name))
            if alloc.get(name) != milli:
                s.timeline.append((t, name, milli))
            alloc[name] = milli
    end_ns = end[0]
    if last_t is not None and end_ns is not None and end_ns > last_t:
        unaccrued += end_ns - last_t
        last_t = end_ns
    if unaccrued:
        _accrue(s, unaccrued, capacity, alloc, _fair_error(alloc, fair, leaves), stranded)
    s.end_ns = last_t or 0
    for key in sorted(state.pods):
        pod = state.pods[key]
        if pod.status == "Pending" and pod.spec.scheduler_name == state.scheduler_name:
            s.pending_at_end += 1
            queue = state.jobs[pod.job_key].queue if pod.job_key in state.jobs else ""
            qs = s.queues.setdefault(queue, QueueSummary(queue))
            qs.pending_at_end += 1
            seen = first_seen.get(pod.spec.uid)
            if seen is not None and pod.spec.uid not in scheduled:
                qs.waits_ns.append(s.end_ns - seen)
                qs.censored += 1
            for code in last_reasons.get(pod.spec.uid, ("(no verdict yet)",)):
                s.pending_reasons[code] = s.pending_reasons.get(code, 0) + 1
    s.fragmentation = analyse(state)
    _roll_up(s, state)
    return s


def _allocation_changes(names: list[str], queues: dict[str, QueueState], alloc: dict[str, int],
                        summaries: dict[str, QueueSummary]) -> list[tuple[str, int]]:
    """(queue, its allocated milli-GPU) of each of `names` whose allocation is not `alloc`'s or
    that has no summary yet, in `names`' order."""
    return [(name, milli) for name in names
            if alloc.get(name, 0) != (milli := queues[name].allocated_milli_gpu) or name not in summaries]


def _leaves(state: ClusterState) -> set[str]:
    parents = {q.spec.parent for q in state.queues.values()}
    return {name for name in state.queues if name not in parents}


def _fair_error(alloc: dict[str, int], fair: dict[str, tuple[int, int]], leaves: set[str]) -> int:
    """Sum over leaf queues of |allocated - fair share| milli-GPU."""
    return sum(abs(alloc.get(q, 0) - fair[q][0]) for q in sorted(leaves) if q in fair)


def _sample_fair(s: Summary, state: ClusterState, t: int, fair: dict[str, tuple[int, int]]) -> None:
    """Record each queue's GPU fair share and quota at this cut when they changed: the division
    the cycle ran (`kai_es.explain.cycle_shares`: the policy's GPU unit, time-based fair share
    when the config turns it on)."""
    shares = cycle_shares(state, t)[0]["gpu"]
    for name in sorted(shares):
        share = shares[name]
        now = (share.fair_share, share.quota)
        if fair.get(name) != now:
            fair[name] = now
            s.fair.append((t, name, share.fair_share, share.quota))


def _roll_up(s: Summary, state: ClusterState) -> None:
    """Give every parent queue the totals of its leaves (scheduled, waits, GPU time, pending)."""
    parents = {name: q.spec.parent for name, q in state.queues.items()}
    for name in sorted(s.queues):
        s.queues[name].parent = parents.get(name, "")
    for name in sorted(s.queues):
        leaf = s.queues[name]
        seen = {name}
        parent = parents.get(name, "")
        while parent and parent not in seen:
            seen.add(parent)
            up = s.queues.setdefault(parent, QueueSummary(parent, parent=parents.get(parent, "")))
            up.scheduled += leaf.scheduled
            up.waits_ns.extend(leaf.waits_ns)
            up.gpu_milli_ns += leaf.gpu_milli_ns
            up.pending_at_end += leaf.pending_at_end
            up.censored += leaf.censored
            up.evictions += leaf.evictions
            parent = parents.get(parent, "")


def plot(summary: Summary, path: str) -> None:
    """A PNG of GPUs allocated per queue over time (stacked), with cluster capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queues = sorted(q for q in summary.queues if any(e[1] == q and e[2] for e in summary.timeline))
    times = sorted({summary.start_ns, summary.end_ns, *(e[0] for e in summary.timeline)})
    hours = [(t - summary.start_ns) / 3.6e12 for t in times]
    series: dict[str, list[float]] = {}
    for q in queues:
        events = [(t, v) for t, name, v in summary.timeline if name == q]
        values, i, cur = [], 0, 0
        for t in times:
            while i < len(events) and events[i][0] <= t:
                cur = events[i][1]
                i += 1
            values.append(cur / 1000)
        series[q] = values
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    if queues:
        ax.stackplot(hours, *[series[q] for q in queues], labels=queues, step="post", alpha=0.85)
    if summary.capacity:
        cap_t = [(t - summary.start_ns) / 3.6e12 for t, _ in summary.capacity] + [hours[-1]]
        cap_v = [c / 1000 for _, c in summary.capacity] + [summary.capacity[-1][1] / 1000]
        ax.step(cap_t, cap_v, where="post", color="black", linewidth=1.2, label="capacity")
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPUs allocated")
    ax.set_title("GPU allocation per queue")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def step_values(events: list[tuple[int, int]], times: list[int]) -> list[int]:
    """The value of a step function (`events`: (time, value) sorted) at each of `times`."""
    out, i, cur = [], 0, 0
    for t in times:
        while i < len(events) and events[i][0] <= t:
            cur = events[i][1]
            i += 1
        out.append(cur)
    return out


def timeline_by_queue(summary: Summary) -> dict[str, list[tuple[int, int]]]:
    """The summary's timeline split by queue: queue -> its (time, milli-GPU) steps, in order
    (for `queue_series` over many queues: one pass instead of one per queue)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for t, q, v in summary.timeline:
        steps = out.get(q)
        if steps is None:
            steps = out[q] = []
        steps.append((t, v))
    return out


def queue_series(summary: Summary, queue: str, by_queue: dict[str, list[tuple[int, int]]] | None = None
                 ) -> dict[str, list[tuple[int, int]]]:
    """(time, milli-GPU) steps of one queue: `allocated` (a parent: the sum of its leaves),
    `fairShare` and `quota` (-1: none). `by_queue`: the summary's `timeline_by_queue`, if made."""
    below = {queue} | _descendants(summary, queue)
    if by_queue is None:
        own = [(t, q, v) for t, q, v in summary.timeline if q in below]
    else:  # each queue's steps in time order, merged (at one time, the order does not change the sum)
        own = list(heapq.merge(*([(t, q, v) for t, v in by_queue.get(q, ())] for q in sorted(below)),
                               key=lambda e: e[0]))
    if len(below) == 1:
        allocated = [(t, v) for t, _, v in own]
    else:
        current: dict[str, int] = {}
        allocated = []
        for t, q, v in own:
            current[q] = v
            total = sum(current.values())
            if allocated and allocated[-1][0] == t:
                allocated[-1] = (t, total)
            else:
                allocated.append((t, total))
    return {"allocated": allocated,
            "fairShare": [(t, v) for t, q, v, _ in summary.fair if q == queue],
            "quota": [(t, v) for t, q, _, v in summary.fair if q == queue]}


def _descendants(summary: Summary, queue: str) -> set[str]:
    out: set[str] = set()
    for name in summary.queues:
        seen, parent = {name}, summary.queues[name].parent
        while parent and parent not in seen:
            if parent == queue:
                out.add(name)
                break
            seen.add(parent)
            parent = summary.queues[parent].parent if parent in summary.queues else ""
    return out


def fragmentation_lines(summary: Summary) -> list[str]:
    """The terminal lines of the end-of-run fragmentation section."""
    f = summary.fragmentation
    if not f.capacity_milli:
        return []
    lines = [f"at the end: {f.idle_milli / 1000:g} of {f.capacity_milli / 1000:g} GPUs idle, "
             f"{f.pending_pods} pods pending ({f.pending_gpu_pods} need GPUs)"]
    if f.pending_gpu_pods:
        for s in f.shapes:
            gang = f", gangs of {s.min_gang}" + (f"-{s.max_gang}" if s.max_gang != s.min_gang else "") \
                if s.max_gang > 1 else ""
            lines.append(f"  waiting: {s.pods} pods of {s.jobs} jobs needing {s.need()} per pod{gang}; "
                         f"the free GPUs fit {s.slots} such pods")
    cause = f.cause()
    if cause:
        lines.append(cause)
    if summary.pending_reasons:
        lines.append("pending pods' last reasons: " + ", ".join(
            f"{code} {n}" for code, n in sorted(summary.pending_reasons.items(), key=lambda kv: (-kv[1], kv[0]))))
    span = summary.end_ns - summary.start_ns
    if span > 0:
        lines.append(f"over the run: {summary.stranded_milli_ns / 3.6e15:.1f} GPU-hours stranded (idle while "
                     f"no waiting GPU pod could use them, sampled each cycle); fair-share error "
                     f"{summary.fair_error_milli_ns / span / 1000:.1f} GPU on average (sum over leaf queues of "
                     "|allocated - fair share|)")
    return lines


def summary_json(s: Summary) -> dict[str, Any]:
    """`summary.json`: integers only (ns, milli-GPU, milli-GPU·ns); null for an undefined wait."""
    f = s.fragmentation
    return {
        "start": rfc3339(s.start_ns), "end": rfc3339(s.end_ns), "podsSeen": s.pods_seen,
        "podsScheduled": s.pods_scheduled, "pendingAtEnd": s.pending_at_end, "cycles": s.cycles,
        "gpuUtilizationPermille": s.utilization_permille, "evictions": s.evictions,
        "waits": {"counting": "per pod, first observed to first bound; a pod never bound counts its wait "
                              "to the end of the run (censored: a lower bound), included in the percentiles"},
        "fairShareErrorMilliNs": s.fair_error_milli_ns, "strandedGpuMilliNs": s.stranded_milli_ns,
        "fragmentation": {
            "capacityMilliGpu": f.capacity_milli, "idleMilliGpu": f.idle_milli,
            "strandedMilliGpu": f.stranded_milli, "cordonedIdleMilliGpu": f.cordoned_idle_milli,
            "nodesByWholeFreeGpus": {str(k): v for k, v in sorted(f.nodes_by_free.items())},
            "largestWholeFree": f.largest_free_whole, "pendingPods": f.pending_pods,
            "pendingGpuPods": f.pending_gpu_pods, "fittingGpuPods": f.fitting_gpu_pods,
            "shapes": [{"wholeGpus": sh.whole, "milliGpu": sh.milli, "pods": sh.pods, "jobs": sh.jobs,
                        "minGang": sh.min_gang, "maxGang": sh.max_gang, "fitting": sh.fitting,
                        "slots": sh.slots} for sh in f.shapes],
            "cause": f.cause() or None,
            "pendingReasons": dict(sorted(s.pending_reasons.items())),
        },
        "queues": {name: {"parent": q.parent or None, "scheduled": q.scheduled, "waitP50Ns": q.percentile_ns(50),
                          "waitP95Ns": q.percentile_ns(95), "waitMaxNs": q.max_wait_ns,
                          "waitsCensored": q.censored, "gpuMilliNs": q.gpu_milli_ns,
                          "pendingAtEnd": q.pending_at_end, "evictions": q.evictions,
                          "gpu": {k: [list(step) for step in v] for k, v in queue_series(s, name).items()}}
                   for name, q in sorted(s.queues.items())},
    }


def style_panel(ax: Any, queue: str, ylabel: str, *, legend: bool, legend_at: str = "upper right") -> None:
    """The look of one queue's panel in the report's and the what-if's per-queue figures."""
    ax.set_title(queue or "(no queue)", fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc=legend_at)


def plot_fair_share(summary: Summary, path: str) -> None:
    """A PNG with one panel per queue: GPUs allocated, fair share (at each cycle) and quota
    over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queues = sorted(q for q in summary.queues if q)
    if not queues:
        queues = [""]
    cols = 2 if len(queues) > 1 else 1
    rows = -(-len(queues) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 2.6 * rows), dpi=100, squeeze=False)
    times = sorted({summary.start_ns, summary.end_ns, *(e[0] for e in summary.timeline), *(e[0] for e in summary.fair)})
    hours = [(t - summary.start_ns) / 3.6e12 for t in times]
    for i, q in enumerate(queues):
        ax = axes[i // cols][i % cols]
        series = queue_series(summary, q)
        ax.step(hours, [v / 1000 for v in step_values(series["allocated"], times)], where="post", label="allocated")
        ax.step(hours, [v / 1000 for v in step_values(series["fairShare"], times)], where="post", label="fair share")
        quota = step_values(series["quota"], times)
        if any(v >= 0 for v in quota):
            ax.step(hours, [v / 1000 if v >= 0 else float("nan") for v in quota], where="post",
                    linestyle="--", color="gray", label="quota")
        style_panel(ax, q, "GPUs", legend=i == 0)
    for j in range(len(queues), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("GPU allocation against fair share and quota, per queue (hours from start)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
