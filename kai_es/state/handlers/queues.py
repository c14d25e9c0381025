"""Queues: QueueObserved and QueueRemoved.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.ingest import bounds
from kai_es.state.handlers.accounting import count_subgroup, queue_usage
from kai_es.state.handlers.jobs import pod_queue
from kai_es.state.handlers.seen import mark_seen
from kai_es.state.model import OCCUPYING, ClusterState, QueueState


def queue_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.QueueObserved = env.data
    if bounds.duration_problem("preemptMinRuntime", spec.preempt_min_runtime_ns) or \
            bounds.duration_problem("reclaimMinRuntime", spec.reclaim_min_runtime_ns):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    if state.resync_seen:
        mark_seen(state, "Queue", spec.name)
    q = state.queues.get(spec.name)
    state.stale_queues.add(spec.name)
    if q is None:
        state.queues[spec.name] = q = QueueState(spec=spec)
        if state.usage_resolution_ns:
            q.usage_since_ns = state.event_ns
        for key in sorted(state.pods):
            pod = state.pods[key]
            if pod.status in OCCUPYING and pod_queue(state, pod) == spec.name:
                job = state.jobs.get(pod.job_key)
                if job is not None:
                    job.occupying -= 1  # queue_usage counts it again
                    if pod.spec.subgroup:
                        count_subgroup(job, pod.spec.subgroup, -1)
                queue_usage(state, pod, +1)
    else:
        q.spec = spec


def queue_removed(state: ClusterState, env: Envelope) -> None:
    if state.queues.pop(env.data.name, None) is None:
        state.ignored_events += 1
        return
    state.stale_queues.add(env.data.name)
