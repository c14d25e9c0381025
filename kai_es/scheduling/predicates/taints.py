"""Cordon, taints and tolerations, and KAI node pools. Pure.

Contract: a node accepts a pod when it is not cordoned, the pod tolerates every `NoSchedule`
and `NoExecute` taint, and the node's `kai.scheduler/node-pool` label equals the pod's (a pod
without the label uses nodes without it).
"""

from __future__ import annotations

from collections.abc import Sequence

from kai_es.events import payloads as p

NODE_POOL_LABEL = "kai.scheduler/node-pool"


def tolerates(taint: p.Taint, tolerations: Sequence[p.Toleration]) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.key == taint.key and t.value == taint.value:
            return True
    return False


def node_accepts(node: p.NodeObserved, spec: p.PodObserved) -> bool:
    if node.unschedulable:
        return False
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerates(taint, spec.tolerations):
            return False
    return node.labels.get(NODE_POOL_LABEL, "") == spec.node_pool
