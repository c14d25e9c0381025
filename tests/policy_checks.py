"""Checks shared by the policy-version tests."""

from __future__ import annotations

import dataclasses

from kai_es.scheduling import policy
from kai_es.state.versions import FOLD_RULES


def assert_one_fold_rule_added(previous: str, version: str, rule: str) -> None:
    """`version` decides as `previous` (the same rules and actions), its fold rules are
    `previous`'s with `rule` on, and `rule` is on in exactly the versions from `version` on (in
    release order)."""
    old, new = policy.POLICIES[previous], policy.POLICIES[version]
    assert new.rules == old.rules and new.actions == old.actions
    assert FOLD_RULES[version] == dataclasses.replace(FOLD_RULES[previous], **{rule: True})
    released = list(FOLD_RULES)
    since = released.index(version)
    assert all(getattr(FOLD_RULES[v], rule) == (i >= since) for i, v in enumerate(released))
