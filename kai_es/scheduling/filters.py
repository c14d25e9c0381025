"""Node filters that depend on the pod: cordon, node pool (label `kai.scheduler/node-pool` on
pod and node; pods without it use nodes without it), taints/tolerations, nodeSelector and
required node affinity. Pure; the result is an eligibility mask in node-index order.

Contract: `eligibility(state, nodes, pod_spec)` gives 1 for nodes the pod may run on by these
rules and 0 otherwise. Pods with the same constraints share a mask (`constraint_key`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from kai_es.events import payloads as p
from kai_es.state.model import NodeState


NODE_POOL_LABEL = "kai.scheduler/node-pool"


def constraint_key(spec: p.PodObserved) -> tuple[object, ...]:
    """Pods with equal keys get equal masks."""
    return (tuple(sorted(spec.node_selector.items())), tuple(spec.tolerations),
            tuple(spec.affinity_terms), spec.node_pool)


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


def _requirement_holds(req: p.NodeSelectorRequirement, labels: dict[str, str]) -> bool:
    value = labels.get(req.key)
    if req.operator == "In":
        return value is not None and value in req.values
    if req.operator == "NotIn":
        return value is None or value not in req.values
    if req.operator == "Exists":
        return value is not None
    if req.operator == "DoesNotExist":
        return value is None
    if value is None or not req.values:
        return False
    try:
        left, right = int(value), int(req.values[0])
    except ValueError:
        return False
    return left > right if req.operator == "Gt" else left < right


def node_allows(node: NodeState, spec: p.PodObserved) -> bool:
    """Whether `spec` may run on `node` by cordon, taints, selector and required affinity."""
    ns = node.spec
    if ns.unschedulable:
        return False
    for taint in ns.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerates(taint, spec.tolerations):
            return False
    labels = ns.labels
    if labels.get(NODE_POOL_LABEL, "") != spec.node_pool:
        return False  # KAI node pools: a pod runs only in its pool (no label: the default pool)
    for k, v in spec.node_selector.items():
        if labels.get(k) != v:
            return False
    if spec.affinity_terms and not any(
        all(_requirement_holds(r, labels) for r in term.match_expressions)
        for term in spec.affinity_terms
    ):
        return False
    return True


def eligibility(nodes: Sequence[NodeState], spec: p.PodObserved) -> array[int]:
    """The mask for `spec` over `nodes` (in the given order)."""
    return array("q", [1 if node_allows(n, spec) else 0 for n in nodes])
