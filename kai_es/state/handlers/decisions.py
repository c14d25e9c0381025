"""The scheduler's decisions: cycles, BindingDecided, PodPipelined, EvictionDecided,
PodUnschedulable.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from collections.abc import Sequence

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.state.handlers.jobs import set_pending
from kai_es.state.handlers.move_holds import add_hold, drop_expired
from kai_es.state.handlers.occupancy import occupy
from kai_es.state.handlers.pods import set_status
from kai_es.state.handlers.tried_order import keep
from kai_es.state.keys import pod_key
from kai_es.state.model import ClusterState, Job
from kai_es.state.versions import fold_rules


def cycle_started(state: ClusterState, env: Envelope) -> None:
    state.cycle = env.data.cycle
    if state.move_holds:
        drop_expired(state, env.logicaltime)


def cycle_completed(state: ClusterState, env: Envelope) -> None:
    data: p.CycleCompleted = env.data
    state.completed_cycle = data.cycle
    keep(state, data.cycle, data.tried_order, fold_rules(env.policyversion).keeps_tried_order)


def binding_decided(state: ClusterState, env: Envelope) -> None:
    data: p.BindingDecided = env.data
    pod = state.pods.get(f"{data.namespace}/{data.name}")  # (pod_key written out: a hot path)
    if pod is None or pod.spec.uid != data.uid or pod.status != "Pending":
        state.ignored_events += 1
        return
    pod.decision_id = env.id  # the pod is marked by occupy
    pod.last_unschedulable = ""
    job = state.jobs.get(pod.job_key)  # (looked up once for occupy, set_pending and the back-off)
    occupy(state, pod, data.node, data.gpu_devices, data.gpu_groups, "Binding", job)
    set_pending(state, pod, False, job)
    if job is None:
        job = state.jobs[pod.job_key]
    if job.search_retry_ns:  # (a check per bind: the fold's hot path)
        _searches_succeeded(state, job)


def _searches_succeeded(state: ClusterState, job: Job) -> None:
    """A pod of the job was placed: its failed searches are forgotten (`backs_off_searches`)."""
    job.search_failures = job.search_retry_ns = 0
    state.stale_jobs.add(job.key)


def pod_pipelined(state: ClusterState, env: Envelope) -> None:
    data: p.PodPipelined = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    state.stale_pods.add(pod.key)
    pod.last_unschedulable = ""
    # (logs written before reservations existed must fold to the state they recorded)
    if fold_rules(env.policyversion).pipelined_nominates and pod.status == "Pending":
        pod.nominated_node = data.node
        state.nominated.add(pod.key)
    job = state.jobs[pod.job_key]
    if job.search_retry_ns:
        _searches_succeeded(state, job)


def eviction_decided(state: ClusterState, env: Envelope) -> None:
    data: p.EvictionDecided = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status not in ("Binding", "Running"):
        state.ignored_events += 1
        return
    pod.decision_id = env.id  # the pod is marked by set_status
    set_status(state, pod, "Releasing")
    if data.to_node and fold_rules(env.policyversion).holds_moves:
        add_hold(state, pod, data.to_node, env.logicaltime)
    if state.timed:
        job = state.jobs[pod.job_key]
        job.last_evicted_ns = env.logicaltime
        state.stale_jobs.add(job.key)


def pod_unschedulable(state: ClusterState, env: Envelope) -> None:
    data: p.PodUnschedulable = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    state.stale_pods.add(pod.key)
    pod.last_unschedulable = reasons_fingerprint(data.reasons)
    if state.timed and fold_rules(env.policyversion).backs_off_searches:
        _search_failed(state, pod.job_key, data.reasons)


def _search_failed(state: ClusterState, job_key: str, reasons: Sequence[p.Reason]) -> None:
    """Keep the most failed searches a reason of the verdict states, and its retry time, on the
    job (`backs_off_searches`)."""
    job = state.jobs.get(job_key)
    best: tuple[int, int] | None = None
    for r in reasons:
        retry = r.numbers.get("retry_at_ns")
        failures = r.numbers.get("search_failures")
        if retry is None or failures is None or not (0 < retry < 2**63 and 0 < failures < 2**31):
            continue  # not a failed search's numbers (or not ones a scheduler writes)
        if best is None or (failures, retry) > best:
            best = (failures, retry)
    if job is None or best is None or best == (job.search_failures, job.search_retry_ns):
        return
    job.search_failures, job.search_retry_ns = best
    state.stale_jobs.add(job.key)


def reasons_fingerprint(reasons: Sequence[p.Reason]) -> str:
    """What makes two unschedulable verdicts 'the same' (so an unchanged one is not re-announced)."""
    # (lists, not generators: str.join makes a list of a generator first; every unschedulable
    # pod of every cycle comes here)
    return "|".join([r.code + ":" + ",".join([f"{k}={v}" for k, v in sorted(r.numbers.items())])
                     for r in reasons])
