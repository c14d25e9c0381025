"""Upcasters: turn an older schema version's payload fields into the current version's.

Contract: `UPCASTERS[(type, v)]` maps the fields of version v to version v+1; `upcast` chains
them. Published versions never change; add a function here when a new version is introduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kai_es.events.registry import SCHEMA_VERSIONS

Fields = dict[str, Any]

UPCASTERS: Final[dict[tuple[str, int], Callable[[Fields], Fields]]] = {}


class UpcastError(ValueError):
    """No upcaster path exists from a version to the current one."""


def upcast(event_type: str, version: int, fields: Fields) -> Fields:
    """Fields of `event_type` at `version`, upcast step by step to its current version."""
    while version < SCHEMA_VERSIONS[event_type]:
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise UpcastError(f"{event_type}: no upcaster from schema version {version}")
        fields = step(fields)
        version += 1
    return fields
