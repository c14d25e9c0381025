"""Label selectors written as text, as `kubectl get -l` and KAI's plugin arguments take them
(`kai.scheduler/background=true`, `tier in (a,b),!canary`). Pure.

Grammar (Kubernetes' label selector syntax): requirements separated by commas, each one of
`key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`, `key notin (v1,v2)`,
`key>N`, `key<N`; blanks around tokens are ignored. A key is a qualified name (an optional DNS
subdomain prefix and `/`, then a name of at most 63 characters); a value is at most 63
characters of the label value alphabet (empty allowed after `=`, `==`, `!=`).

Contract:
- `parse_selector(text)` gives the requirements in the order written, or raises
  `SelectorError` whose message names the position and what is wrong; it never accepts text
  Kubernetes would refuse, and refuses the empty selector (which would match every pod).
- `selector_holds(requirements, labels)` is true when every requirement holds: `!=` and `notin`
  also hold when the label is absent; `>`/`<` hold only for a label whose value is an integer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, NamedTuple

from kai_es.scheduling.predicates.labels import set_operator_holds

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_INTEGER = re.compile(r"-?[0-9]+")
#: a token: an operator, a parenthesis, a comma, or a run of other characters
_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s=!(),<>]+)")


class SelectorError(ValueError):
    """Selector text Kubernetes would not accept; the message says where and why."""


class Requirement(NamedTuple):
    key: str
    operator: Operator
    values: tuple[str, ...]


def _check_key(key: str, at: int) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        raise SelectorError(f"at {at}: {key!r}: the prefix must be a DNS subdomain")
    if not _NAME.fullmatch(name):
        raise SelectorError(f"at {at}: {key!r} is not a label key (at most 63 characters: "
                            "letters, digits, '-', '_', '.', starting and ending with a letter or digit)")


def _check_value(value: str, at: int) -> None:
    if not _VALUE.fullmatch(value):
        raise SelectorError(f"at {at}: {value!r} is not a label value (at most 63 characters: "
                            "letters, digits, '-', '_', '.', starting and ending with a letter or digit)")


def _tokens(text: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    at = 0
    while at < len(text):
        if text[at:].isspace():
            break
        match = _TOKEN.match(text, at)
        if match is None:  # pragma: no cover - every character starts some token
            raise SelectorError(f"at {at}: unexpected {text[at]!r}")
        out.append((match.group(1), match.start(1)))
        at = match.end()
    return out


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of `text` (see module docstring); raises `SelectorError`."""
    tokens = _tokens(text)
    if not tokens:
        raise SelectorError("empty: it would select every pod")
    out: list[Requirement] = []
    i = 0

    def take() -> tuple[str, int]:
        nonlocal i
        if i >= len(tokens):
            raise SelectorError(f"at {len(text)}: the selector ends too early")
        token = tokens[i]
        i += 1
        return token

    def peek() -> str:
        return tokens[i][0] if i < len(tokens) else ""

    while True:
        token, at = take()
        if token == "!":
            key, at = take()
            _check_key(key, at)
            out.append(Requirement(key, "DoesNotExist", ()))
        else:
            key = token
            _check_key(key, at)
            op = peek()
            if op in ("", ","):
                out.append(Requirement(key, "Exists", ()))
            elif op in ("=", "==", "!="):
                take()
                value, vat = ("", at) if peek() in ("", ",") else take()
                _check_value(value, vat)
                out.append(Requirement(key, "In" if op != "!=" else "NotIn", (value,)))
            elif op in ("<", ">"):
                take()
                value, vat = take()
                if not _INTEGER.fullmatch(value):
                    raise SelectorError(f"at {vat}: {op} needs an integer, not {value!r}")
                out.append(Requirement(key, "Gt" if op == ">" else "Lt", (value,)))
            elif op in ("in", "notin"):
                take()
                paren, pat = take()
                if paren != "(":
                    raise SelectorError(f"at {pat}: expected '(' after {op}")
                values: list[str] = []
                expect_value = True
                while True:
                    value, vat = take()
                    if value in (",", ")"):
                        if expect_value and (value == "," or values):
                            values.append("")  # an empty value: `(,a)`, `(a,,b)`, `(a,)`
                        if value == ")":
                            break
                        expect_value = True
                        continue
                    if not expect_value:
                        raise SelectorError(f"at {vat}: expected ',' or ')', not {value!r}")
                    _check_value(value, vat)
                    values.append(value)
                    expect_value = False
                if not values:
                    raise SelectorError(f"at {pat}: {op} needs at least one value")
                out.append(Requirement(key, "In" if op == "in" else "NotIn", tuple(sorted(set(values)))))
            else:
                raise SelectorError(f"at {tokens[i][1]}: expected an operator after {key!r}, not {op!r}")
        if i == len(tokens):
            return tuple(out)
        sep, sat = take()
        if sep != ",":
            raise SelectorError(f"at {sat}: expected ',' between requirements, not {sep!r}")
        if i == len(tokens):
            raise SelectorError(f"at {sat}: a requirement must follow ','")


def selector_holds(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy every requirement (see module docstring)."""
    for key, operator, values in requirements:
        value = labels.get(key)
        if operator in ("Gt", "Lt"):
            if value is None or not _INTEGER.fullmatch(value):
                return False
            if not (int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])):
                return False
        elif not set_operator_holds(operator, value, values):
            return False
    return True
