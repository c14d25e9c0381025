"""Tests that take a rule out: the version that brought it, and every later version that kept
its class of the rule (scenarios run the default version), get the older class instead."""

from __future__ import annotations

import dataclasses

import pytest

from kai_es.scheduling import policy


def without(monkeypatch: pytest.MonkeyPatch, since: str, rule: str, old: object) -> None:
    """Policy `since` and every version whose `rule` is of `since`'s class, with `rule` = `old`."""
    new = type(getattr(policy.POLICIES[since].rules, rule))
    for version, value in sorted(policy.POLICIES.items()):
        if type(getattr(value.rules, rule)) is new:
            monkeypatch.setitem(policy.POLICIES, version,  # type: ignore[arg-type]
                                dataclasses.replace(value, rules=dataclasses.replace(value.rules, **{rule: old})))
