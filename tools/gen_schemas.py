"""Generate `schemas/<type>.v<version>.json`: one JSON Schema (draft 2020-12) per event type and
version, for the whole CloudEvents envelope with that type's payload, derived from the msgspec
payload definitions.

    python tools/gen_schemas.py          # write missing/changed files
    python tools/gen_schemas.py --check  # exit 1 if any file is missing or differs (CI)

Published files never change: if a payload changes shape, bump its schema version (a new file)
and add an upcaster; --check fails when an existing version's file would change.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kai_es.events.registry import EVENT_TYPES, SCHEMA_VERSIONS  # noqa: E402

SCHEMA_DIR = ROOT / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_for(type_name: str, payload: type) -> dict[str, Any]:
    version = SCHEMA_VERSIONS[type_name]
    envelope = msgspec.defstruct(
        "Envelope",
        [
            ("specversion", Literal["1.0"]),
            ("id", str),
            ("type", Literal[type_name]),  # type: ignore[valid-type]
            ("source", str),
            ("subject", str),
            ("time", str),
            ("datacontenttype", Literal["application/json"]),
            ("schemaversion", Literal[version]),  # type: ignore[valid-type]
            ("logicaltime", int),
            ("causationid", str, msgspec.UNSET),
            ("correlationid", str, msgspec.UNSET),
            ("basedon", int, msgspec.UNSET),
            ("policyversion", str, msgspec.UNSET),
            ("statedigest", str, msgspec.UNSET),
            ("data", payload),
        ],
        kw_only=True,
        forbid_unknown_fields=True,
    )
    body = msgspec.json.schema(envelope)
    out: dict[str, Any] = {
        "$schema": DIALECT,
        "$id": f"https://kai-es.io/schemas/{type_name}.v{version}.json",
        "title": f"{type_name} v{version}",
    }
    out.update(body)
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _same_schema(current: str, text: str) -> bool:
    """Whether a published file states the schema `text` does: the same JSON but for the order
    of a "required" list (a set: a payload's fields reordered, as `PodObserved`'s were into name
    order, state the same schema; the published file is kept as it was)."""
    def norm(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: sorted(v) if k == "required" and isinstance(v, list) else norm(v) for k, v in node.items()}
        if isinstance(node, list):
            return [norm(v) for v in node]
        return node
    try:
        return bool(norm(json.loads(current)) == norm(json.loads(text)))
    except ValueError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args()
    problems = []
    expected_files = set()
    for type_name, payload in sorted(EVENT_TYPES.items()):
        path = SCHEMA_DIR / f"{type_name}.v{SCHEMA_VERSIONS[type_name]}.json"
        expected_files.add(path.name)
        text = render(schema_for(type_name, payload))
        current = path.read_text() if path.exists() else None
        if current is not None and (current == text or _same_schema(current, text)):
            continue
        if args.check:
            problems.append(f"{path.relative_to(ROOT)}: {'missing' if current is None else 'differs from the payload types'}")
        else:
            SCHEMA_DIR.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check:
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run: python tools/gen_schemas.py  (and bump the schema version if a published one changed)",
                  file=sys.stderr)
            return 1
        print(f"schemas: {len(expected_files)} files up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
