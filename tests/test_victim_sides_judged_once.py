"""Reclaim's victim filter by queue (`rules.reclaim_victims`, KAI's victim filter) depends on a
victim queue only through the two sides below its common ancestor with the reclaimer: the judge
asks it once per pair of sides, not once per victim queue, and its buckets are those of the
filter asked victim by victim. Queues written as a KAI user writes them: departments with
quotas, teams below them, jobs running over quota."""

from __future__ import annotations

from typing import Any

import pytest

from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.rules.reclaim_victims import QueuePriorityInQuota, sides
from kai_es.scheduling.session import Session
from tests.builders import MakeNode, MakePod, queue, scenario_text

TEAMS = 4


#: GPUs running in each team (quota 2 each): the reclaimer's team none, one team under its quota
RUNNING = {"team-0-0": 0, "team-0-1": 1, "team-0-2": 3, "team-0-3": 3,
           "team-1-0": 3, "team-1-1": 3, "team-1-2": 3, "team-1-3": 3}


def _session(priority_in_quota: bool) -> Session:
    docs: list[dict[str, Any]] = [MakeNode(f"n{i}").gpus(8).obj() for i in range(4)]
    for d, quota in ((0, 16), (1, 8)):  # dept-1 runs 12 GPUs over its quota of 8
        docs.append(queue(f"dept-{d}", gpu_quota=quota, priority=100 + d))
        docs += [queue(f"team-{d}-{t}", gpu_quota=2, parent=f"dept-{d}") for t in range(TEAMS)]
    n = 0
    for team, gpus in RUNNING.items():
        for k in range(gpus):
            docs.append(MakePod(f"r-{team}-{k}", queue=team).gpu(1).running_on(f"n{n // 8}", str(n % 8)).obj())
            n += 1
    docs.append(MakePod("waiting", queue="team-0-0").gpu(2).obj())
    settings = {"scheduler": {"queuePriorityInQuotaReclaim": True}} if priority_in_quota else None
    scenario = load_scenario_text(scenario_text(*docs, settings=settings), "victim-sides")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config))
    return Session(state, plan, scenario.start_ns, policy_for("kai-es/v15").rules, scenario.config)


@pytest.mark.parametrize("priority_in_quota", [False, True])
def test_the_filter_is_asked_once_per_pair_of_sides(priority_in_quota: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    session = _session(priority_in_quota)
    judge = QueuePriorityInQuota().judge(session)
    leaf = session.queues["team-0-0"]
    job = session.state.jobs[session.state.pods["default/waiting"].job_key]
    victims = [session.queues[name] for name in sorted(session.state.victim_jobs)]
    assert len(victims) == 2 * TEAMS - 1
    # the filter asked victim by victim, as KAI asks it
    expected = []
    for victim in victims:
        found = sides(leaf, victim)
        if victim is not leaf and found is not None and \
                judge._candidate_side(found[1], found[2], (2000, 0, 0)):  # noqa: SLF001
            expected += [(victim.name, p) for p in sorted(session.state.victim_jobs[victim.name])]
    asked: list[tuple[str, str]] = []
    original = type(judge)._candidate_side  # noqa: SLF001

    def counting(self: Any, mine: Any, theirs: Any, request: Any) -> bool:
        asked.append((mine.name, theirs.name))
        return original(self, mine, theirs, request)

    monkeypatch.setattr(type(judge), "_candidate_side", counting)
    got = judge.victim_buckets(leaf, job, (2000, 0, 0))
    assert got == expected
    # the other department's teams pass (its side is over quota), the sibling under its quota not
    assert {name for name, _ in got} == {"team-0-2", "team-0-3", "team-1-0", "team-1-1", "team-1-2", "team-1-3"}
    # one ask for the other department (its four teams share the sides dept-0 / dept-1), one
    # for each sibling team of the reclaimer
    assert sorted(asked) == sorted([("dept-0", "dept-1"), *(("team-0-0", f"team-0-{t}") for t in range(1, TEAMS))])
