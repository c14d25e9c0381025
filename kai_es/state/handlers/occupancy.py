"""Node occupancy: a pod taking (or giving back) its node's capacity and GPU devices, with the
label, scalar-resource and releasing indexes of that node.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from collections.abc import Iterable

from kai_es.events import payloads as p
from kai_es.state.handlers.accounting import queue_usage
from kai_es.state.model import OCCUPYING, ClusterState, Job, NodeState, PodState
from kai_es.state.quantities import device_count, device_milli_on


def _assign_devices(node: NodeState, pod: PodState, milli: int, count: int) -> tuple[int, ...]:
    """Devices for an observed running pod whose devices the cluster did not state."""
    if count == 0:
        return ()
    n = len(node.device_used)
    known = node.group_device(pod.spec.gpu_group) if pod.spec.gpu_group else None
    if known is not None and count == 1:
        return (known,)
    chosen = [i for i in range(n) if node.device_used[i] + milli <= 1000][:count]
    if len(chosen) < count:  # the cluster over-committed: record the truth, invariants flag it
        chosen += [i for i in range(n) if i not in chosen][: count - len(chosen)]
    return tuple(chosen)


def occupy(state: ClusterState, pod: PodState, node_name: str, devices: Iterable[int],
            groups: Iterable[str], status: str, job: Job | None = None, *, trust_devices: bool = False) -> None:
    """The pod takes `node_name`'s capacity (`devices`, or devices picked for it when they do not
    match its request) with `status`, and its usage goes to its queue. `job`, when the caller
    has it at hand, must be the pod's job: it saves `queue_usage` the lookup."""
    node = state.nodes.get(node_name)
    spec = pod.spec
    state.stale_pods.add(pod.key)
    pod.node = node_name
    pod.status = status  # type: ignore[assignment]
    if pod.nominated_node:
        pod.nominated_node = ""
        state.nominated.discard(pod.key)
    if node is None:  # bound to a node we do not know (yet): tracked, not counted
        pod.devices = tuple(devices)
        pod.gpu_groups = tuple(groups)
        pod.device_milli = 0
        queue_usage(state, pod, +1, job)
        return
    gpu = spec.gpu
    shared = bool(gpu.fraction_milli or gpu.gpu_memory_mib)
    if gpu.whole:  # device_milli_on and device_count of the common whole-device request, written out
        milli, count = 1000, gpu.whole
    else:
        milli = device_milli_on(node.spec, gpu)
        count = device_count(gpu)
    device_used = node.device_used
    devs = tuple(devices)
    if devs and (min(devs) < 0 or max(devs) >= len(device_used)):  # indexes the node does not have
        devs = tuple(d for d in devs if 0 <= d < len(device_used))
    if len(devs) != count and not (trust_devices and devs):
        devs = _assign_devices(node, pod, milli, count)
    if not devs:
        milli = 0
    pod.devices, pod.device_milli = devs, milli
    grp = tuple(groups)
    if not grp and devs and shared:
        grp = (spec.gpu_group,) if spec.gpu_group else tuple(f"{node_name}/gpu{d}" for d in devs)
    pod.gpu_groups = grp
    requests = spec.requests
    node.used_milli_cpu += requests.milli_cpu
    node.used_memory_bytes += requests.memory_bytes
    node.used_pods += 1
    if spec.scalar_requests:
        _scalar_usage(node, spec, +1)
    if shared:
        for i, d in enumerate(devs):
            device_used[d] += milli
            node.device_sharers[d] += 1
            if i < len(grp) and grp[i]:
                held = node.group_holders.setdefault(grp[i], {})
                held[d] = held.get(d, 0) + 1
    else:
        for d in devs:
            device_used[d] += milli
    node.pods.add(pod.key)
    state.dirty_nodes.add(node_name)
    state.stale_nodes.add(node_name)
    if status == "Releasing":
        releasing(node, pod, +1)
    queue_usage(state, pod, +1, job)


def release(state: ClusterState, pod: PodState, job: Job | None = None) -> None:
    """An occupying pod gives its node's capacity and its queue's usage back and is Pending
    (nothing else); `job` as in `occupy`."""
    if pod.status not in OCCUPYING:
        return
    state.stale_pods.add(pod.key)
    queue_usage(state, pod, -1, job)
    node = state.nodes.get(pod.node)
    if node is not None and pod.key in node.pods:
        spec = pod.spec
        if pod.status == "Releasing":
            releasing(node, pod, -1)
        requests = spec.requests
        node.used_milli_cpu -= requests.milli_cpu
        node.used_memory_bytes -= requests.memory_bytes
        node.used_pods -= 1
        if spec.scalar_requests:
            _scalar_usage(node, spec, -1)
        device_used, milli = node.device_used, pod.device_milli
        if spec.gpu.fraction_milli or spec.gpu.gpu_memory_mib:
            groups = pod.gpu_groups
            for i, d in enumerate(pod.devices):
                device_used[d] -= milli
                node.device_sharers[d] -= 1
                if i < len(groups) and groups[i]:
                    held = node.group_holders.get(groups[i])
                    if held is not None and d in held:
                        held[d] -= 1
                        if held[d] == 0:
                            del held[d]
                        if not held:
                            del node.group_holders[groups[i]]
        else:
            for d in pod.devices:
                device_used[d] -= milli
        node.pods.discard(pod.key)
        state.dirty_nodes.add(pod.node)
        state.stale_nodes.add(pod.node)
    pod.status = "Pending"
    pod.node = ""
    pod.devices = ()
    pod.gpu_groups = ()
    pod.device_milli = 0


def _scalar_usage(node: NodeState, spec: p.PodObserved, sign: int) -> None:
    used = node.used_scalar
    for resource, amount in spec.scalar_requests.items():
        total = used.get(resource, 0) + sign * amount
        if total:
            used[resource] = total
        else:
            used.pop(resource, None)


def index_labels(state: ClusterState, pod: PodState, sign: int) -> None:
    """Add (+1) or remove (-1) the pod in the label and affinity-holder indexes."""
    spec, key = pod.spec, pod.key
    index = state.pods_by_label
    for label, value in spec.labels.items():
        if sign > 0:
            index.setdefault(label, {}).setdefault(value, set()).add(key)
        else:
            values = index.get(label)
            if values is not None and value in values:
                values[value].discard(key)
                if not values[value]:
                    del values[value]
                    if not values:
                        del index[label]
    if spec.pod_affinity or spec.pod_anti_affinity or spec.preferred_pod_affinity or \
            spec.preferred_pod_anti_affinity:
        if sign > 0:
            state.affinity_pods.add(key)
        else:
            state.affinity_pods.discard(key)


def releasing(node: NodeState, pod: PodState, sign: int) -> None:
    spec = pod.spec
    node.releasing_milli_cpu += sign * spec.requests.milli_cpu
    node.releasing_memory_bytes += sign * spec.requests.memory_bytes
    node.releasing_pods += sign
    for d in pod.devices:
        node.device_releasing[d] += sign * pod.device_milli
