"""Bounds on the shape of parsed YAML: what aliases and nesting may make of a small file.

YAML anchors let a small text describe a huge or deep structure: ten aliases to ten aliases
... (a "billion laughs") expand exponentially when walked, a chain of aliases nests deeper
than any recursive walk (or the C stack) survives, and an alias inside its own anchor builds a
structure that contains itself. PyYAML builds these without expanding them; the walks after it
(`copy.deepcopy`, validation, encoding) would not survive them.

Contract: `check_shape(doc)` measures, without recursion and in time linear in the distinct
containers of `doc`, its depth and its size as if every alias were expanded, and raises
`ShapeError` (a `yaml.YAMLError`) when the depth exceeds `MAX_DEPTH`, the expanded size
exceeds `MAX_EXPANDED`, a container contains itself, or a map has a key that is not a string
(a Kubernetes object is JSON, whose keys are strings: YAML's `1:` or `null:` is not; the
message names the key's path). Documents written without anchors pass whenever their depth is
within bounds (their expanded size is their size).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import yaml

#: deeper than any Kubernetes object (the API server's own JSON limit is far above real use;
#: a pod spec nests about 15 levels)
MAX_DEPTH: Final = 200
#: containers and scalars, aliases expanded: a 50 MB scenario of ordinary objects holds a few
#: million
MAX_EXPANDED: Final = 50_000_000


class ShapeError(yaml.YAMLError):
    """A document whose structure is outside the bounds of the module contract."""


_CONTAINERS: Final = (dict, list, tuple)


def _entries(node: Any, path: str, where: str) -> Iterable[tuple[str | int, Any]]:
    """(key or index, value) of a container, a map's keys checked to be strings."""
    if not isinstance(node, dict):
        return enumerate(node)
    for k in node:
        if not isinstance(k, str):
            raise ShapeError(f"{where} at {path or '<top>'}: the key {k!r} is not a string "
                             f"({type(k).__name__}): keys of a Kubernetes object are strings (quote it)")
    return node.items()


def check_shape(doc: Any, where: str = "the document") -> None:
    """Raise ShapeError if `doc` breaks a bound of the module contract."""
    if not isinstance(doc, _CONTAINERS):
        return
    size: dict[int, int] = {}   # id -> expanded size (keys and values), for finished containers
    depth: dict[int, int] = {}  # id -> depth below it, for finished containers
    on_path: set[int] = set()
    stack: list[tuple[Any, bool, str]] = [(doc, False, "")]
    while stack:
        node, done, path = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            s, d = 1 + (len(node) if isinstance(node, dict) else 0), 0
            for kid in (node.values() if isinstance(node, dict) else node):
                if isinstance(kid, _CONTAINERS):
                    s += size[id(kid)]
                    d = max(d, depth[id(kid)])
                else:
                    s += 1
            size[key], depth[key] = s, d + 1
            if s > MAX_EXPANDED:
                raise ShapeError(f"{where} expands to more than {MAX_EXPANDED:,} values through YAML "
                                 "aliases (an alias bomb?): refusing it")
            if d + 1 > MAX_DEPTH:
                raise ShapeError(f"{where} nests deeper than {MAX_DEPTH} levels: refusing it")
            continue
        if key in size:
            continue
        if len(on_path) >= MAX_DEPTH:
            raise ShapeError(f"{where} nests deeper than {MAX_DEPTH} levels: refusing it")
        on_path.add(key)
        stack.append((node, True, path))
        for label, kid in _entries(node, path, where):
            if isinstance(kid, _CONTAINERS):
                if id(kid) in on_path:
                    raise ShapeError(f"{where} contains itself through a YAML alias: refusing it")
                if id(kid) not in size:
                    where_kid = f"{path}[{label}]" if isinstance(label, int) else f"{path}.{label}" if path else label
                    stack.append((kid, False, where_kid))
