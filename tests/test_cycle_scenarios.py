"""Every tests/scenarios/*.yaml runs one cycle through `kai-es cycle --output json`; the
`# expect:` block at the top of the file states the outcome per pod (hand-written, partial)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_es.events import payloads as p
from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer

HERE = Path(__file__).parent / "scenarios"
FILES = sorted(HERE.glob("*.yaml"))


def expectations(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text().splitlines()
    start = lines.index("# expect:") + 1
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line[4:])
    out = yaml.safe_load("\n".join(block))
    assert isinstance(out, dict) and out, f"{path.name}: empty expect block"
    return out


def _reasons(outcome: dict[str, Any], pod: str) -> list[dict[str, Any]]:
    ns, name = pod.split("/")
    for d in outcome["decisions"]:
        if d["type"] == "kai.scheduler.pod.unschedulable" and d["subject"] == f"pod/{ns}/{name}":
            return list(d["data"]["reasons"])
    return []


def check(outcome: dict[str, Any], expect: dict[str, dict[str, Any]]) -> None:
    pods = outcome["pods"]
    for pod, want in expect.items():
        got = pods[pod]
        assert got["status"] == want["status"], (pod, got)
        if "node" in want:
            assert got["node"] == want["node"], (pod, got)
        if "reasons" in want:
            assert [r["code"] for r in _reasons(outcome, pod)] == want["reasons"], (pod, _reasons(outcome, pod))
        if "numbers" in want:
            reasons = _reasons(outcome, pod)
            # the NoNodeFits reason carries the per-cause node counts; else the last reason that
            # has every number named (a QueueLimit's before the actions' own), else the last
            named = [r for r in reasons if set(want["numbers"]) <= set(r["numbers"])]
            numbers = next((r for r in reasons if r["code"] == "NoNodeFits"),
                           named[-1] if named else reasons[-1])["numbers"]
            assert {k: numbers.get(k) for k in want["numbers"]} == want["numbers"], (pod, numbers)
        if "movesTo" in want:
            assert got.get("movesTo") == want["movesTo"], (pod, got)
        if "sameGpuGroupAs" in want:
            assert got["gpuGroups"] and got["gpuGroups"] == pods[want["sameGpuGroupAs"]]["gpuGroups"]
        if "differentGpuGroupFrom" in want:
            assert got["gpuGroups"] and got["gpuGroups"] != pods[want["differentGpuGroupFrom"]]["gpuGroups"]
        if want["status"] in ("Binding", "Pipelined", "Running") and "node" not in want:
            assert got["node"], (pod, got)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_scenario_outcome(path: Path, engine: str) -> None:
    outcome = one_cycle(load_scenario(path), load_packer(engine))  # type: ignore[arg-type]
    check(outcome, expectations(path))


def test_every_pending_pod_has_reasons_and_decisions_are_tied_to_the_cut() -> None:
    for path in FILES:
        scenario = load_scenario(path)
        outcome = one_cycle(scenario, load_packer("native"))
        decisions = outcome["decisions"]
        assert decisions[-1]["type"] == "kai.scheduler.cycle.completed"
        cut = decisions[-1]["basedon"]
        assert all(d["basedon"] == cut for d in decisions)
        others = {f"{o.payload.namespace}/{o.payload.name}" for o in scenario.objects
                  if isinstance(o.payload, p.PodObserved) and o.payload.scheduler_name != scenario.config.scheduler_name}
        for pod, got in outcome["pods"].items():
            if got["status"] == "Pending" and pod not in others:  # another scheduler's: no verdict of kai-es's
                assert _reasons(outcome, pod), f"{path.name}: {pod} pending without reasons"


def test_cli_prints_the_same_outcome_as_json() -> None:
    path = HERE / "fractional-sharing.yaml"
    run = subprocess.run([sys.executable, "-m", "kai_es", "cycle", str(path), "--output", "json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    printed = json.loads(run.stdout)
    assert printed == one_cycle(load_scenario(path), load_packer("native"))
    assert set(printed) == {"pods", "decisions"}


def test_scenarios_are_listed() -> None:
    assert len(FILES) >= 7
