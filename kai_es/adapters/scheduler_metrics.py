"""The scheduler's dashboard metrics, on its process's Prometheus registry (`/metrics` of
`kai_es.adapters.status_http`): the per-queue numbers of `kai_es.visibility.queue_metrics`
after every cycle, evictions and failed victim searches counted from the cycle's decisions, how
long each action took and the upkeep before each cycle, and how long pods waited from first
observed to first bound.

prometheus-client (already the exposition's library) keeps the label sets and renders the text
format; this module only decides names and values. Names follow Prometheus' conventions: base
units (GPUs, CPU cores, bytes, seconds), `_total` on counters (the library adds it),
`_seconds` on durations. Quantities per resource share one metric with a `resource` label
(gpu: GPUs, cpu: cores, memory: bytes); -1 is unlimited, as in the Queue spec. A queue that
leaves the state leaves the gauges.

With the process's `ProcessStatus` it also publishes, after each cycle whose fold took a new
tried order, KAI's `/get-job-order` document (`kai_es.visibility.job_order`).

Contract: an observer only (`kai_es.ports.CycleObserver`): it reads the folded state and the
decisions and changes neither; waits are measured in the log's logical time (so a replayed or
simulated run gives the same numbers), durations in the process's monotonic time. One instance
lives as long as the process: a later session of it (after the log's connection failed) folds
again from its snapshot, and records already told are not counted twice; pods a restored state
holds pending are taken as waiting since their creation time (their first observation was
folded by another process).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kai_es.adapters.status_http import ProcessStatus
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.scheduling.config import SchedulerConfig
from kai_es.state.keys import pod_key
from kai_es.state.model import ClusterState
from kai_es.visibility.job_order import encoded
from kai_es.visibility.queue_metrics import decision_counts, parent_of, pending_counts, queue_samples, to_base_units

#: wait buckets, seconds: a few seconds to a day
WAIT_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0,
                       12 * 3600.0, 24 * 3600.0)
ACTION_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUEUE_LABELS: Final = ("queue", "parent", "resource")
#: gauge name -> (help, the QueueSample field it shows)
QUEUE_GAUGES: Final = {
    "kai_es_queue_quota": ("Queue quota (KAI's deserved); -1: unlimited", "quota"),
    "kai_es_queue_limit": ("Queue limit; -1: none", "limit"),
    "kai_es_queue_fair_share": ("Queue fair share, as the policy version divides it", "fair_share"),
    "kai_es_queue_allocated": ("What the queue's pods hold (Binding, Running, Releasing)", "allocated"),
    "kai_es_queue_requested": ("Allocated plus what its pending pods ask for, capped by its limit", "requested"),
    "kai_es_queue_nonpreemptible_allocated": ("What the queue's non-preemptible jobs hold", "nonpreemptible"),
}


class SchedulerMetrics:
    """The scheduler process's queue, decision and wait metrics (see module docstring)."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic,
                 status: ProcessStatus | None = None) -> None:
        self.clock = clock
        #: where the last cycle's job order is published for `/get-job-order` (None: nowhere)
        self.status = status
        if status is not None:
            status.serves_job_order = True
        self._order_of: list[str] | None = None
        self.queue_gauges = {name: Gauge(name, help_, QUEUE_LABELS, registry=registry)
                             for name, (help_, _) in QUEUE_GAUGES.items()}
        self.pending_pods = Gauge("kai_es_queue_pending_pods", "Pods waiting in the queue", ["queue", "parent"],
                                  registry=registry)
        self.pending_jobs = Gauge("kai_es_queue_pending_jobs", "Jobs with pods waiting in the queue",
                                  ["queue", "parent"], registry=registry)
        self.evictions = Counter("kai_es_evictions",
                                 "Evictions decided, by the action that decided them and the victim's queue",
                                 ["action", "queue", "parent"], registry=registry)
        self.failed_searches = Counter(
            "kai_es_failed_victim_searches",
            "Victim searches reported failed, by the waiting pod's queue (a verdict counts when a pod's "
            "reasons change)", ["action", "reason", "queue", "parent"], registry=registry)
        self.action_seconds = Histogram("kai_es_action_duration_seconds", "One action of one cycle",
                                        ["action"], buckets=ACTION_BUCKETS, registry=registry)
        self.upkeep_seconds = Histogram(
            "kai_es_scheduler_upkeep_duration_seconds",
            "The upkeep of a cycle's derived data (digest hashes, node tables, kept bounds) run before it is due",
            buckets=ACTION_BUCKETS, registry=registry)
        self.wait_seconds = Histogram(
            "kai_es_pod_wait_seconds", "From a pod first observed pending to its first bind (log time)",
            ["queue", "parent"], buckets=WAIT_BUCKETS, registry=registry)
        self._queue_labels: set[tuple[str, str, str]] = set()
        self._queues: set[tuple[str, str]] = set()
        #: pod uid -> (key, logical time first observed pending): pods not yet bound
        self._waiting: dict[str, tuple[str, int]] = {}
        self._action: tuple[str, float] | None = None
        #: the last log position told (`on_fold`): a later session of the process folds again
        #: from its snapshot, and what it folds again was counted already
        self._told = -1
        #: whether the pods a restored state holds pending were taken as waiting (`_seed_waiting`)
        self._seeded = False

    # -- CycleObserver --------------------------------------------------------------------------

    def on_fold(self, record: Record, state: ClusterState) -> None:
        if record.position <= self._told:
            return  # (folded again by a later session: counted when first told)
        self._told = record.position
        data = record.envelope.data
        if isinstance(data, p.PodObserved):
            if not data.node_name and data.phase == "Pending" and data.uid not in self._waiting:
                self._waiting[data.uid] = (pod_key(data.namespace, data.name), record.envelope.logicaltime)
            elif data.phase in ("Succeeded", "Failed"):
                self._waiting.pop(data.uid, None)
        elif isinstance(data, p.PodBound):
            first = self._waiting.pop(data.uid, None)
            if first is not None:
                pod = state.pods.get(first[0])
                job = state.jobs.get(pod.job_key) if pod is not None else None
                queue = job.queue if job is not None else ""
                wait_ns = max(0, record.envelope.logicaltime - first[1])
                self.wait_seconds.labels(queue=queue, parent=parent_of(state, queue)).observe(wait_ns / 1e9)
        elif isinstance(data, p.PodRemoved):
            if data.uid:
                self._waiting.pop(data.uid, None)

    def on_action(self, name: str) -> None:
        now = self.clock()
        if self._action is not None:
            self.action_seconds.labels(action=self._action[0]).observe(now - self._action[1])
        self._action = (name, now) if name else None

    def on_upkeep(self, seconds: float) -> None:
        self.upkeep_seconds.observe(seconds)

    def on_cycle(self, state: ClusterState, config: SchedulerConfig, decisions: Sequence[Envelope]) -> None:
        if not self._seeded:
            self._seed_waiting(state)
        labels: set[tuple[str, str, str]] = set()
        for sample in queue_samples(state, config):
            key = (sample.queue, sample.parent, sample.resource)
            labels.add(key)
            for name, (_, field) in QUEUE_GAUGES.items():
                self.queue_gauges[name].labels(*key).set(to_base_units(sample.resource, getattr(sample, field)))
        for gone in self._queue_labels - labels:
            for gauge in self.queue_gauges.values():
                gauge.remove(*gone)
        self._queue_labels = labels
        queues: set[tuple[str, str]] = set()
        for queue, (pods, jobs) in pending_counts(state).items():
            named = (queue, parent_of(state, queue))
            queues.add(named)
            self.pending_pods.labels(*named).set(pods)
            self.pending_jobs.labels(*named).set(jobs)
        for left in self._queues - queues:  # (a queue gone, or moved under another parent)
            self.pending_pods.remove(*left)
            self.pending_jobs.remove(*left)
        self._queues = queues
        self._publish_order(state, config)
        evictions, failures = decision_counts(decisions)
        for (action, queue), n in sorted(evictions.items()):
            self.evictions.labels(action=action, queue=queue, parent=parent_of(state, queue)).inc(n)
        for (action, reason, queue), n in sorted(failures.items()):
            self.failed_searches.labels(action=action, reason=reason, queue=queue,
                                        parent=parent_of(state, queue)).inc(n)

    def _seed_waiting(self, state: ClusterState) -> None:
        """Take the pods `state` holds not yet bound (pending, or decided and binding) that this
        process was not told of as waiting since their creation: a scheduler restored from a
        snapshot never folded their first observation, and their wait would otherwise never be
        measured (once per process, after its first cycle)."""
        self._seeded = True
        waiting = self._waiting
        for key, pod in state.pods.items():  # (in any order: each pod's entry is its own)
            if pod.status in ("Pending", "Binding") and pod.spec.created_ns > 0 and pod.spec.uid not in waiting:
                waiting[pod.spec.uid] = (key, pod.spec.created_ns)

    def _publish_order(self, state: ClusterState, config: SchedulerConfig) -> None:
        """KAI's `/get-job-order` body, made again only when the fold took a new order."""
        status = self.status
        if status is None or (state.tried_order is self._order_of and status.job_order is not None):
            return
        body = encoded(state)
        self._order_of = state.tried_order
        if body is None:
            status.job_order = None
            status.job_order_missing = (f"policy {config.policy_version} records no order (kai-es/v13 on)"
                                        if not state.tried_order_cycle and state.completed_cycle
                                        else "no cycle has completed yet")
            return
        status.job_order = body
