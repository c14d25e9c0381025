"""The audit contract on the file log: `kai-es events --follow` prints events appended after it
started and resumes with `--from`; the contract page names every event type; the example
consumer's schema loading and checks (its Kafka side is tests/kafka/test_audit.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kai_es.events.registry import EVENT_TYPES, SCHEMA_VERSIONS
from tests.processes import Follower

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"


def _consumer() -> Any:
    spec = importlib.util.spec_from_file_location("audit_consumer", ROOT / "tools" / "audit_consumer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["audit_consumer"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_follow_prints_what_is_appended_and_resumes(tmp_path: Path) -> None:
    lines = GOLDEN.read_bytes().splitlines(keepends=True)
    # the log is cut where an append ended (a line with a tab, not "+"), as a writer leaves it
    ends = [i + 1 for i, line in enumerate(lines) if line[8:9] == b"\t"]
    cut = next(e for e in ends if e >= 40)
    more = next(e for e in ends if e >= cut + 4)
    log = tmp_path / "live.log"
    log.write_bytes(b"".join(lines[:cut]))
    following = Follower(["events", str(log), "--follow", "-o", "json", "--from", str(cut - 2), "--limit", "6",
                          "--type", "kai.*"], timeout_s=30)
    with following as follower:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())  # it has read what was there ...
        assert first["position"] == cut - 2
        with log.open("ab") as f:  # ... and now more is appended, as a writer would
            f.write(b"".join(lines[cut:more]))
        out = follower.stdout.read()  # the rest, from the same buffer as the first line
        follower.wait(timeout=30)
    assert following.returncode == 0, following.stderr
    rows = [first] + [json.loads(line) for line in out.decode().splitlines()]
    assert [r["position"] for r in rows] == list(range(cut - 2, cut + 4))
    golden = [json.loads(line[9:]) for line in lines]
    assert [r["event"] for r in rows] == golden[cut - 2:cut + 4]
    resumed = subprocess.run([sys.executable, "-m", "kai_es", "events", str(log), "-o", "json", "--from",
                              str(more - 2)], cwd=ROOT, capture_output=True, text=True)
    assert [json.loads(line)["position"] for line in resumed.stdout.splitlines()] == [more - 2, more - 1]


def test_contract_page_names_every_event_type() -> None:
    page = (ROOT / "schemas" / "README.md").read_text()
    for name in EVENT_TYPES:
        stem = name.rsplit(".", 1)[0]
        assert f"`{name}`" in page or f"`{stem}." in page, name


def test_consumer_checks_every_event_of_the_golden_log() -> None:
    consumer = _consumer()
    validators = consumer.load_validators(ROOT / "schemas")
    assert {(t, SCHEMA_VERSIONS[t]) for t in EVENT_TYPES} <= set(validators)
    tally = consumer.Tally()
    for position, line in enumerate(GOLDEN.read_bytes().splitlines()):
        assert consumer.check(line[9:], position, validators, tally) is not None
    assert tally.invalid == []
    event = next(e for e in (json.loads(line[9:]) for line in GOLDEN.read_bytes().splitlines())
                 if e["type"] == "kai.cluster.pod.observed")
    seen_id = event["id"]
    assert consumer.check(json.dumps(event).encode(), 99, validators, tally) is None  # its id again
    event["id"] = "other"
    event["data"]["gpu"] = {"whole": 0.5}  # no floats: quantities are integers
    assert consumer.check(json.dumps(event).encode(), 100, validators, tally) is None
    assert tally.invalid[0] == f"position 99: event id {seen_id} seen before"
    version = event["schemaversion"]  # as written (a pod without a deletion time is v3)
    assert tally.invalid[1].startswith(f"position 100: kai.cluster.pod.observed v{version} at data/gpu/whole")
