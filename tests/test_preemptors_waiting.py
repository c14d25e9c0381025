"""Which pending pods the preempting actions may make room for (`rules.preemptors.PendingPods`,
kai-es/v4 on): every pending pod of a leaf queue that the cycle has not placed, sorted — asked
once per action, so pods placed between two asks drop out of the second."""

from __future__ import annotations

from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.rules.preemptors import PendingPods
from kai_es.scheduling.session import Session
from tests.builders import MakeNode, MakePod, queue, scenario_text


def _session() -> Session:
    docs = [MakeNode("n1").gpus(8).obj(), queue("dept"), queue("a", gpu_quota=4, parent="dept"),
            queue("b", gpu_quota=4, parent="dept")]
    docs += [MakePod(f"a{i}", queue="a").gpu(1).obj() for i in (2, 0, 1)]
    docs += [MakePod("b0", queue="b").gpu(1).obj()]
    docs += [MakePod("r0", queue="a").gpu(1).running_on("n1", "0").obj()]  # running: not pending
    scenario = load_scenario_text(scenario_text(*docs), "preemptors-waiting")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config))
    return Session(state, plan, scenario.start_ns, policy_for("kai-es/v14").rules, scenario.config)


def test_the_pending_pods_of_leaf_queues_not_placed_yet_sorted_at_each_ask() -> None:
    session = _session()
    rule = PendingPods()
    every = ["default/a0", "default/a1", "default/a2", "default/b0"]
    assert rule.waiting(session) == every
    session.placed_pods.add("default/a1")  # placed by an earlier action of the cycle
    assert rule.waiting(session) == ["default/a0", "default/a2", "default/b0"]
    session.placed_pods.discard("default/a1")  # its placement rolled back
    assert rule.waiting(session) == every
