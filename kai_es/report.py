"""Run summaries computed from the log alone (an audit consumer): per-queue wait times and
GPU-hours, cluster GPU utilization, and the allocation timeline behind the plot.

Contract: pure over records; integers throughout (times in ns, GPU in milli-GPU, GPU time in
milli-GPU·ns); percentages are derived only when rendered. The measured span runs from the first
record to the last, or to `end_ns` when the run went on past its last record (a simulation that
ran to its time limit with nothing more to log): allocations and capacity then hold until
`end_ns`. A pod still pending at the end waited from when it was first seen to the end: that
wait is counted (censored: a lower bound of its real wait) with the waits of its queue.
A parent queue shows the totals of its leaves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.state import ClusterState
from kai_es.state.reducer import apply, pod_key

_ALLOCATION_TYPES = (p.BindingDecided, p.PodBound, p.PodBindFailed, p.PodObserved, p.PodRemoved,
                     p.PodEvicted, p.EvictionDecided, p.NodeObserved, p.NodeRemoved, p.QueueObserved)


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

    @property
    def utilization_permille(self) -> int:
        if not self.gpu_capacity_milli_ns:
            return 0
        return self.gpu_allocated_milli_ns * 1000 // self.gpu_capacity_milli_ns


def summarize(records: Iterable[Record], *, end_ns: int | None = None) -> Summary:
    """Fold `records` and measure up to the last record's time or `end_ns` if that is later
    (see module docstring)."""
    state = ClusterState()
    s = Summary()
    first_seen: dict[str, int] = {}
    scheduled: set[str] = set()
    alloc: dict[str, int] = {}
    capacity = 0
    last_t: int | None = None
    for record in records:
        env = record.envelope
        t = env.logicaltime
        if last_t is None:
            s.start_ns = last_t = t
        if t > last_t:
            dt = t - last_t
            s.gpu_capacity_milli_ns += capacity * dt
            for q, milli in alloc.items():
                s.gpu_allocated_milli_ns += milli * dt
                s.queues[q].gpu_milli_ns += milli * dt
            last_t = t
        data = env.data
        apply(state, record)
        if isinstance(data, p.CycleStarted):
            s.cycles += 1
        if isinstance(data, p.PodObserved):
            uid = data.uid
            if uid not in first_seen and data.scheduler_name == "kai-scheduler":
                first_seen[uid] = t
                s.pods_seen += 1
        if isinstance(data, p.PodBound) and data.uid not in scheduled and data.uid in first_seen:
            scheduled.add(data.uid)
            pod = state.pods.get(pod_key(data.namespace, data.name))
            queue = state.jobs[pod.job_key].queue if pod is not None and pod.job_key in state.jobs else ""
            qs = s.queues.setdefault(queue, QueueSummary(queue))
            qs.scheduled += 1
            qs.waits_ns.append(t - first_seen[data.uid])
            s.pods_scheduled += 1
        if isinstance(data, _ALLOCATION_TYPES):
            new_capacity = sum(state.nodes[n].spec.gpus for n in state.node_names) * 1000
            if new_capacity != capacity:
                capacity = new_capacity
                if s.capacity and s.capacity[-1][0] == t:
                    s.capacity.pop()
                s.capacity.append((t, capacity))
            for name in sorted(state.queues):
                milli = state.queues[name].allocated_milli_gpu
                if alloc.get(name, 0) != milli or name not in s.queues:
                    s.queues.setdefault(name, QueueSummary(name))
                    if alloc.get(name) != milli:
                        s.timeline.append((t, name, milli))
                    alloc[name] = milli
    if last_t is not None and end_ns is not None and end_ns > last_t:
        dt = end_ns - last_t
        s.gpu_capacity_milli_ns += capacity * dt
        for q, milli in alloc.items():
            s.gpu_allocated_milli_ns += milli * dt
            s.queues[q].gpu_milli_ns += milli * dt
        last_t = end_ns
    s.end_ns = last_t or 0
    for key in sorted(state.pods):
        pod = state.pods[key]
        if pod.status == "Pending" and pod.spec.scheduler_name == "kai-scheduler":
            s.pending_at_end += 1
            queue = state.jobs[pod.job_key].queue if pod.job_key in state.jobs else ""
            qs = s.queues.setdefault(queue, QueueSummary(queue))
            qs.pending_at_end += 1
            seen = first_seen.get(pod.spec.uid)
            if seen is not None and pod.spec.uid not in scheduled:
                qs.waits_ns.append(s.end_ns - seen)
                qs.censored += 1
    _roll_up(s, state)
    return s


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
