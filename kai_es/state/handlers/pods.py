"""Pods: PodObserved and PodRemoved, a pod's status, placement reconciliation, dropping a pod.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.ingest import bounds
from kai_es.state.handlers.accounting import count_subgroup
from kai_es.state.handlers.jobs import (
    job_for,
    new_job,
    refresh_job,
    refresh_or_drop_job,
    set_pending,
    track_stale,
)
from kai_es.state.handlers.move_holds import claim_hold
from kai_es.state.handlers.occupancy import index_labels, occupy, release, releasing
from kai_es.state.handlers.seen import mark_seen
from kai_es.state.keys import pod_key
from kai_es.state.model import OCCUPYING, ClusterState, Job, PodState
from kai_es.state.quantities import MAX_QUANTITY


def _out_of_bounds_pod(spec: p.PodObserved) -> bool:
    # on every pod observation: written to cost a few comparisons (no generator unless needed)
    g, r = spec.gpu, spec.requests
    if not (0 <= r.milli_cpu <= MAX_QUANTITY and 0 <= r.memory_bytes <= MAX_QUANTITY):
        return True
    if g.fraction_milli or g.gpu_memory_mib or g.fraction_devices != 1:
        if not (0 <= g.whole <= bounds.MAX_POD_GPUS and 0 <= g.fraction_milli < 1000
                and 0 <= g.gpu_memory_mib <= bounds.MAX_GPU_MEMORY_MIB
                and 1 <= g.fraction_devices <= bounds.MAX_POD_GPUS):
            return True
    elif not 0 <= g.whole <= bounds.MAX_POD_GPUS:  # whole devices only (or none): the common request
        return True
    if spec.scalar_requests and not all(0 <= v <= MAX_QUANTITY for v in spec.scalar_requests.values()):
        return True
    return (spec.preemption_delay_ns is not None or spec.staleness_grace_ns is not None) and bool(
        bounds.duration_problem("preemption delay", spec.preemption_delay_ns)
        or bounds.duration_problem("staleness grace period", spec.staleness_grace_ns, signed=True))


def pod_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.PodObserved = env.data
    key = f"{spec.namespace}/{spec.name}"  # (pod_key written out: every pod observation)
    pod = state.pods.get(key)
    if pod is not None:
        old_spec = pod.spec
        same_shape = old_spec.requests == spec.requests and old_spec.gpu == spec.gpu \
            and old_spec.scalar_requests == spec.scalar_requests
    else:
        same_shape = False
    # quantities already accepted for this pod need no second look (phase-only observations)
    if not same_shape and _out_of_bounds_pod(spec):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    if state.resync_seen:
        mark_seen(state, "Pod", key)
    state.stale_pods.add(key)
    phase = spec.phase
    if phase == "Succeeded" or phase == "Failed":
        finished: Job | None = None
        if state.timed and phase == "Succeeded":
            # a gang with a succeeded pod is finishing, not stale (the pod need not have been seen
            # before: a relist reports finished pods too)
            finished = state.jobs.get(pod.job_key if pod is not None else pod_key(spec.namespace, spec.podgroup))
            if finished is not None:
                finished.succeeded += 1
                state.stale_jobs.add(finished.key)
                track_stale(state, finished)
        if pod is not None:
            drop_pod(state, pod, finished)
        return
    if pod is not None and pod.spec.uid != spec.uid:
        drop_pod(state, pod)  # same name, new incarnation
        pod = None
        same_shape = False
    if pod is not None and pod.bind_final_message and pod.spec != spec:
        pod.bind_final_message = ""  # the pod changed: the binder's final verdict may not hold
        pod.bind_failures = 0
    job: Job | None = None  # the pod's job where a branch below has it at hand
    if pod is None:
        if spec.node_name:
            # seen running at once (bound elsewhere, a relist, or its name's new incarnation):
            # the node may now hold, under a key it held before, another job's victim
            state.victim_order_changed.add(key)
        job_key = f"{spec.namespace}/{spec.podgroup}"  # (pod_key, as above)
        pod = PodState(key, spec, job_key)  # positional: keyword calls to these dataclasses cost more
        state.pods[key] = pod
        job = state.jobs.get(job_key)
        if job is None:
            job = new_job(state, job_key, spec, key)
        else:
            job.members.add(key)
            refresh_job(state, job)
        if state.move_holds:
            claim_hold(state, pod, env.logicaltime)
        if spec.labels or spec.pod_affinity or spec.pod_anti_affinity or spec.preferred_pod_affinity \
                or spec.preferred_pod_anti_affinity:
            index_labels(state, pod, +1)
    elif not same_shape or ((spec.podgroup != pod.spec.podgroup or spec.namespace != pod.spec.namespace)
                            and _moved_job(pod, spec)):  # (the check written out first: most pods stay)
        status, node, devices, groups = pod.status, pod.node, pod.devices, pod.gpu_groups
        release(state, pod)
        set_pending(state, pod, False)
        old_job = state.jobs[pod.job_key]
        old_job.members.discard(key)
        index_labels(state, pod, -1)
        pod.spec = spec
        index_labels(state, pod, +1)
        job = job_for(state, spec)
        job.members.add(key)
        if job.key != pod.job_key and (spec.node_name or node):
            # a pod now counts as another job's victim where it runs (elsewhere, it came or went)
            state.victim_order_changed.add(key)
        pod.job_key = job.key
        refresh_or_drop_job(state, old_job)
        refresh_job(state, job)
        if status in OCCUPYING and not spec.node_name:
            occupy(state, pod, node, devices, groups, status, job)
    else:
        old = pod.spec
        if old.labels != spec.labels or ((old.pod_affinity or old.pod_anti_affinity or old.preferred_pod_affinity
                                          or old.preferred_pod_anti_affinity or spec.pod_affinity
                                          or spec.pod_anti_affinity or spec.preferred_pod_affinity
                                          or spec.preferred_pod_anti_affinity)
                                         and (old.pod_affinity, old.pod_anti_affinity, old.preferred_pod_affinity,
                                              old.preferred_pod_anti_affinity)
                                         != (spec.pod_affinity, spec.pod_anti_affinity,
                                             spec.preferred_pod_affinity, spec.preferred_pod_anti_affinity)):
            index_labels(state, pod, -1)
            pod.spec = spec
            index_labels(state, pod, +1)
        pod.spec = spec
        if old.subgroup != spec.subgroup and pod.status in OCCUPYING:
            job = state.jobs[pod.job_key]
            if old.subgroup:
                count_subgroup(job, old.subgroup, -1)
            if spec.subgroup:
                count_subgroup(job, spec.subgroup, +1)
            if state.subgroup_stale and job.spec is not None and job.spec.subgroups:
                state.occupancy_changed.add(job.key)  # an occupying pod moved between sub-groups
        if old.queue != spec.queue or old.priority_class != spec.priority_class or \
                old.priority != spec.priority or old.created_ns != spec.created_ns:
            job = state.jobs[pod.job_key]
            refresh_job(state, job)  # a field the job takes from its pods
    _reconcile_placement(state, pod, spec, env.logicaltime, job)


def _reconcile_placement(state: ClusterState, pod: PodState, spec: p.PodObserved, now: int,
                         job: Job | None = None) -> None:
    """Make the pod's placement agree with what the cluster reports.

    A pod with a node is bound (Running), or Releasing when terminating or when an eviction was
    decided. A pod without a node keeps an in-flight Binding or Releasing; a Running pod the
    cluster no longer places stays Running where bindings hold (`state.bindings_hold`: the
    observation is older than its binding, as the API server never unbinds a pod), else goes
    back to Pending. `job`: the pod's job, when the caller has it (None: looked up where needed).
    """
    if spec.node_name:
        status = "Releasing" if spec.terminating or pod.status == "Releasing" else "Running"
        if pod.status in OCCUPYING and pod.node == spec.node_name:
            if status != pod.status:
                set_status(state, pod, status)
        else:
            release(state, pod, job)
            occupy(state, pod, spec.node_name, spec.gpu_devices,
                   (spec.gpu_group,) if spec.gpu_group else (), status, job)
        if not pod.started_ns:
            # the pod's own start time when the cluster reports one (a pod running before it was
            # first observed), else the time it was observed running
            pod.started_ns = spec.started_ns if 0 < spec.started_ns <= now else now
        if pod.pending_key is not None:
            set_pending(state, pod, False, job)
    elif pod.status == "Binding" or pod.status == "Releasing" or (pod.status == "Running" and state.bindings_hold):
        if pod.pending_key is not None:
            set_pending(state, pod, False, job)
    else:
        if pod.status == "Running":
            release(state, pod, job)
        set_pending(state, pod, not spec.terminating, job)


def _moved_job(pod: PodState, new: p.PodObserved) -> bool:
    """Whether observing `new` moves the pod to another job (then it is re-seated from
    scratch, as when its resource shape changed). `pod.job_key` is always the key of
    `pod.spec`'s namespace and podgroup, so the new key is built only when one of those differs."""
    old = pod.spec
    if old.podgroup == new.podgroup and old.namespace == new.namespace:
        return False
    return pod.job_key != pod_key(new.namespace, new.podgroup)


