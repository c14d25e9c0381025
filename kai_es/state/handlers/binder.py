"""The binder's outcomes: PodBound, PodBindFailed, PodEvicted, PodEvictionFailed.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.state.handlers.jobs import set_pending
from kai_es.state.handlers.move_holds import release_holds
from kai_es.state.handlers.occupancy import occupy, release
from kai_es.state.handlers.pods import set_status
from kai_es.state.keys import pod_key
from kai_es.state.model import BIND_BACKOFF_BASE_NS, BIND_BACKOFF_CAP_NS, OCCUPYING, ClusterState


def pod_bound(state: ClusterState, env: Envelope) -> None:
    data: p.PodBound = env.data
    pod = state.pods.get(f"{data.namespace}/{data.name}")  # (pod_key written out: a hot path)
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    pod.bind_failures = 0
    pod.backoff_until_ns = 0
    # the pod is marked changed (`state.stale_pods`) by set_status or occupy, else here
    if pod.status == "Binding" and pod.node == data.node:
        set_status(state, pod, "Running")
    elif pod.status in OCCUPYING and pod.node == data.node:
        state.stale_pods.add(pod.key)
    else:
        release(state, pod)
        occupy(state, pod, data.node, data.gpu_devices, (), "Running")
        set_pending(state, pod, False)
    if not pod.started_ns:
        pod.started_ns = env.logicaltime


def pod_bind_failed(state: ClusterState, env: Envelope) -> None:
    data: p.PodBindFailed = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status != "Binding":
        state.ignored_events += 1
        return
    release(state, pod)  # marks the pod (it was Binding)
    pod.bind_failures += 1
    if data.final:  # the binder gave up: no back-off to wait for, the pod is not picked again
        pod.bind_final_message = data.message or "bind failed"
        pod.backoff_until_ns = 0
    else:
        backoff = min(BIND_BACKOFF_CAP_NS, BIND_BACKOFF_BASE_NS << min(pod.bind_failures - 1, 20))
        pod.backoff_until_ns = env.logicaltime + backoff
    set_pending(state, pod, True)  # (kai-es/v15 on, set_pending leaves a terminating pod out)


def pod_evicted(state: ClusterState, env: Envelope) -> None:
    data: p.PodEvicted = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid:
        state.ignored_events += 1
        return
    if pod.status in ("Binding", "Running"):
        set_status(state, pod, "Releasing")


def pod_eviction_failed(state: ClusterState, env: Envelope) -> None:
    """The cluster refused the eviction: a pod still Releasing for that decision (and not
    terminating of its own accord) is Running again, so its capacity no longer counts as freeing."""
    data: p.PodEvictionFailed = env.data
    pod = state.pods.get(pod_key(data.namespace, data.name))
    if pod is None or pod.spec.uid != data.uid or pod.status != "Releasing" \
            or pod.decision_id != data.decision_id or pod.spec.terminating:
        state.ignored_events += 1
        return
    set_status(state, pod, "Running")
    if state.timed:  # kai-es/v3 on: for the victim search's back-off (v1/v2 digests unchanged)
        pod.eviction_refused_ns = env.logicaltime
        state.stale_pods.add(pod.key)
    if state.releases_failed_moves:  # kai-es/v11 on: no replacement comes for a move that failed
        release_holds(state, pod)
