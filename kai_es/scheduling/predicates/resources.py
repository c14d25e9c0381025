"""Scalar resources (extended resources such as `example.com/rdma`, ephemeral-storage,
hugepages-*): a node without the resource, or without enough of it free, cannot take the pod.

Contract: `ScalarFree` starts from each node's allocatable minus what occupying pods hold (pods
still releasing included: conservative for pipelining) and follows the Plan's placements and
rollbacks; `excluded(spec)` are the node indices that cannot take `spec` now.
"""

from __future__ import annotations

from collections.abc import Sequence

from kai_es.events import payloads as p
from kai_es.state.model import NodeState

INSUFFICIENT_RESOURCE = "InsufficientResource"


def capacity_allows(node: p.NodeObserved, spec: p.PodObserved) -> bool:
    """Static part: the node has at least the requested amount of every scalar resource."""
    have = node.scalar_resources
    return all(have.get(r, 0) >= amount for r, amount in spec.scalar_requests.items())


class ScalarFree:
    def __init__(self, nodes: Sequence[NodeState]) -> None:
        #: resource -> node index -> free amount (only nodes that have the resource)
        self.free: dict[str, dict[int, int]] = {}
        for i, n in enumerate(nodes):
            for resource, total in n.spec.scalar_resources.items():
                self.free.setdefault(resource, {})[i] = total - n.used_scalar.get(resource, 0)

    def excluded(self, spec: p.PodObserved) -> set[int]:
        out: set[int] = set()
        for resource, amount in spec.scalar_requests.items():
            for node, free in self.free.get(resource, {}).items():
                if free < amount:
                    out.add(node)
        return out

    def most_free(self, resource: str) -> int:
        return max(self.free.get(resource, {}).values(), default=0)

    def apply(self, spec: p.PodObserved, node: int, sign: int) -> None:
        for resource, amount in spec.scalar_requests.items():
            row = self.free.get(resource)
            if row is not None and node in row:
                row[node] -= sign * amount
