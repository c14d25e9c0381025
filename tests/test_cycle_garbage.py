"""A cycle leaves no reference cycles behind: its Session, Plan, entries, queue tree and fair-share
division are freed by reference counting when it returns (`Plan.close`, `Session.close`). A
replay runs with the collector paused, so anything left in a reference cycle would stay for its
whole run."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kai_es.oneshot import first_cut
from kai_es.scenario import load_scenario
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.yaml"))


@pytest.fixture
def collector_paused() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("example", EXAMPLES)
def test_a_cycle_leaves_nothing_only_a_collection_frees(example: str, collector_paused: None) -> None:
    scenario = load_scenario(ROOT / "examples" / example)
    state, started = first_cut(scenario)
    gc.collect()  # (what loading and folding left: not the cycle's)
    decisions = run_cycle(state, started, scenario.config, load_packer("native"))
    assert decisions  # (a cycle ran: at least its CycleCompleted)
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    left = Counter(type(o).__name__ for o in gc.garbage)
    assert not left, left.most_common(20)
