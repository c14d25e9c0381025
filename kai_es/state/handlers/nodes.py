"""Nodes: NodeObserved and NodeRemoved (a removed node's pods stop occupying it).

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.ingest import bounds
from kai_es.state import usage
from kai_es.state.handlers.accounting import queue_usage
from kai_es.state.handlers.jobs import set_pending
from kai_es.state.handlers.occupancy import occupy, release
from kai_es.state.handlers.seen import mark_seen
from kai_es.state.model import OCCUPYING, ClusterState, NodeState


def _out_of_bounds_node(spec: p.NodeObserved) -> bool:
    return not (0 <= spec.gpus <= bounds.MAX_NODE_GPUS and 0 <= spec.milli_cpu <= bounds.MAX_QUANTITY
                and 0 <= spec.memory_bytes <= bounds.MAX_QUANTITY and 0 <= spec.max_pods <= bounds.MAX_NODE_PODS
                and 0 <= spec.gpu_memory_mib <= bounds.MAX_GPU_MEMORY_MIB
                and all(0 <= v <= bounds.MAX_QUANTITY for v in spec.scalar_resources.values()))


def node_observed(state: ClusterState, env: Envelope) -> None:
    spec: p.NodeObserved = env.data
    if _out_of_bounds_node(spec):
        state.rejected_objects += 1  # a crafted or corrupt record: never applied
        return
    if state.resync_seen:
        mark_seen(state, "Node", spec.name)
    node = state.nodes.get(spec.name)
    if node is None or node.spec != spec:
        state.node_set_version += 1
        state.stale_nodes.add(spec.name)
        if state.usage_resolution_ns:
            usage.accrue_capacity(state, state.event_ns)
    if node is None:
        state.nodes[spec.name] = NodeState(
            spec=spec, device_used=[0] * spec.gpus, device_releasing=[0] * spec.gpus,
            device_sharers=[0] * spec.gpus)
        state.node_names.add(spec.name)
        for pod in [state.pods[k] for k in sorted(state.pods) if state.pods[k].node == spec.name
                    and state.pods[k].status in OCCUPYING]:
            status, devices, groups = pod.status, pod.devices, pod.gpu_groups
            queue_usage(state, pod, -1)
            pod.status = "Pending"
            occupy(state, pod, spec.name, devices, groups, status)
        return
    if spec.gpus != len(node.device_used) or spec.gpu_memory_mib != node.spec.gpu_memory_mib:
        # device count or size changed: re-seat the node's pods on the new device list
        resident = [state.pods[k] for k in sorted(node.pods)]
        saved = [(pod, pod.status, pod.devices, pod.gpu_groups) for pod in resident]
        for pod in resident:
            release(state, pod)
        node.spec = spec
        node.device_used = [0] * spec.gpus
        node.device_releasing = [0] * spec.gpus
        node.device_sharers = [0] * spec.gpus
        node.group_holders = {}
        for pod, status, devices, groups in saved:
            occupy(state, pod, spec.name, devices, groups, status)
            set_pending(state, pod, False)
        return
    node.spec = spec


def node_removed(state: ClusterState, env: Envelope) -> None:
    remove_node(state, env.data.name)


def remove_node(state: ClusterState, name: str) -> None:
    if state.usage_resolution_ns and name in state.nodes:
        usage.accrue_capacity(state, state.event_ns)
    node = state.nodes.pop(name, None)
    if node is None:
        state.ignored_events += 1
        return
    state.node_names.remove(name)
    state.node_set_version += 1
    state.stale_nodes.add(name)
    # its pods and usage went with it: a node of that name added again before the tables are
    # next built is a new one (`scheduling.tables` keeps a node's change generation by name)
    state.dirty_nodes.add(name)
    for key in sorted(node.pods):
        pod = state.pods[key]
        state.stale_pods.add(key)
        status, devices, groups = pod.status, pod.devices, pod.gpu_groups
        queue_usage(state, pod, -1)
        pod.status = "Pending"
        # still bound to a node that is gone: tracked as occupying nothing until it goes
        pod.node = name
        pod.status = status
        pod.devices, pod.gpu_groups, pod.device_milli = devices, groups, 0
        queue_usage(state, pod, +1)
