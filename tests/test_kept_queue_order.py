"""The Session keeps each queue's order key and candidate on its node (`QueueNode.order`), and
every accounting change the Plan announces drops them along that queue's chain: a pick after
any operation is the pick of a Session that kept nothing. Written as KAI users write it: two
teams under one department, each with running one-GPU pods and one waiting."""

from __future__ import annotations

from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.session import Candidate, Session
from tests.builders import MakeNode, MakePod, queue, scenario_text


def _session() -> Session:
    docs = [MakeNode("n1").gpus(8).obj(), queue("dept", gpu_quota=8),
            queue("team-a", gpu_quota=4, parent="dept"), queue("team-b", gpu_quota=4, parent="dept")]
    for team in ("team-a", "team-b"):
        docs += [MakePod(f"{team}-run-{i}", queue=team).gpu(1).running_on("n1").obj() for i in range(2)]
        docs.append(MakePod(f"{team}-next", queue=team).gpu(1).obj())
    scenario = load_scenario_text(scenario_text(*docs), "kept-queue-order")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config), verify=False)
    return Session(state, plan, scenario.start_ns, policy_for(scenario.config.policy_version).rules, scenario.config)


def _leaf_of(pick: Candidate | None) -> str:
    assert pick is not None
    return pick[0].name


def _fresh_pick(session: Session) -> Candidate | None:
    for q in session.queues.values():
        q.order = None
    return session.pick(session.roots)


def test_an_eviction_in_one_team_reorders_the_next_pick() -> None:
    session = _session()
    first = _leaf_of(session.pick(session.roots))
    other = "team-b" if first == "team-a" else "team-a"
    # the other team gives a GPU back: it now holds less than the first, so it goes first
    session.plan.evict(f"default/{other}-run-0", "reclaim", "default/x", "test")
    assert all(q.order is None for q in session.queues[other].chain)
    assert session.queues[first].order is not None  # (a team the eviction did not touch keeps its own)
    kept = session.pick(session.roots)
    assert _leaf_of(kept) == other
    assert kept == _fresh_pick(session)


def test_a_rollback_restores_the_order_it_undoes() -> None:
    session = _session()
    before = session.pick(session.roots)
    cp = session.plan.checkpoint()
    session.plan.evict(f"default/{'team-b' if _leaf_of(before) == 'team-a' else 'team-a'}-run-0",
                       "reclaim", "default/x", "test")
    session.pick(session.roots)
    session.plan.rollback(cp)
    assert session.pick(session.roots) == before == _fresh_pick(session)
