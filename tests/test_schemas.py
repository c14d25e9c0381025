"""schemas/ is generated from the payload types and validates real and broken events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kai_es.events import encode
from kai_es.events.registry import EVENT_TYPES, SCHEMA_VERSIONS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "data" / "schema-examples"


def _validator(type_name: str, version: int | None = None) -> jsonschema.Draft202012Validator:
    """The validator of `type_name` at `version` (default: its current version)."""
    version = SCHEMA_VERSIONS[type_name] if version is None else version
    schema = json.loads((ROOT / "schemas" / f"{type_name}.v{version}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_files_are_up_to_date() -> None:
    run = subprocess.run([sys.executable, "tools/gen_schemas.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_every_type_has_a_schema_for_every_published_version() -> None:
    """Published schema files are never removed: every version up to the current one is there."""
    for type_name in EVENT_TYPES:
        for version in range(1, SCHEMA_VERSIONS[type_name] + 1):
            assert (ROOT / "schemas" / f"{type_name}.v{version}.json").exists(), (type_name, version)


@pytest.mark.parametrize("path", sorted((EXAMPLES / "valid").glob("*.json")), ids=lambda p: p.name)
def test_valid_examples_validate(path: Path) -> None:
    event = json.loads(path.read_text())
    errors = list(_validator(event["type"], event["schemaversion"]).iter_errors(event))
    assert errors == []


@pytest.mark.parametrize("path", sorted((EXAMPLES / "invalid").glob("*.json")), ids=lambda p: p.name)
def test_invalid_examples_are_rejected(path: Path) -> None:
    case = json.loads(path.read_text())
    event = case["event"]
    version = event["schemaversion"] if isinstance(event.get("schemaversion"), int) else None
    errors = list(_validator(event["type"], version).iter_errors(event))
    assert errors, f"{path.name} should be invalid: {case['why']}"
    assert any(case["expect"] in e.message or case["expect"] in str(list(e.path)) for e in errors), \
        [e.message for e in errors]


def test_examples_exist_for_both_kinds() -> None:
    assert len(list((EXAMPLES / "valid").glob("*.json"))) >= 5
    assert len(list((EXAMPLES / "invalid").glob("*.json"))) >= 4


def test_events_from_a_simulation_validate(tmp_path: Path) -> None:
    from kai_es.adapters.file_log import FileEventLog

    run = subprocess.run([sys.executable, "-m", "kai_es", "simulate", "examples/quickstart.yaml",
                          "--log", str(tmp_path / "q.log"), "--report", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    validators: dict[tuple[str, int], jsonschema.Draft202012Validator] = {}
    count = 0
    for record in FileEventLog(tmp_path / "q.log", readonly=True).scan():
        env = record.envelope
        key = (env.type, env.schemaversion)
        v = validators.get(key) or validators.setdefault(key, _validator(*key))
        assert list(v.iter_errors(json.loads(encode(env)))) == [], env.type
        count += 1
    assert count > 50 and len(validators) >= 10
