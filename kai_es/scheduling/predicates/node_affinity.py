"""Node affinity: `nodeSelector`, required node affinity (terms ORed, requirements ANDed,
`matchExpressions` on labels and `matchFields` on `metadata.name`), and the preferred terms'
score. Pure.

Contract (Kubernetes' semantics):
- `In`/`NotIn` test membership (`NotIn` and `DoesNotExist` hold when the label is absent);
  `Gt`/`Lt` compare the label's value and the single operand as integers, and fail when either
  is not an integer; a term with no requirements matches no node.
- `preferred_score(terms, node)` is the sum of the weights of the terms the node matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kai_es.events import payloads as p
from kai_es.scheduling.predicates.labels import set_operator_holds


def requirement_holds(req: p.NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    op = req.operator
    if op not in ("Gt", "Lt"):
        return set_operator_holds(op, value, req.values)
    if value is None or len(req.values) != 1:
        return False
    try:
        left, right = int(value), int(req.values[0])
    except ValueError:
        return False
    return left > right if op == "Gt" else left < right


def term_matches(term: p.NodeSelectorTerm, node: p.NodeObserved) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False
    labels = node.labels
    if not all(requirement_holds(r, labels) for r in term.match_expressions):
        return False
    fields = {"metadata.name": node.name}
    return all(requirement_holds(r, fields) for r in term.match_fields)


def selector_allows(selector: Mapping[str, str], node: p.NodeObserved) -> bool:
    labels = node.labels
    return all(labels.get(k) == v for k, v in selector.items())


def required_allows(terms: Sequence[p.NodeSelectorTerm], node: p.NodeObserved) -> bool:
    """Whether the node satisfies required terms (no terms: any node)."""
    return not terms or any(term_matches(t, node) for t in terms)


def preferred_score(terms: Sequence[p.PreferredSchedulingTerm], node: p.NodeObserved) -> int:
    return sum(t.weight for t in terms if term_matches(t.term, node))
