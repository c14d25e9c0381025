"""What consolidation's searches of a cycle keep of each node (`consolidation_views.NodeViews`): an
answer is reused while no Plan operation (or rollback) touched its node, or, for the cheapest
unit, a job it read; after any sequence of evictions and rollbacks every answer equals one
computed afresh on the Plan as it is."""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator
from itertools import chain

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.actions.consolidation_views import KEPT_WALKS, NodeViews
from kai_es.scheduling.rules.consolidation_nodes import CheapestVictimBreaksTies, ConsolidationNodes, MostFreeFirstV8
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import TaskShape, load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.session import Session
from kai_es.scheduling.actions.consolidation import _unit_form
from kai_es.scheduling.victims import free_capacity, free_of_each, keyed_units
from kai_es.state.model import Job, PodState
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

NODES = 3


def _session(seed: int, nodes: int = NODES) -> Session:
    rng = random.Random(seed)
    docs = [MakeNode(f"n{i}").gpus(8).obj() for i in range(nodes)]
    docs += [queue("a", gpu_quota=8), queue("b", gpu_quota=8)]
    groups = [f"g{k}" for k in range(4)]
    members: dict[str, int] = {}
    for n in range(nodes):
        for d in range(rng.randint(3, 8)):
            pod = MakePod(f"p{n}-{d}", queue="a").priority_class("train")
            group = rng.choice([*groups, ""])  # gangs and elastic jobs spanning nodes, single pods
            if group:
                pod = pod.group(group)
                members[group] = members.get(group, 0) + 1
            else:
                pod = MakePod(f"p{n}-{d}", queue=rng.choice("ab")).priority_class(rng.choice(["train", "build"]))
            docs.append(pod.gpu(1).running_on(f"n{n}", str(d)).obj())
    docs += [podgroup(g, rng.randint(1, size), "a", priorityClassName="train") for g, size in sorted(members.items())]
    docs.append(MakePod("big", queue="a").gpu(8).obj())
    scenario = load_scenario_text(scenario_text(*docs), "consolidation-views")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config))
    return Session(state, plan, scenario.start_ns, policy_for("kai-es/v11").rules, scenario.config)


def _preemptor(session: Session) -> Job:
    return next(job for job in session.state.jobs.values() if not job.occupying)


def evict_or_roll_back(session: Session, job: Job, steps: list[tuple[bool, int]]) -> Iterator[None]:
    """For each step (roll back?, a number to pick with): roll the Plan back to a checkpoint
    of an earlier step, or evict a running pod (for `job`, a checkpoint before it), then yield;
    a step that finds no running pod to evict is skipped."""
    plan = session.plan
    checkpoints: list[int] = []
    for rollback, pick in steps:
        if rollback and checkpoints:
            at = pick % len(checkpoints)
            plan.rollback(checkpoints[at])
            del checkpoints[at:]
        else:
            running = sorted(k for k, pod in session.state.pods.items()
                             if pod.status == "Running" and k not in plan.evicted_pods)
            if not running:
                continue
            checkpoints.append(len(plan.operations))
            plan.evict(running[pick % len(running)], "consolidation", job.key, "test")
        yield


def _answers(views: NodeViews, job: Job) -> list[object]:
    shape = TaskShape.whole(8, 0, 0)
    mask = array("q", [1] * NODES)
    out: list[object] = []
    nodes: list[tuple[int, tuple[bool, bool, bool], list[PodState]]] = []
    for n in range(NODES):
        movable, freed = views.movable(n, job)
        out.append(([pod.key for pod in movable], freed, views.could_fit(n, [(shape, mask)], movable, freed),
                    views.short_of(n, [shape])))
        nodes.append((n, (False, False, False), movable))
    out.append(list(views.most_free_first()))
    out.append(views.free_capacity())
    out.append(views.cheapest(nodes))
    return out


def test_an_untouched_node_is_reused_and_a_touched_one_computed_again() -> None:
    session = _session(1)
    views = NodeViews(session)
    job = _preemptor(session)
    first = [views.movable(n, job)[0] for n in range(NODES)]
    victim = first[0][0]
    session.plan.evict(victim.key, "consolidation", job.key, "test")
    assert views.movable(1, job)[0] is first[1]  # n1 untouched: reused
    again = views.movable(0, job)[0]
    assert again is not first[0] and victim not in again
    assert _answers(views, job) == _answers(NodeViews(session), job)
    assert views.free_capacity() == free_capacity(session, None)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(-2**63, 2**63 - 1), min_size=3 * 10, max_size=3 * 10))
def test_each_nodes_free_capacity_in_one_pass_is_each_ones_alone(seed: int, values: list[int]) -> None:
    """Over-committed nodes (negative free device shares, CPU or memory) included."""
    session = _session(seed)
    table = session.plan.future
    devices = len(table.dev_free_milli)
    for i in range(devices):
        table.dev_free_milli[i] = values[i % len(values)] // 2**40  # (a device's share fits a milli count)
    for n in range(NODES):
        table.free_milli_cpu[n], table.free_memory_bytes[n] = values[-1 - n], values[n]
    assert list(free_of_each(session.plan.future, None)) == [free_capacity(session, (n,)) for n in range(NODES)]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=12))
