"""A policy version is a value: its actions and rule objects (`kai_es.scheduling.rules`). No
action, rule or Session asks which version is in force; only the registry names versions."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from kai_es.scheduling.policy import POLICIES
from kai_es.scheduling.rules import Rules
from kai_es.state.versions import FOLD_RULES

SCHEDULING = Path(__file__).resolve().parents[1] / "kai_es" / "scheduling"


def _version_reads(path: Path) -> list[str]:
    """Where `path`'s code (docstrings aside) names a policy version or reads the config's."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "kai-es/v" in node.value \
                and id(node) not in docstrings:
            out.append(f"{path.name}:{node.lineno}: names {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr == "policy_version":
            out.append(f"{path.name}:{node.lineno}: reads policy_version")
        elif isinstance(node, ast.ImportFrom) and node.module == "kai_es.scheduling.policy":
            out.append(f"{path.name}:{node.lineno}: imports the registry")
    return out


def test_no_action_rule_or_session_asks_for_the_version() -> None:
    files = [*sorted((SCHEDULING / "actions").glob("*.py")), *sorted((SCHEDULING / "rules").glob("*.py")),
             SCHEDULING / "session.py", SCHEDULING / "victims.py", SCHEDULING / "plan.py"]
    assert len(files) > 20
    assert [hit for f in files for hit in _version_reads(f)] == []


def test_every_version_sets_every_rule_and_the_fold_table_has_the_same_versions() -> None:
    assert sorted(POLICIES) == sorted(FOLD_RULES)
    for version, policy in POLICIES.items():
        assert policy.version == version
        assert isinstance(policy.rules, Rules)
        for f in dataclasses.fields(Rules):
            assert getattr(policy.rules, f.name) is not None, (version, f.name)
        assert set(policy.actions) <= policy.accepted and set(policy.default_actions) <= set(policy.actions)


def test_each_version_differs_from_the_previous_by_named_rules() -> None:
    """A newer version changes rules by replacing rule objects with ones of another class."""
    versions = list(POLICIES)  # (release order: "v10" sorts before "v2")
    changed = {}
    for old, new in zip(versions, versions[1:]):
        a, b = POLICIES[old].rules, POLICIES[new].rules
        changed[new] = sorted(f.name for f in dataclasses.fields(Rules)
                              if type(getattr(a, f.name)) is not type(getattr(b, f.name)))
    assert changed == {
        "kai-es/v2": ["device_order", "fair_share_division", "queue_order"],
        "kai-es/v3": ["fair_share_division", "hopeless_batch", "min_runtime", "preemption_delay",
                      "victim_search", "wakeups"],
        "kai-es/v4": ["gang_restoration", "leaving_pods", "replacement", "staleness", "victim_eligibility",
                      "victim_search"],
        "kai-es/v5": ["topology_placement"],
        "kai-es/v6": ["fair_share_division", "move_decisions", "preemptors", "reclaim_victims", "replacement",
                      "victim_order"],
        "kai-es/v7": ["preemption_delay", "releasing_capacity", "wakeups"],
        "kai-es/v8": ["move_holds", "reclaim_victims", "replacement", "search_backoff", "semi_preemptible",
                      "wakeups"],
        "kai-es/v9": ["consolidation_nodes", "reclaim_victims"],
        "kai-es/v10": ["background_pods", "elastic_surplus", "fair_share_division", "queue_limits",
                       "queue_order", "releasing_capacity", "staleness"],
        "kai-es/v11": ["victim_queue_order"],
        "kai-es/v12": ["replacement_order"],
        "kai-es/v13": ["queue_depth", "stuck_record", "tried_order"],
        "kai-es/v14": ["scheduling_readiness"],
        "kai-es/v15": [],  # (a fold rule only)
        "kai-es/v16": [],  # (a digest form only)
    }