def set_status(state: ClusterState, pod: PodState, status: str) -> None:
    node = state.nodes.get(pod.node)
    state.stale_pods.add(pod.key)
    if node is not None:
        state.dirty_nodes.add(pod.node)
        state.stale_nodes.add(pod.node)
        if pod.status == "Releasing":
            releasing(node, pod, -1)
        if status == "Releasing":
            releasing(node, pod, +1)
    pod.status = status  # type: ignore[assignment]


def drop_pod(state: ClusterState, pod: PodState, job: Job | None = None) -> None:
    """Remove the pod: its capacity, pending entry and labels go, and its job is refreshed, or
    forgotten when nothing holds it any more. `job`: the pod's job when the caller has it at
    hand (None: looked up)."""
    if job is None:
        job = state.jobs.get(pod.job_key)  # (looked up once for release and set_pending)
    release(state, pod, job)
    if pod.pending_key is not None:
        set_pending(state, pod, False, job)
    spec = pod.spec
    if spec.labels or spec.pod_affinity or spec.pod_anti_affinity or spec.preferred_pod_affinity \
            or spec.preferred_pod_anti_affinity:
        index_labels(state, pod, -1)
    pods = state.pods
    key = pod.key
    del pods[key]
    if pod.nominated_node:
        state.nominated.discard(key)
    state.victim_order_changed.discard(key)  # (what it held, it holds no more: looked at as gone)
    stale_pods = state.stale_pods
    stale_pods.add(key)
    if job is None:
        job = state.jobs[pod.job_key]
    job.members.discard(key)
    refresh_or_drop_job(state, job)
    marks = len(stale_pods) + len(state.stale_jobs)
    if marks > 4096 and marks > 2 * (len(pods) + len(state.jobs)) + 4096:  # (the cheap half first)
        _forget_hashes(state)


def _forget_hashes(state: ClusterState) -> None:
    """Drop the marks and have the next digest re-hash everything. Bounds the stale sets when
    nothing asks for the incremental digest (a log of a policy with another digest, a long cold
    fold): else they would keep the key of every pod that ever existed. Only removals make them
    outgrow the live state, so `drop_pod` checks."""
    state.hashes.complete = False
    for marks in (state.stale_nodes, state.stale_pods, state.stale_jobs, state.stale_queues,
                  state.stale_pending, state.stale_priority_classes, state.stale_topologies,
                  state.stale_resync, state.stale_namespaces, state.stale_claims, state.stale_volumes,
                  state.stale_config_maps):
        marks.clear()


def pod_removed(state: ClusterState, env: Envelope) -> None:
    data: p.PodRemoved = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or (data.uid and pod.spec.uid != data.uid):
        state.ignored_events += 1
        return
    drop_pod(state, pod)
