"""The static node masks kept across cycles (`kai_es.scheduling.predicates.eligibility`): a
cycle reuses the last one's evaluation of a pod's node constraints while no node came, went or
changed its spec, and evaluates them again once one did, as a KAI user sees it: a pod with a
nodeSelector and a toleration, a node tainted and labelled between two cycles."""

from __future__ import annotations

import msgspec
import pytest

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.scheduling.plan import VerificationError
from kai_es.scheduling.predicates.eligibility import PLAIN_KEY, Eligibility, static_key
from kai_es.scheduling.tables import labels_of, tables
from kai_es.state import ClusterState
from kai_es.state.reducer import apply


class _Feed:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.pos = 0

    def fold(self, payload: p.Payload) -> None:
        env = make_envelope(payload, event_id=derived_id("masks", self.pos), source="kai-es/informer",
                            subject="s", logicaltime=1_000 + self.pos)
        apply(self.state, Record(self.pos, env))
        self.pos += 1


def _node(name: str, labels: dict[str, str], taints: list[p.Taint] | None = None) -> p.NodeObserved:
    return p.NodeObserved(name=name, milli_cpu=64_000, memory_bytes=2**38, gpus=8, labels=labels, taints=taints or [])


def _cycle_mask(state: ClusterState, spec: p.PodObserved, verify: bool = False) -> list[int]:
    names, nodes, _, _ = tables(state)  # as a cycle's Plan takes them
    eligibility = Eligibility(state, names, nodes)
    eligibility.verify = verify
    return list(eligibility.static_mask(spec))


POD = p.PodObserved(namespace="team-a", name="train-0", uid="u0", podgroup="pg", queue="q",
                    node_selector={"nvidia.com/gpu.product": "H100"},
                    tolerations=(p.Toleration(key="dedicated", operator="Equal", value="ml", effect="NoSchedule"),))


def test_a_kept_mask_follows_node_changes_between_cycles() -> None:
    feed = _Feed()
    feed.fold(_node("node-a", {"nvidia.com/gpu.product": "H100"}))
    feed.fold(_node("node-b", {"nvidia.com/gpu.product": "A100"}))
    assert _cycle_mask(feed.state, POD) == [1, 0]
    assert _cycle_mask(feed.state, POD) == [1, 0]  # kept
    # the admin relabels node-b and taints node-a with a taint the pod does not tolerate
    feed.fold(_node("node-b", {"nvidia.com/gpu.product": "H100"}))
    assert _cycle_mask(feed.state, POD) == [1, 1]
    feed.fold(_node("node-a", {"nvidia.com/gpu.product": "H100"},
                    [p.Taint(key="maintenance", value="", effect="NoSchedule")]))
    assert _cycle_mask(feed.state, POD) == [0, 1]
    feed.fold(p.NodeRemoved(name="node-b"))
    assert _cycle_mask(feed.state, POD) == [0]


def test_the_same_evaluation_is_reused_while_no_node_changes() -> None:
    feed = _Feed()
    feed.fold(_node("node-a", {"nvidia.com/gpu.product": "H100"}))
    names, nodes, _, _ = tables(feed.state)
    first = Eligibility(feed.state, names, nodes).static_mask(POD)
    again = Eligibility(feed.state, names, nodes).static_mask(POD)
    assert again is first


def test_verification_catches_a_kept_mask_gone_stale() -> None:
    """A node spec change the kept masks missed (here: made behind the reducer's back, so the
    node set version stays) is caught in verification mode."""
    feed = _Feed()
    feed.fold(_node("node-a", {"nvidia.com/gpu.product": "H100"}))
    assert _cycle_mask(feed.state, POD) == [1]
    node = feed.state.nodes["node-a"]
    node.spec = _node("node-a", {"nvidia.com/gpu.product": "A100"})
    with pytest.raises(VerificationError):
        _cycle_mask(feed.state, POD, verify=True)


def test_node_labels_for_pod_affinity_are_kept_while_no_node_changes_and_follow_a_relabel() -> None:
    """The node labels pod affinity and topology read (`tables.labels_of`) are one list while the
    node set holds (not one built per cycle) and the new labels once a node is relabelled."""
    feed = _Feed()
    feed.fold(_node("node-a", {"topology.kubernetes.io/zone": "z1"}))
    feed.fold(_node("node-b", {"topology.kubernetes.io/zone": "z2"}))
    names, nodes, _, _ = tables(feed.state)
    first = Eligibility(feed.state, names, nodes).affinity.node_labels
    names, nodes, _, _ = tables(feed.state)
    again = Eligibility(feed.state, names, nodes).affinity.node_labels
    assert again is first and [dict(labels) for labels in again] == [{"topology.kubernetes.io/zone": "z1"},
                                                                     {"topology.kubernetes.io/zone": "z2"}]
    feed.fold(_node("node-b", {"topology.kubernetes.io/zone": "z3"}))
    names, nodes, _, _ = tables(feed.state)
    relabelled = Eligibility(feed.state, names, nodes).affinity.node_labels
    assert relabelled is not first and relabelled[1] == {"topology.kubernetes.io/zone": "z3"}
    assert labels_of(feed.state, list(names), nodes) is not relabelled  # not the tables' own list: built


def test_a_pod_without_node_constraints_takes_the_plain_key_and_every_constraint_its_own() -> None:
    """`Eligibility` skips building the key of a pod with no node constraint (`PLAIN_KEY`); a pod
    with any one of them (nodeSelector, toleration, node affinity, node pool, a claim, an
    extended resource) gets the key `static_key` builds, and so its own mask: a KAI user's pod
    pinned to a node pool is not given the mask of a pod that may go anywhere."""
    feed = _Feed()
    feed.fold(_node("node-a", {"zone": "a"}))  # (the default node pool)
    feed.fold(_node("node-b", {"zone": "b", "kai.scheduler/node-pool": "pool-b"}))
    on_a = (p.NodeSelectorTerm(match_expressions=(p.NodeSelectorRequirement(
        key="zone", operator="NotIn", values=("a",)),)),)
    feed.fold(p.VolumeObserved(name="local-b", node_affinity=on_a))  # a local volume, not on node-a
    feed.fold(p.ClaimObserved(namespace="team-a", name="data", phase="Bound", volume="local-b"))
    names, nodes, _, _ = tables(feed.state)
    eligibility = Eligibility(feed.state, names, nodes)
    plain = p.PodObserved(namespace="team-a", name="plain", uid="u1", podgroup="pg", queue="q")
    assert static_key(plain) == PLAIN_KEY and eligibility._key(plain) is PLAIN_KEY
    variants = {
        "node_selector": {"zone": "b"},
        "tolerations": (p.Toleration(key="dedicated", operator="Exists"),),
        "affinity_terms": on_a,
        "node_pool": "pool-b",
        "claims": ("data",),
        "scalar_requests": {"nvidia.com/mig-1g.10gb": 1},
    }
    specs = [msgspec.structs.replace(plain, name=f"with-{f}", **{f: v}) for f, v in variants.items()]
    for field, spec in zip(variants, specs):  # (all alive: the keys are kept by the spec's identity)
        volumes = ("local-b",) if spec.claims else ()
        assert eligibility._key(spec) == static_key(spec, volumes) != PLAIN_KEY, field
    assert list(eligibility.static_mask(plain)) == [1, 0]
    assert [list(eligibility.static_mask(spec)) for spec in specs] == [
        [0, 0], [1, 0], [0, 0], [0, 1], [0, 0], [0, 0]]  # (the toleration excludes no node)
