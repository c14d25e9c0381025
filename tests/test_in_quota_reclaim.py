"""In-quota reclaim by queue priority (kai-es/v8, `queuePriorityInQuotaReclaim`, KAI #2065 /
#2104, off by default): the scenario (KAI #2065's first case, written as a KAI user writes
Queues) holds on both packers and fails without the flag or with the rule removed; the
priority must be strictly lower and the reclaimer must stay within its quota; older versions
refuse the key, and a config without it digests as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.config import ConfigError, config_to_dict, parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.reclaim_victims import KaiReclaimStrategies
from tests.test_cycle_scenarios import check, expectations

SCENARIO = Path(__file__).parent / "scenarios" / "v8-in-quota-reclaim-by-queue-priority.yaml"
TEXT = SCENARIO.read_text()


class _Ignoring(KaiReclaimStrategies):
    """kai-es/v6's strategies that accept the key and ignore it."""

    __slots__ = ()
    honours_queue_priority = True


def _cycle(text: str, engine: str = "native") -> dict[str, Any]:
    return one_cycle(load_scenario_text(text, SCENARIO.name), load_packer(engine))  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_higher_priority_queue_within_quota_takes_in_quota_resources(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(one_cycle(load_scenario(SCENARIO), load_packer(engine)), expectations(SCENARIO))  # type: ignore[arg-type]
    with pytest.raises(AssertionError):  # the flag off (the default)
        check(_cycle(TEXT.replace(", queuePriorityInQuotaReclaim: true", ""), engine), expectations(SCENARIO))
    for version, value in sorted(policy.POLICIES.items()):  # v8 on: every version that honours it
        if value.rules.reclaim_victims.honours_queue_priority:
            monkeypatch.setitem(policy.POLICIES, version,  # type: ignore[arg-type]
                                dataclasses.replace(value, rules=dataclasses.replace(value.rules,
                                                                                     reclaim_victims=_Ignoring())))
    with pytest.raises(AssertionError):  # the rule removed (the key still accepted)
        check(_cycle(TEXT, engine), expectations(SCENARIO))


@pytest.mark.parametrize(("change", "why"), [
    (("  priority: 80\n", "  priority: 90\n"), "equal priorities"),
    (("  priority: 80\n", "  priority: 95\n"), "the victim's queue is of higher priority"),
    (("gpu: {quota: 8, limit: -1, overQuotaWeight: 1}\n---\napiVersion: scheduling.run.ai/v2\nkind: Queue\n"
      "metadata: {name: research}", "gpu: {quota: 4, limit: -1, overQuotaWeight: 1}\n---\napiVersion: "
      "scheduling.run.ai/v2\nkind: Queue\nmetadata: {name: research}"), "the reclaimer would exceed its quota"),
])
def test_the_priority_is_strictly_lower_and_the_reclaimer_within_its_quota(change: tuple[str, str], why: str) -> None:
    text = TEXT.replace(*change)
    assert text != TEXT, why
    pods = _cycle(text)["pods"]
    assert pods["default/train"]["status"] == "Running", why
    assert pods["default/serve"]["status"] == "Pending", why


def test_older_versions_refuse_the_key_and_a_config_without_it_is_unchanged() -> None:
    with pytest.raises(ConfigError, match=r"kai-es/v7 .*queuePriorityInQuotaReclaim"):
        parse_config({"policyVersion": "kai-es/v7", "queuePriorityInQuotaReclaim": True})
    assert "queuePriorityInQuotaReclaim" not in config_to_dict(parse_config({}))
    assert config_to_dict(parse_config({"queuePriorityInQuotaReclaim": True}))["queuePriorityInQuotaReclaim"] is True
    with pytest.raises(ConfigError, match="queuePriorityInQuotaReclaim"):
        parse_config({"queuePriorityInQuotaReclaim": "yes"})
