"""`kai-es usage`: exact chargeback from the log — GPU, CPU and memory time per queue,
namespace or job, and GPU time over quota per queue.

Contract (pure over records; integers only — the report renders hours at the edge):
- A pod is charged from its `kai.binder.pod.bound` event (the cluster confirmed the bind) to the
  first later event after which the folded state no longer has it occupying capacity (it
  succeeded or failed, was removed, was evicted, or its node went away), at the rates the state
  gives it when bound: its exact GPU share (milli-GPU: whole devices × 1000, or its fraction, or
  its gpu-memory share of the device it got, times its devices), its CPU request (milli-CPU) and
  memory request (bytes).
- A pod still holding capacity when the log ends is charged up to the log's last event time.
- Amounts are integer products of rate and nanoseconds: milli-GPU·ns, milli-CPU·ns, byte·ns.
  One GPU-hour is 1000 × 3.6e12 milli-GPU·ns.
- `--from`/`--until` charge only the part of each interval inside [from, until).
- GPU over quota (per queue only): the integral over time of max(0, GPU held by the queue's
  charged pods (its descendants' included) − its GPU quota at that time); a queue without a GPU
  quota (-1) is never over it. A parent queue's row totals its descendants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.state import ClusterState
from kai_es.state.model import OCCUPYING
from kai_es.state.reducer import apply, pod_key

#: milli-GPU·ns in one GPU-hour
MILLI_NS_PER_HOUR = 1000 * 3_600_000_000_000
GROUPINGS = ("queue", "namespace", "job")


@dataclass(slots=True)
class Row:
    """One group's charge (see module docstring for units)."""

    name: str
    parent: str | None = None
    #: where the row sorts: the queue's path from its root (`root/child`), else its name
    path: str = ""
    pods: int = 0
    gpu_milli_ns: int = 0
    cpu_milli_ns: int = 0
    memory_byte_ns: int = 0
    #: None where over-quota is not defined (namespaces and jobs)
    gpu_over_quota_milli_ns: int | None = None


@dataclass(slots=True)
class _Open:
    uid: str
    start_ns: int
    gpu: int
    cpu: int
    memory: int
    groups: dict[str, str]


@dataclass(slots=True)
class Usage:
    by: str
    from_ns: int
    until_ns: int
    log_end_ns: int
    rows: dict[str, Row] = field(default_factory=dict)
    still_running: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"by": self.by, "from": self.from_ns, "until": self.until_ns, "logEnd": self.log_end_ns,
                "podsStillRunningAtEnd": self.still_running,
                "units": {"gpuMilliNs": "milli-GPU x ns", "cpuMilliNs": "milli-CPU x ns",
                          "memoryByteNs": "bytes x ns", "time": "ns since the Unix epoch"},
                "rows": [{"name": r.name, "parent": r.parent, "path": r.path or r.name, "pods": r.pods, "gpuMilliNs": r.gpu_milli_ns,
                          "gpuHours": hours(r.gpu_milli_ns, 1000),
                          "gpuOverQuotaMilliNs": r.gpu_over_quota_milli_ns,
                          "gpuHoursOverQuota": None if r.gpu_over_quota_milli_ns is None
                          else hours(r.gpu_over_quota_milli_ns, 1000),
                          "cpuMilliNs": r.cpu_milli_ns, "cpuHours": hours(r.cpu_milli_ns, 1000),
                          "memoryByteNs": r.memory_byte_ns, "memoryGiBHours": hours(r.memory_byte_ns, 2**30)}
                         for r in self.sorted_rows()]}

    def sorted_rows(self) -> list[Row]:
        """Rows by path (a parent queue right before its children), then name."""
        return sorted(self.rows.values(), key=lambda r: (r.path or r.name, r.name))


def hours(amount_ns: int, unit: int) -> str:
    """`amount_ns` (unit × ns) as hours of `unit`, a decimal string rounded half up to 6 places
    (exact integer arithmetic: no float rounding)."""
    scaled = (amount_ns * 1_000_000 * 2 + unit * 3_600_000_000_000) // (unit * 3_600_000_000_000 * 2)
    whole, frac = divmod(scaled, 1_000_000)
    return f"{whole}.{frac:06d}"