def test_after_any_evictions_and_rollbacks_every_answer_is_a_fresh_one(seed: int, steps: list[tuple[bool, int]]) -> None:
    session = _session(seed)
    views = NodeViews(session)
    job = _preemptor(session)
    _answers(views, job)  # everything computed once, then kept
    for _ in evict_or_roll_back(session, job, steps):
        assert _answers(views, job) == _answers(NodeViews(session), job)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([CheapestVictimBreaksTies(), MostFreeFirstV8()]), st.integers(1, 3),
       st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=14))
# a node whose eviction is rolled back falls behind the first node the search never examined
@example(0, MostFreeFirstV8(), 1, [(False, 0), (False, 0), (True, 0)])
def test_a_kept_search_tries_the_nodes_a_fresh_walk_tries(seed: int, order: ConsolidationNodes, most: int,
                                                          steps: list[tuple[bool, int]]) -> None:
    """`nodes_to_try` keeps a search's candidates and re-examines only the nodes touched since
    (an order that does not break ties), or takes the nodes by their bounds (one that does): after
    any evictions and rollbacks it answers as a walk of the cluster from scratch (nodes, order,
    what they lack, movable pods)."""
    session = _session(seed, nodes=7)
    views = NodeViews(session)
    job = _preemptor(session)
    shapes = [(TaskShape.whole(8, 0, 0), array("q", [1] * 7)), (TaskShape.whole(2, 0, 0), array("q", [1, 1, 0, 1, 1, 1, 1]))]
    for i, _ in enumerate(chain([None], evict_or_roll_back(session, job, steps))):  # (first: nothing done yet)
        kept = views.nodes_to_try(job, shapes[:1 + i % 2], order, most)
        fresh = NodeViews(session)._walk_nodes(job, shapes[:1 + i % 2], order, most)[0]  # noqa: SLF001 - the reference walk
        assert [(n, short, [pod.key for pod in pods]) for n, short, pods in kept] == \
            [(n, short, [pod.key for pod in pods]) for n, short, pods in fresh]
        jobs = [session.state.jobs[k] for k in sorted({pod.job_key for _, _, pods in kept for pod in pods})]
        assert _unit_form(views.units(jobs)) == _unit_form(keyed_units(session, jobs, backoff=True))


def test_a_cycle_keeps_the_walks_of_its_most_recent_searches_only() -> None:
    """Searches for jobs of many different eligible nodes keep `KEPT_WALKS` walks (an order that
    does not break ties), the most recently used; each answer is still a fresh walk's."""
    session = _session(3, nodes=7)
    views = NodeViews(session)
    job = _preemptor(session)
    order = MostFreeFirstV8()
    masks = [array("q", [(k >> i) & 1 for i in range(7)]) for k in range(1, 2 * KEPT_WALKS + 1)]
    for _ in range(2):
        for mask in masks:
            shapes = [(TaskShape.whole(2, 0, 0), mask)]
            assert [n for n, _, _ in views.nodes_to_try(job, shapes, order, 2)] == \
                [n for n, _, _ in NodeViews(session).nodes_to_try(job, shapes, order, 2)]
            assert len(views._walks) <= KEPT_WALKS  # noqa: SLF001 - what the test is about
    assert len(views._walks) == KEPT_WALKS  # noqa: SLF001


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 3), st.lists(st.integers(0, 6), max_size=4),
       st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=10))
def test_a_search_sees_what_an_earlier_action_did_on_the_plan(seed: int, most: int, reserved: list[int],
                                                              steps: list[tuple[bool, int]]) -> None:
    """Room held before the first operation (a moved pod's replacement's, `Plan.reserve`) and
    evictions and rollbacks made before the views exist (reclaim's or preempt's of the same
    cycle, say) change nodes' free capacity: a search by bounds (an order that breaks ties) tries
    the nodes a walk of the Plan as it is tries."""
    session = _session(seed, nodes=7)
    job = _preemptor(session)
    one_gpu = next(pod.spec for pod in session.state.pods.values() if pod.status == "Running")
    for n in reserved:
        session.plan.reserve(one_gpu, f"n{n}")
    for _ in evict_or_roll_back(session, job, steps):
        pass
    shapes = [(TaskShape.whole(2, 0, 0), array("q", [1] * 7))]
    views = NodeViews(session)
    order = CheapestVictimBreaksTies()
    assert views.free_capacity() == free_capacity(session, None)
    assert [n for n, _, _ in views.nodes_to_try(job, shapes, order, most)] == \
        [n for n, _, _ in views._walk_nodes(job, shapes, order, most)[0]]  # noqa: SLF001 - the reference walk
    for _ in evict_or_roll_back(session, job, steps[::-1]):  # and after the views' own operations
        assert views.free_capacity() == free_capacity(session, None)
