"""`Session.job_candidate` for a job of one pod takes a short path (the preempting actions ask
it for every waiting job, most of them one pod): its answer and the gang minimum it records must
be the full rule's (`Session._minimum_of`: readiness, then `gang.minimum`) for a pod written the
ways KAI users write it — no PodGroup (an implicit group of one), a PodGroup of minMember 1, and
a PodGroup of minMember 0 (whose minimum is empty: the pod is tried as an extra) — under the
readiness rule of each policy version."""

from __future__ import annotations

import pytest

from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.gang import Minimum
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.session import Session
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text


def _session(version: str) -> Session:
    docs = [MakeNode("n1").gpus(8).obj(), queue("team-a", gpu_quota=4)]
    docs += [MakePod("alone").gpu(1).obj()]
    docs += [podgroup("pg-one", 1), MakePod("one").group("pg-one").gpu(1).obj()]
    docs += [podgroup("pg-zero", 0), MakePod("zero").group("pg-zero").gpu(2).obj()]
    docs += [podgroup("pg-two", 2), MakePod("two-0").group("pg-two").gpu(1).obj(),
             MakePod("two-1").group("pg-two").gpu(1).obj()]
    scenario = load_scenario_text(scenario_text(*docs), "one-pod-candidate")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config), verify=False)
    return Session(state, plan, scenario.start_ns, policy_for(version).rules, scenario.config)


def _full_rule(session: Session, job_key: str, exclude: set[str]) -> tuple[Minimum, list[str], object]:
    job = session.state.jobs[job_key]
    pods = [session.state.pods[e.pod_key] for e in job.pending if e.pod_key not in exclude]
    need, chosen = session._minimum_of(job, pods)  # noqa: SLF001 - the rule the short path stands for
    return need, [p.key for p in chosen], session.request_of(chosen)


@pytest.mark.parametrize("version", ["kai-es/v13", "kai-es/v14", "kai-es/v15"])
def test_a_one_pod_jobs_candidate_is_the_full_rules(version: str) -> None:
    session = _session(version)
    jobs = {session.state.pods[k].job_key: k for k in ("default/alone", "default/one", "default/zero")}
    assert len(jobs) == 3
    minimums = {}
    for job_key, pod_key in jobs.items():
        job = session.state.jobs[job_key]
        for exclude in (None, session.placed_pods):
            picked = session.job_candidate(job, exclude=exclude)
            assert picked is not None
            got = (session.gang[job_key], [p.key for p in picked[0]], picked[1])
            assert got == _full_rule(session, job_key, session.done if exclude is None else exclude), job_key
            assert got[1] == [pod_key]
        minimums[pod_key] = [p.key for p in session.gang[job_key].pods]
    # the three ways differ where they should: minMember 0 has no minimum to keep
    assert minimums == {"default/alone": ["default/alone"], "default/one": ["default/one"], "default/zero": []}


def test_a_gang_and_a_placed_pod_take_the_full_rule() -> None:
    session = _session("kai-es/v15")
    gang = session.state.jobs[session.state.pods["default/two-0"].job_key]
    picked = session.job_candidate(gang)
    assert picked is not None and [p.key for p in picked[0]] == ["default/two-0", "default/two-1"]
    assert session.gang[gang.key].pods == tuple(picked[0])
    # a one-pod job whose pod an earlier action placed (allocate's try_ahead asks with the
    # cycle's done pods, which hold the placed ones): nothing left to place
    alone = session.state.jobs[session.state.pods["default/alone"].job_key]
    session.placed_pods.add("default/alone")
    session.done.add("default/alone")
    assert session.job_candidate(alone) is None
    picked = session.job_candidate(alone, exclude=set())
    assert picked is not None
    got = (session.gang[alone.key], [p.key for p in picked[0]], picked[1])
    assert got == _full_rule(session, alone.key, set())
    assert got[0] == Minimum(())  # the placed pod occupies: the minimum is met, the pod an extra