def _overlap(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


def usage(records: Iterable[Record], by: str = "queue", from_ns: int | None = None,
          until_ns: int | None = None) -> Usage:
    """The charge of every pod in `records`, grouped `by` queue, namespace or job (see module
    docstring). `from_ns`/`until_ns` None: the log's first / last event time."""
    if by not in GROUPINGS:
        raise ValueError(f"--by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    state = ClusterState()
    open_: dict[str, _Open] = {}
    closed: list[tuple[_Open, int]] = []
    # per leaf queue: GPU held by its open intervals; over-quota accumulated per queue
    held: dict[str, int] = {}
    over: dict[str, int] = {}
    spans: list[tuple[int, int, dict[str, int], dict[str, int]]] = []
    first: int | None = None
    last_t = 0
    for record in records:
        env = record.envelope
        t = env.logicaltime
        if first is None:
            first = last_t = t
        if t > last_t:
            if any(held.values()):
                spans.append((last_t, t, dict(held), _quotas(state)))
            last_t = t
        data = env.data
        apply(state, record)
        if isinstance(data, p.PodBound):
            key = pod_key(data.namespace, data.name)
            pod = state.pods.get(key)
            if (key not in open_ and pod is not None and pod.spec.uid == data.uid and pod.status in OCCUPYING
                    and pod.node == data.node):
                job = state.jobs.get(pod.job_key)
                queue = job.queue if job is not None else pod.spec.queue
                open_[key] = _Open(data.uid, t, pod.milli_gpu, pod.spec.requests.milli_cpu,
                                   pod.spec.requests.memory_bytes,
                                   {"queue": queue, "namespace": pod.spec.namespace, "job": pod.job_key})
                held[queue] = held.get(queue, 0) + pod.milli_gpu
            continue
        if not open_:
            continue
        if isinstance(data, (p.NodeRemoved, p.ResyncCompleted)):
            keys = sorted(open_)
        elif hasattr(data, "namespace") and hasattr(data, "name"):
            keys = [pod_key(data.namespace, data.name)]
        else:
            continue
        for key in keys:
            iv = open_.get(key)
            if iv is None:
                continue
            pod = state.pods.get(key)
            if pod is None or pod.spec.uid != iv.uid or pod.status not in OCCUPYING:
                del open_[key]
                closed.append((iv, t))
                held[iv.groups["queue"]] -= iv.gpu
    end = last_t
    start = first if first is not None else 0
    lo = from_ns if from_ns is not None else start
    hi = until_ns if until_ns is not None else end
    out = Usage(by=by, from_ns=lo, until_ns=hi, log_end_ns=end, still_running=len(open_))
    if any(held.values()):
        spans.append((last_t, end, dict(held), _quotas(state)))
    for iv, stop in closed + [(iv, end) for iv in open_.values()]:
        dt = _overlap(iv.start_ns, stop, lo, hi)
        if dt == 0 and not (iv.start_ns < hi and stop > lo):
            continue
        name = iv.groups[by]
        row = out.rows.setdefault(name, Row(name))
        row.pods += 1
        row.gpu_milli_ns += iv.gpu * dt
        row.cpu_milli_ns += iv.cpu * dt
        row.memory_byte_ns += iv.memory * dt
    if by == "queue":
        _queue_rollup(out, state, spans, lo, hi, over)
    return out


def _quotas(state: ClusterState) -> dict[str, int]:
    return {name: q.spec.gpu.quota for name, q in state.queues.items()}


def _chain(parents: dict[str, str], name: str) -> list[str]:
    out, seen = [], set()
    at = name
    while at and at not in seen:
        out.append(at)
        seen.add(at)
        at = parents.get(at, "")
    return out


def _queue_rollup(out: Usage, state: ClusterState, spans: list[tuple[int, int, dict[str, int], dict[str, int]]],
                  lo: int, hi: int, over: dict[str, int]) -> None:
    """Parents' rows (their descendants' totals) and every queue's GPU time over quota."""
    parents = {name: q.spec.parent for name, q in state.queues.items()}
    for name in sorted(out.rows):
        row = out.rows[name]
        for up in _chain(parents, name)[1:]:
            agg = out.rows.setdefault(up, Row(up))
            agg.pods += row.pods
            agg.gpu_milli_ns += row.gpu_milli_ns
            agg.cpu_milli_ns += row.cpu_milli_ns
            agg.memory_byte_ns += row.memory_byte_ns
    for name, row in out.rows.items():
        row.parent = parents.get(name) or None
        row.path = "/".join(reversed(_chain(parents, name)))
    for a, b, held, quotas in spans:
        dt = _overlap(a, b, lo, hi)
        if dt == 0:
            continue
        total: dict[str, int] = {}
        for leaf, milli in held.items():
            for q in _chain(parents, leaf) or [leaf]:
                total[q] = total.get(q, 0) + milli
        for q, milli in total.items():
            quota = quotas.get(q, -1)
            if quota >= 0 and milli > quota:
                over[q] = over.get(q, 0) + (milli - quota) * dt
    for name, row in out.rows.items():
        row.gpu_over_quota_milli_ns = over.get(name, 0)


def render_csv(report: Usage) -> str:
    """CSV with a header; hours as exact decimals, and the exact integers beside them."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([report.by, "parent", "pods", "gpu_hours", "gpu_hours_over_quota", "cpu_hours",
                "memory_gib_hours", "gpu_milli_ns", "gpu_over_quota_milli_ns", "cpu_milli_ns", "memory_byte_ns"])
    for r in report.sorted_rows():
        w.writerow([r.name, r.parent or "", r.pods, hours(r.gpu_milli_ns, 1000),
                    "" if r.gpu_over_quota_milli_ns is None else hours(r.gpu_over_quota_milli_ns, 1000),
                    hours(r.cpu_milli_ns, 1000), hours(r.memory_byte_ns, 2**30), r.gpu_milli_ns,
                    "" if r.gpu_over_quota_milli_ns is None else r.gpu_over_quota_milli_ns,
                    r.cpu_milli_ns, r.memory_byte_ns])
    return buf.getvalue()
