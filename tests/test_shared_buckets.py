"""Victim units shared by a cycle's actions (`victims.SharedBuckets`): a (queue, priority)
bucket's units are reused while no Plan operation touched one of its jobs, and built again —
equal to `keyed_units` on the Plan as it is now — once one did."""

from __future__ import annotations

from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.session import Session
from kai_es.scheduling.victims import keyed_units, shared
from tests.builders import MakeNode, MakePod, queue, scenario_text


def _session() -> Session:
    docs = [MakeNode("n1").gpus(8).obj(), queue("a", gpu_quota=4), queue("b", gpu_quota=4)]
    docs += [MakePod(f"a{i}", queue="a").gpu(1).running_on("n1", str(i)).obj() for i in range(3)]
    docs += [MakePod(f"b{i}", queue="b").gpu(1).running_on("n1", str(3 + i)).obj() for i in range(3)]
    scenario = load_scenario_text(scenario_text(*docs), "shared-buckets")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config))
    return Session(state, plan, scenario.start_ns, policy_for("kai-es/v11").rules, scenario.config)


def _bucket(session: Session, queue_name: str) -> tuple[tuple[str, int], list[object]]:
    (priority, keys), = session.state.victim_jobs[queue_name].items()
    return (queue_name, priority), [session.state.jobs[k] for k in sorted(keys)]


def test_an_untouched_bucket_is_reused_and_a_touched_one_built_again() -> None:
    session = _session()
    buckets = shared(session)
    assert shared(session) is buckets  # one per cycle's Session
    bucket_a, jobs_a = _bucket(session, "a")
    bucket_b, jobs_b = _bucket(session, "b")
    first_a = buckets.units(session, bucket_a, jobs_a)  # type: ignore[arg-type]
    first_b = buckets.units(session, bucket_b, jobs_b)  # type: ignore[arg-type]
    assert len(first_a) == len(first_b) == 3

    victim = first_a[0][1].pods[0]
    session.plan.evict(victim.key, "reclaim", "default/b9", "test")
    assert buckets.units(session, bucket_b, jobs_b) is first_b  # no job of b was touched: reused
    again_a = buckets.units(session, bucket_a, jobs_a)  # type: ignore[arg-type]
    assert again_a is not first_a
    assert again_a == keyed_units(session, jobs_a, backoff=True)  # type: ignore[arg-type]
    assert victim.key not in {pod.key for _, unit in again_a for pod in unit.pods}
    assert len(again_a) == 2
