"""KAI's `queueDepthPerAction` (policy kai-es/v13, `rules.queue_depth`): an action named in it
considers only the first N waiting jobs of each queue, in KAI's job order (priority, then age).
Written as a KAI user writes it: the setting in the scheduler config (a SchedulingShard's
`spec.queueDepthPerAction`), pods and queues as manifests, one cycle."""

from __future__ import annotations

from typing import Any

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import ConfigError, parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.queue_depth import NoQueueDepthV12
from tests.builders import MakeNode, MakePod, queue, scenario_text
from tests.policy_patch import without


def _cycle(pods: list[MakePod], scheduler: dict[str, Any], queues: list[dict[str, Any]] | None = None,
           engine: str = "native") -> dict[str, Any]:
    text = scenario_text(MakeNode("n1").gpus(8).obj(), *(queues or [queue("team-a")]), *(p.obj() for p in pods),
                         settings={"start": "2026-01-01T12:00:00Z", "scheduler": scheduler})
    return one_cycle(load_scenario_text(text, "queue-depth.yaml"), load_packer(engine))  # type: ignore[arg-type]


def _status(outcome: dict[str, Any]) -> dict[str, str]:
    return {k.split("/", 1)[1]: v["status"] for k, v in outcome["pods"].items()}


def _reasons(outcome: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return next(d["data"]["reasons"] for d in outcome["decisions"]
                if d["type"] == "kai.scheduler.pod.unschedulable" and d["data"]["name"] == name)


def _five() -> list[MakePod]:
    return [MakePod(f"j{i}").gpu(1) for i in range(1, 6)]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_allocate_considers_the_first_jobs_of_each_queue(engine: str) -> None:
    """Five one-GPU jobs, room for all: with `allocate: 2` the two oldest bind this cycle and
    the others are told where they stand and why."""
    outcome = _cycle(_five(), {"actions": ["allocate"], "queueDepthPerAction": {"allocate": 2}}, engine=engine)
    assert _status(outcome) == {"j1": "Binding", "j2": "Binding", "j3": "Pending", "j4": "Pending", "j5": "Pending"}
    for place, name in enumerate(("j3", "j4", "j5"), 3):
        reasons = _reasons(outcome, name)
        assert [r["code"] for r in reasons] == ["BeyondQueueDepth"]
        assert reasons[0]["numbers"] == {"position": place, "depth": 2}
        assert "queueDepthPerAction.allocate" in reasons[0]["message"]


def test_the_depth_follows_kais_job_order_priority_before_age() -> None:
    pods = _five()
    pods[4] = MakePod("j5").gpu(1).priority_class("build")  # the newest, of a higher priority
    outcome = _cycle(pods, {"actions": ["allocate"], "queueDepthPerAction": {"allocate": 2}})
    assert [n for n, s in _status(outcome).items() if s == "Binding"] == ["j1", "j5"]


def test_each_queue_has_its_own_depth() -> None:
    pods = _five() + [MakePod(f"k{i}", "team-b").gpu(1) for i in range(1, 4)]
    outcome = _cycle(pods, {"actions": ["allocate"], "queueDepthPerAction": {"allocate": 1}},
                     queues=[queue("team-a"), queue("team-b")])
    assert sorted(n for n, s in _status(outcome).items() if s == "Binding") == ["j1", "k1"]


class _Accepted(NoQueueDepthV12):
    __slots__ = ()
    honours_depth = True


def test_without_a_depth_or_without_the_rule_every_job_is_considered(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(_status(_cycle(_five(), {"actions": ["allocate"]})).values()) == {"Binding"}
    without(monkeypatch, "kai-es/v13", "queue_depth", _Accepted())  # the setting accepted, not applied
    outcome = _cycle(_five(), {"actions": ["allocate"], "queueDepthPerAction": {"allocate": 2}})
    assert set(_status(outcome).values()) == {"Binding"}


def _reclaim_case(depth: dict[str, int]) -> dict[str, Any]:
    """reclaim-basic's shape: team-b runs 8 one-GPU pods on the only node; team-a (quota 4) has
    three one-GPU jobs waiting."""
    pods = [MakePod(f"b-{i}", "team-b").gpu(1).priority_class("train").running_on("n1") for i in range(8)]
    pods += [MakePod(f"a-{i}", "team-a").gpu(1).priority_class("train") for i in range(1, 4)]
    return _cycle(pods, {"actions": ["allocate", "reclaim"], "queueDepthPerAction": depth},
                  queues=[queue("team-a", gpu_quota=4), queue("team-b", gpu_quota=4)])


def test_reclaim_considers_the_first_jobs_of_each_queue() -> None:
    """Unbounded, each of team-a's jobs reclaims a GPU; with `reclaim: 1` only its oldest does,
    and the others keep what allocate told them (reclaim passes over them, as KAI's does)."""
    full = _status(_reclaim_case({}))
    assert [full[f"a-{i}"] for i in (1, 2, 3)] == ["Pipelined"] * 3
    bounded = _reclaim_case({"reclaim": 1})
    status = _status(bounded)
    assert [status[f"a-{i}"] for i in (1, 2, 3)] == ["Pipelined", "Pending", "Pending"]
    assert sum(1 for n, s in status.items() if n.startswith("b-") and s == "Releasing") == 1
    assert [r["code"] for r in _reasons(bounded, "a-2")][0] == "NoNodeFits"


@pytest.mark.parametrize(("setting", "message"), [
    ({"allocate": 0}, "from 1 to"),
    ({"allocate": -1}, "from 1 to"),
    ({"allocate": 2**128}, "from 1 to"),
    ({"allocate": "2"}, "Expected `int`"),
    ({"allocate": True}, "Expected `int`"),
    ({"alocate": 2}, "Invalid enum value 'alocate'"),
    ({"preempt": 2}, "preempt is not one of them"),
])
def test_a_wrong_depth_is_refused_naming_it(setting: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="queueDepthPerAction") as err:
        parse_config({"actions": ["allocate", "reclaim"], "queueDepthPerAction": setting})
    assert message in str(err.value)


def test_an_older_policy_refuses_the_setting_rather_than_ignore_it() -> None:
    with pytest.raises(ConfigError, match="kai-es/v12 has no queue depth"):
        parse_config({"policyVersion": "kai-es/v12", "queueDepthPerAction": {"allocate": 2}})
