"""What consolidation keeps per node across cycles — the node bounds
(`kai_es.scheduling.actions.consolidation_bounds`) and the free capacity
(`kai_es.scheduling.kept_capacity`): after any sequence of what a cluster sends, folded, and of
the scheduler's upkeep between cycles, what is kept is what the state alone gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.scheduling.actions.consolidation_bounds import StateBounds, fresh_bounds, state_bounds
from kai_es.scheduling.kept_capacity import fresh_capacity, state_capacity
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.tables import tables
from kai_es.scheduling.upkeep import keep_up
from kai_es.state import ClusterState
from kai_es.state.reducer import apply

NODES = 3
PODS = 8
CONFIG = SchedulerConfig()

# one step of a cluster: what it sends; "cycle" asks for the bounds (as a consolidation search does)
steps = st.one_of(
    st.tuples(st.just("node"), st.integers(0, NODES - 1), st.integers(0, 8), st.booleans()),
    st.tuples(st.just("node-gone"), st.integers(0, NODES - 1)),
    st.tuples(st.just("run"), st.integers(0, PODS - 1), st.integers(0, NODES - 1), st.integers(0, 3),
              st.sampled_from(["", "train", "build", "inference"])),
    st.tuples(st.just("pending"), st.integers(0, PODS - 1), st.integers(0, 3)),
    st.tuples(st.just("finish"), st.integers(0, PODS - 1)),
    st.tuples(st.just("remove"), st.integers(0, PODS - 1)),
    st.tuples(st.just("group"), st.integers(0, 3), st.sampled_from(["", "train", "build", "inference"]),
              st.sampled_from(["", "preemptible", "non-preemptible"]),
              st.one_of(st.integers(0, 3), st.integers(0, 2**63 - 1))),  # creation times, near and far
    st.tuples(st.just("class"), st.sampled_from(["train", "build", "inference"]),
              st.one_of(st.integers(0, 200), st.integers(-2**31, 2**31 - 1))),  # Kubernetes' priority range
    st.tuples(st.just("cycle"),),
    st.tuples(st.just("upkeep"),),  # what a scheduler does while it waits (`kai_es.scheduling.upkeep`)
)


class _Feed:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.pos = 0
        self.nodes_on: dict[int, str] = {}

    def fold(self, payload: p.Payload) -> None:
        env = make_envelope(payload, event_id=derived_id("bounds", self.pos), source="kai-es/informer",
                            subject="s", logicaltime=1_000 + self.pos)
        apply(self.state, Record(self.pos, env))
        self.pos += 1

    def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "node":
            _, i, gpus, labelled = step
            self.fold(p.NodeObserved(name=f"node-{i}", milli_cpu=64_000, memory_bytes=2**38, gpus=int(gpus),
                                     labels={"zone": "a"} if labelled else {}))
        elif kind == "node-gone":
            self.fold(p.NodeRemoved(name=f"node-{step[1]}"))
        elif kind in ("run", "pending"):
            i, node, group, cls = (step[1], step[2], step[3], step[4]) if kind == "run" else (step[1], None, step[2], "")
            self.fold(p.PodObserved(namespace="ns", name=f"pod-{i}", uid=f"u{i}", queue="q",
                                    podgroup=f"pg-{group}", phase="Running" if node is not None else "Pending",
                                    node_name=f"node-{node}" if node is not None else "", priority_class=str(cls),
                                    requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30),
                                    gpu=p.GpuRequest(whole=1), gpu_devices=(0,) if node is not None else (),
                                    created_ns=100 + int(i)))
        elif kind == "finish":
            i = step[1]
            pod = self.state.pods.get(f"ns/pod-{i}")
            if pod is not None:
                self.fold(p.PodObserved(**{**{f: getattr(pod.spec, f) for f in pod.spec.__struct_fields__},
                                           "phase": "Succeeded"}))
        elif kind == "remove":
            self.fold(p.PodRemoved(namespace="ns", name=f"pod-{step[1]}", uid=f"u{step[1]}"))
        elif kind == "group":
            _, g, cls, mode, created = step
            self.fold(p.PodGroupObserved(namespace="ns", name=f"pg-{g}", uid=f"g{g}", queue="q", priority_class=str(cls),
                                         preemptibility=mode, created_ns=int(created)))
        elif kind == "class":
            self.fold(p.PriorityClassObserved(name=str(step[1]), value=int(step[2])))


def _form(b: StateBounds) -> tuple[object, ...]:
    return (b.names, b.least, b.free, list(b.ordered))


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, min_size=10, max_size=80))
def test_kept_bounds_are_the_states_after_anything_a_cluster_sends(sequence: list[tuple[Any, ...]]) -> None:
    """Nodes come, change and go; pods run, move, finish and go; PodGroups and PriorityClasses
    change the victim order and preemptibility of jobs with running pods: at every point where a
    search asks, the bounds kept since the first ask equal those computed from the state; and
    the pods the reducer marks as changed in worth are always pods of the state (a removed pod
    takes its mark along, so the marks stay bounded when no search asks for a long time)."""
    feed = _Feed()
    feed.fold(p.QueueObserved(name="q"))
    asked = False
    for step in [*sequence, ("cycle",)]:
        if step[0] == "cycle":
            kept = state_bounds(feed.state)
            asked = True
            assert _form(kept) == _form(fresh_bounds(feed.state))
            capacity, fresh = state_capacity(feed.state), fresh_capacity(feed.state)
            assert (capacity.each, capacity.total) == (fresh.each, fresh.total)
        elif step[0] == "upkeep":
            keep_up(feed.state, CONFIG)
        else:
            feed.step(step)
            if not asked:
                tables(feed.state)  # cycles that did not consolidate consumed the changes already
        # however long no search asks, the reducer's marks name only pods the state holds
        assert feed.state.victim_order_changed <= feed.state.pods.keys()
    assert asked


def _two_nodes(*steps: tuple[Any, ...]) -> _Feed:
    """A queue and two 8-GPU nodes, then `steps`."""
    feed = _Feed()
    feed.fold(p.QueueObserved(name="q"))
    for step in (("node", 0, 8, False), ("node", 1, 8, False), *steps):
        feed.step(step)
    return feed


@pytest.mark.parametrize("steps, least_before", [
    # the node runs only the job (a pod of pg-0): the pod that gave its bound changed worth
    ([("class", "train", 50), ("group", 0, "train", "", 0), ("group", 1, "", "", 0),
      ("run", 0, 0, 0, ""), ("run", 1, 1, 1, "")], 50),
    # the node also runs the cheapest job (pg-1, `build`, 20), whose pod stays, unchanged: the
    # bound comes from the pods the reducer says changed worth, not only from those it gained
    ([("class", "train", 50), ("class", "build", 20), ("group", 0, "train", "", 0),
      ("group", 1, "build", "", 0), ("run", 0, 0, 0, ""), ("run", 1, 0, 1, ""), ("run", 2, 1, 1, "")], 20),
], ids=["its-only-job", "its-dearer-job"])
def test_a_job_whose_priority_class_changes_moves_its_nodes_bounds(steps: list[tuple[Any, ...]],
                                                                    least_before: int) -> None:
    """A KAI user lowers the PriorityClass `train` a running job's PodGroup names, to 10: the
    node it runs on is now where a cheaper victim is (the bound follows), with no pod of it
    changing."""
    feed = _two_nodes(*steps)
    before = state_bounds(feed.state)
    assert before.least[0] is not None and before.least[0][0] == least_before
    feed.fold(p.PriorityClassObserved(name="train", value=10))
    after = state_bounds(feed.state)
    assert after.least[0] is not None and after.least[0][0] == 10
    assert _form(after) == _form(fresh_bounds(feed.state))


def test_a_node_whose_cheapest_victim_finishes_takes_the_next_as_its_bound() -> None:
    """node-0 runs a pod of PodGroup pg-1 (PriorityClass `build`, 20), its cheapest victim, and
    one of pg-0 (`train`, 50). pg-1's pod succeeds: the node's bound is now pg-0's, though
    nothing there changed worth (the pod that gave the least left)."""
    feed = _two_nodes(("class", "train", 50), ("class", "build", 20), ("group", 0, "train", "", 0),
                      ("group", 1, "build", "", 0), ("run", 0, 0, 0, ""), ("run", 1, 0, 1, ""))
    before = state_bounds(feed.state)
    assert before.least[0] is not None and before.least[0][0] == 20
    feed.step(("finish", 1))
    after = state_bounds(feed.state)
    assert after.least[0] is not None and after.least[0][0] == 50
    assert _form(after) == _form(fresh_bounds(feed.state))


def test_a_node_removed_and_added_again_between_two_searches_is_a_new_node() -> None:
    """node-0 runs pod-0, the cheapest victim there; between two searches the node is deleted,
    the pod succeeds, and a node of the same name registers again, empty (a replaced machine):
    the node has no victim, whatever the one of that name held (the property test found this)."""
    feed = _two_nodes(("run", 0, 0, 0, ""))
    assert state_bounds(feed.state).least[0] is not None
    for step in (("node-gone", 0), ("finish", 0), ("node", 0, 8, False)):
        feed.step(step)
    after = state_bounds(feed.state)
    assert after.least[after.names.index("node-0")] is None
    assert _form(after) == _form(fresh_bounds(feed.state))


def _two_groups() -> _Feed:
    """Two PodGroups whose victim order never changes (their own uid and creation time): pg-1,
    newer, is the cheaper victim. node-0 runs pod-0 of pg-1 and pod-1 of pg-0; node-1 pod-2 of pg-1."""
    return _two_nodes(("group", 0, "", "", 1), ("group", 1, "", "", 3),
                      ("run", 0, 0, 1, ""), ("run", 1, 0, 0, ""), ("run", 2, 1, 1, ""))


@pytest.mark.parametrize("steps", [
    # a running pod's PodGroup label changes (its job changes, neither job's order does)
    [("run", 0, 0, 0, "")],
    # between two cycles the pod is deleted, and a pod of the same name, of the other job, is
    # seen running on the same node (bound by another scheduler, or a relist)
    [("remove", 0), ("run", 0, 0, 0, "")],
], ids=["moved-to-another-job", "recreated-in-another-job"])
def test_a_node_whose_pod_now_belongs_to_another_job_moves_its_bound(steps: list[tuple[Any, ...]]) -> None:
    """node-0 ran the cheaper job's pod-0; now pod-0 is the dearer job's: the node no longer
    holds the cheaper job's victim."""
    feed = _two_groups()
    assert state_bounds(feed.state).least[0] == (0, -3, "g1")
    for step in steps:
        feed.step(step)
    assert state_bounds(feed.state).least[0] == (0, -1, "g0")
    assert _form(state_bounds(feed.state)) == _form(fresh_bounds(feed.state))


def test_a_pod_recreated_and_bound_while_no_search_ran_counts_as_its_new_jobs() -> None:
    """pod-0 (the cheaper job's) is deleted; a pod of the same name in the dearer job is created
    pending and bound to the same node in cycles whose consolidation searched nothing: the next
    search's bound is the new job's, though the node held that key at both searches."""
    feed = _two_groups()
    assert state_bounds(feed.state).least[0] == (0, -3, "g1")
    feed.step(("remove", 0))
    feed.step(("pending", 0, 0))
    tables(feed.state)  # a cycle that searched nothing (it decided the binding)
    feed.step(("run", 0, 0, 0, ""))  # the binding observed
    tables(feed.state)
    assert state_bounds(feed.state).least[0] == (0, -1, "g0")
    assert _form(state_bounds(feed.state)) == _form(fresh_bounds(feed.state))
