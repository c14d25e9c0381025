"""The bounded victim search of policy kai-es/v3 (`kai_es.scheduling.victims.RoomBound`, the
failed-scenario memo, the eviction back-off) and what stays as it was under kai-es/v2.
The per-rule scenario tests are tests/scenarios/*-bounded-*.yaml (both packers)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.feed import object_events
from kai_es.oneshot import one_cycle
from kai_es.scenario import Scenario, load_scenario, load_scenario_text
from kai_es.scheduling import victims
from kai_es.scheduling.actions import preempting
from kai_es.scheduling.rules import reclaim_victims as rv
from kai_es.scheduling.rules.reclaim_victims import DominantShareReclaimV5
from kai_es.scheduling.config import SchedulerConfig, config_digest, config_event, parse_config
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.session import QueueNode
from kai_es.state import ClusterState, fold
from kai_es.state.invariants import check
from kai_es.state.reducer import apply
from tests.builders import MakeNode, MakePod, queue, scenario_text

SCENARIOS = Path(__file__).parent / "scenarios"
SEC = 1_000_000_000


V3_DEFAULT = ["allocate", "reclaim", "preempt", "stalegangeviction"]  # KAI's order without consolidation
V4_DEFAULT = ["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]  # KAI's order


def test_v3_runs_every_action_it_has_by_default_and_v2_keeps_allocate() -> None:
    assert parse_config({"policyVersion": "kai-es/v3"}).action_list == V3_DEFAULT
    assert parse_config({}).policy_version == "kai-es/v16"  # v5 to v16 run v4's actions
    assert parse_config({}).action_list == V4_DEFAULT
    assert parse_config({"policyVersion": "kai-es/v2"}).action_list == ["allocate"]
    # a config listing no actions and one listing the defaults are the same configuration
    assert config_digest(parse_config({})) == config_digest(parse_config({"actions": V4_DEFAULT}))


def test_under_v2_the_search_is_not_bounded() -> None:
    """The same scenario under kai-es/v2: no VictimsCannotMakeRoom (v2 decisions unchanged)."""
    text = (SCENARIOS / "preempt-bounded-no-room.yaml").read_text().replace(
        "metadata: {name: preempt-bounded-no-room}",
        "metadata: {name: v2}\nspec:\n  scheduler: {policyVersion: kai-es/v2, actions: [allocate, reclaim, preempt]}")
    outcome = one_cycle(load_scenario_text(text, "v2.yaml"), load_packer("native"))
    codes = [r["code"] for d in outcome["decisions"] if d["subject"] == "pod/default/urgent"
             and d["type"] == "kai.scheduler.pod.unschedulable" for r in d["data"]["reasons"]]
    assert codes == ["NoNodeFits"]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_an_identical_failed_scenario_is_not_searched_twice(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three equal urgent pods that cannot make room: the per-node bound is computed for the
    first only; the other two are the same scenario on the same Plan."""
    docs: list[dict[str, Any]] = [MakeNode("n1").gpus(4).obj(), queue("q")]
    docs.append(MakePod("keep", queue="q").gpu(2).priority_class("build").running_on("n1").obj())
    for i in range(2):
        docs.append(MakePod(f"t-{i}", queue="q").gpu(1).priority_class("train").running_on("n1").obj())
    for i in range(3):
        docs.append(MakePod(f"urgent-{i}", queue="q").gpu(4).priority_class("build").obj())
    calls = []
    real = victims.RoomBound.nodes

    def counting(self: victims.RoomBound, *args: Any) -> Any:
        calls.append(args[0])
        return real(self, *args)

    monkeypatch.setattr(victims.RoomBound, "nodes", counting)
    outcome = one_cycle(load_scenario_text(scenario_text(*docs), "memo.yaml"), load_packer(engine))  # type: ignore[arg-type]
    assert len(calls) == 1, calls
    for i in range(3):
        assert outcome["pods"][f"default/urgent-{i}"]["status"] == "Pending"
    assert outcome["pods"]["default/t-0"]["status"] == "Running"


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_search_never_evicts_on_a_node_without_room(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The searched units all have a pod on a node with room (here: only n2's)."""
    seen: list[set[int] | None] = []
    real = victims.search

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[8] if len(args) > 8 else kwargs.get("on_nodes"))
        return real(*args, **kwargs)

    monkeypatch.setattr(preempting, "search", spy)
    outcome = one_cycle(load_scenario(SCENARIOS / "preempt-bounded-searches-room-nodes.yaml"),
                        load_packer(engine))  # type: ignore[arg-type]
    assert seen == [{1}]  # node index 1 is n2
    assert outcome["pods"]["default/urgent"] == {**outcome["pods"]["default/urgent"], "status": "Pipelined"}


# -- the back-off after a refused eviction -------------------------------------------------------


class Log:
    """Folds envelopes into a state as consecutive records."""

    def __init__(self, scenario: Scenario, engine: str = "native") -> None:
        async def build() -> list[Record]:
            log = MemoryEventLog()
            await log.append([config_event(scenario.config, event_id="cfg", logicaltime=scenario.start_ns)])
            await log.append(object_events(scenario, scenario.initial(), scenario.start_ns))
            return [r async for r in log.read()]

        self.config = scenario.config
        self.packer = load_packer(engine)  # type: ignore[arg-type]
        self.state: ClusterState = fold(anyio.run(build))
        self.pos = self.state.position + 1
        self.t = scenario.start_ns

    def fold(self, env: Envelope) -> Record:
        record = Record(self.pos, env)
        apply(self.state, record)
        self.pos += 1
        return record

    def cycle(self, n: int, at_ns: int) -> list[Envelope]:
        self.t = at_ns
        started = self.fold(make_envelope(p.CycleStarted(cycle=n, config_digest=config_digest(self.config)),
                                          event_id=derived_id("cycle", n), source="kai-es/scheduler",
                                          subject=f"cycle/{n}", logicaltime=at_ns,
                                          policyversion=self.config.policy_version))
        decisions = run_cycle(self.state, started, self.config, self.packer)
        for d in decisions:
            self.fold(d)
        return decisions

    def refuse(self, evictions: list[Envelope], at_ns: int) -> None:
        for d in evictions:
            data = d.data
            assert isinstance(data, p.EvictionDecided)
            self.fold(make_envelope(p.PodEvictionFailed(namespace=data.namespace, name=data.name, uid=data.uid,
                                                        node=data.node, decision_id=d.id, message="PDB"),
                                    event_id=derived_id(d.id, 1), source="kai-es/binder", subject=d.subject,
                                    logicaltime=at_ns))


def _evicted(decisions: list[Envelope]) -> list[Envelope]:
    return [d for d in decisions if isinstance(d.data, p.EvictionDecided)]


def _backoff_scenario(policy: str) -> Scenario:
    text = (SCENARIOS / "preempt-basic.yaml").read_text().replace(
        "spec:\n  scheduler: {actions: [allocate, reclaim, preempt]}",
        f"spec:\n  scheduler: {{policyVersion: {policy}, actions: [allocate, reclaim, preempt]}}")
    return load_scenario_text(text, "backoff.yaml")


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_victim_whose_eviction_was_refused_is_not_chosen_again_until_the_backoff_ends(engine: str) -> None:
    log = Log(_backoff_scenario("kai-es/v3"), engine)
    start = log.t
    first = _evicted(log.cycle(1, start))
    assert sorted(d.data.name for d in first) == ["t-2", "t-3"]
    log.refuse(first, start + 2 * SEC)
    assert log.state.pods["default/t-3"].eviction_refused_ns == start + 2 * SEC
    assert check(log.state) == []  # the refusal time survives a snapshot and restore
    # within the back-off: the other two train pods are the victims instead
    second = _evicted(log.cycle(2, start + 5 * SEC))
    assert sorted(d.data.name for d in second) == ["t-0", "t-1"]
    log.refuse(second, start + 6 * SEC)
    # still within the back-off for every train pod: nothing is evicted, and the urgent pod waits
    assert _evicted(log.cycle(3, start + 10 * SEC)) == []
    # after it (refused at +2 s, back-off 60 s): t-2 and t-3 are victims again
    later = _evicted(log.cycle(4, start + 2 * SEC + victims.EVICTION_REFUSED_BACKOFF_NS))
    assert sorted(d.data.name for d in later) == ["t-2", "t-3"]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_under_v2_a_refused_eviction_is_retried_at_once_and_not_recorded(engine: str) -> None:
    log = Log(_backoff_scenario("kai-es/v2"), engine)
    start = log.t
    first = _evicted(log.cycle(1, start))
    log.refuse(first, start + 2 * SEC)
    assert log.state.pods["default/t-3"].eviction_refused_ns == 0  # v2's state digest is unchanged
    second = _evicted(log.cycle(2, start + 5 * SEC))
    assert sorted(d.data.name for d in second) == sorted(d.data.name for d in first)


# -- the victim index kept by the reducer --------------------------------------------------------


def test_the_victim_index_follows_a_priority_change_of_a_running_job() -> None:
    docs = [MakeNode("n1").gpus(2).obj(), queue("q"),
            MakePod("a", queue="q").gpu(1).priority_class("train").running_on("n1").obj()]
    log = Log(load_scenario_text(scenario_text(*docs), "index.yaml"))
    job = log.state.jobs[log.state.pods["default/a"].job_key]
    assert log.state.victim_jobs == {"q": {job.priority: {job.key}}}
    log.fold(make_envelope(p.PriorityClassObserved(name="train", value=7), event_id="pc", source="kai-es/informer",
                           subject="priorityclass/train", logicaltime=log.t))
    assert log.state.victim_jobs == {"q": {7: {job.key}}}
    assert check(log.state) == []


def test_config_default_is_the_v4_default_config() -> None:
    assert SchedulerConfig().action_list == V4_DEFAULT


# -- reclaim's side walk agrees with the pairwise rules -------------------------------------------

@st.composite
def queue_trees(draw: st.DrawFn) -> tuple[list[QueueNode], list[QueueNode]]:
    """A random forest of queues with random accounting: (roots, leaves)."""
    amount = st.integers(0, 8)
    roots: list[QueueNode] = []
    leaves: list[QueueNode] = []

    def node(name: str, parent: QueueNode | None, depth: int) -> QueueNode:
        q = QueueNode(name=name, parent=parent, priority=0, created_ns=0,
                      quota=tuple(draw(st.integers(-1, 6)) for _ in range(3)),  # type: ignore[arg-type]
                      limit=(-1, -1, -1),
                      allocated=tuple(draw(amount) for _ in range(3)),  # type: ignore[arg-type]
                      fair=tuple(draw(amount) for _ in range(3)))  # type: ignore[arg-type]
        q.nonpreemptible = tuple(min(a, draw(amount)) for a in q.allocated)  # type: ignore[assignment]
        kids = draw(st.integers(0, 3)) if depth < 2 else 0
        for i in range(kids):
            q.children.append(node(f"{name}.{i}", q, depth + 1))
        if not kids:
            leaves.append(q)
        return q

    for r in range(draw(st.integers(1, 3))):
        roots.append(node(f"r{r}", None, 0))
    for q in leaves:
        for n in q.ancestry():
            n.chain = n.ancestry()
    return roots, leaves


@settings(max_examples=300, deadline=None)
@given(queue_trees(), st.data())
def test_reclaim_side_walk_equals_the_pairwise_rules(forest: tuple[list[QueueNode], list[QueueNode]],
                                                      data: st.DataObject) -> None:
    roots, leaves = forest
    leaf = data.draw(st.sampled_from(leaves))
    request = tuple(data.draw(st.integers(0, 3)) for _ in range(3))
    preemptible = data.draw(st.booleans())
    queues = {q.name: q for q in leaves}
    session = SimpleNamespace(
        plan=SimpleNamespace(operations=[]), queues=queues, roots=roots,
        state=SimpleNamespace(victim_jobs={q.name: {0: {f"job-{q.name}"}} for q in leaves}),
        quota_bound=lambda job: not job.preemptible)
    job = SimpleNamespace(preemptible=preemptible)
    walked = DominantShareReclaimV5().judge(session).victim_buckets(leaf, job, request)  # type: ignore[arg-type]
    pairwise = []
    for victim in leaves:
        sides = rv.sides(leaf, victim)
        if victim is leaf or sides is None or not rv._could_yield(victim):
            continue
        chain, mine, theirs = sides
        held = [r for r in (0, 1, 2) if request[r] > 0 and victim.allocated[r] - victim.nonpreemptible[r] > 0]
        if rv._chain_within(chain, request, not preemptible) and rv._side_may_yield(mine, theirs, request, held):  # type: ignore[arg-type]
            pairwise.append((victim.name, 0))
    assert walked == sorted(pairwise)


# -- v4: a placement is tried only where an eviction made room -----------------------------------


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_victims_spread_over_many_nodes_do_not_use_up_the_tries(engine: str) -> None:
    """100 nodes of 8 GPUs, each running 8 low-priority single-GPU pods created round-robin over
    the nodes (the newest, cheapest victims are each on another node), and one urgent 8-GPU pod
    of the same queue: under kai-es/v4 preempt evicts one node's eight pods — the node whose
    pods are cheapest together — and pipelines the pod there. kai-es/v3 tries a placement after
    every victim once 8 GPUs are evicted anywhere and gives up after 64 tries."""
    docs: list[dict[str, Any]] = [MakeNode(f"n{i:03d}").gpus(8).obj() for i in range(100)]
    docs.append(queue("q"))
    for k in range(800):
        docs.append(MakePod(f"t{k:04d}", queue="q").gpu(1).priority_class("train").running_on(f"n{k % 100:03d}").obj())
    docs.append(MakePod("urgent", queue="q").gpu(8).priority_class("build").obj())
    outcome = one_cycle(load_scenario_text(scenario_text(*docs), "spread.yaml"), load_packer(engine))  # type: ignore[arg-type]
    evicted = sorted(d["data"]["name"] for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.evictiondecided")
    assert outcome["pods"]["default/urgent"]["status"] == "Pipelined"
    node = outcome["pods"]["default/urgent"]["node"]
    assert evicted == [f"t{k:04d}" for k in range(800) if f"n{k % 100:03d}" == node] and node == "n099"
    v3 = scenario_text(*docs, settings={"scheduler": {"policyVersion": "kai-es/v3"}})
    assert one_cycle(load_scenario_text(v3, "spread.yaml"), load_packer(engine))["pods"]["default/urgent"]["status"] == "Pending"  # type: ignore[arg-type]
