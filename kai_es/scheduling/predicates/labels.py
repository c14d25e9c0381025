"""Label selectors (pod labels, namespace labels). Pure.

Contract: `selector_matches(sel, labels)` is Kubernetes' LabelSelector semantics: every
`match_labels` pair and every expression must hold; an empty selector matches everything;
`None` (no selector) matches nothing. `describe(sel)` renders it as `kubectl` would show it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kai_es.events import payloads as p


def set_operator_holds(operator: str, value: str | None, values: Sequence[str]) -> bool:
    """`In`, `NotIn`, `Exists`, `DoesNotExist` on a label's value (None: the label is absent);
    label selectors and node selectors share these."""
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    return value is None  # DoesNotExist


def requirement_holds(req: p.LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    return set_operator_holds(req.operator, labels.get(req.key), req.values)


def selector_matches(sel: p.LabelSelector | None, labels: Mapping[str, str]) -> bool:
    if sel is None:
        return False
    for key, value in sel.match_labels.items():
        if labels.get(key) != value:
            return False
    return all(requirement_holds(r, labels) for r in sel.match_expressions)


def describe(sel: p.LabelSelector | None) -> str:
    if sel is None:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted(sel.match_labels.items())]
    for r in sel.match_expressions:
        if r.operator in ("In", "NotIn"):
            parts.append(f"{r.key} {r.operator.lower()} ({','.join(r.values)})")
        elif r.operator == "Exists":
            parts.append(r.key)
        else:
            parts.append(f"!{r.key}")
    return ",".join(parts) if parts else "<all>"
