"""Host ports: two pods on one node cannot bind the same port and protocol on overlapping
addresses (an empty/0.0.0.0 address overlaps every address).

Contract: `PortsInUse` starts from the ports of the pods occupying each node (releasing pods
included: they hold their ports until gone) and follows the Plan's placements and rollbacks;
`excluded(spec)` are the node indices where one of `spec`'s host ports conflicts, with an
example for the reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from kai_es.events import payloads as p
from kai_es.state.model import OCCUPYING, ClusterState

HOST_PORT_CONFLICT = "HostPortConflict"


def conflicts(a: p.HostPort, b: p.HostPort) -> bool:
    return a.port == b.port and a.protocol == b.protocol and (
        not a.host_ip or not b.host_ip or a.host_ip == b.host_ip)


class PortsInUse:
    def __init__(self, state: ClusterState, node_index: Mapping[str, int]) -> None:
        #: (port, protocol) -> node index -> {(host ip, pod key)}
        self.used: dict[tuple[int, str], dict[int, set[tuple[str, str]]]] = {}
        for key, pod in sorted(state.pods.items()):
            if pod.spec.host_ports and pod.status in OCCUPYING and pod.node in node_index:
                self.apply(key, pod.spec, node_index[pod.node], +1)

    def apply(self, pod_key: str, spec: p.PodObserved, node: int, sign: int) -> None:
        for hp in spec.host_ports:
            holders = self.used.setdefault((hp.port, hp.protocol), {}).setdefault(node, set())
            if sign > 0:
                holders.add((hp.host_ip, pod_key))
            else:
                holders.discard((hp.host_ip, pod_key))

    def excluded(self, spec: p.PodObserved) -> tuple[set[int], str]:
        out: set[int] = set()
        example = ""
        for hp in spec.host_ports:
            for node, holders in sorted(self.used.get((hp.port, hp.protocol), {}).items()):
                for ip, pod_key in sorted(holders):
                    if conflicts(hp, p.HostPort(port=hp.port, protocol=hp.protocol, host_ip=ip)):
                        out.add(node)
                        if not example:
                            example = f"port {hp.port}/{hp.protocol} is in use by pod {pod_key}"
                        break
        return out, example
