"""A cycle's Session, Plan and entries are freed by reference counting when it returns: a replay
runs with the collector paused, so anything left in a reference cycle would stay for its whole
run (`Plan.close`)."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer

ROOT = Path(__file__).resolve().parents[1]
#: what a cycle makes and nothing outside it holds once it returned
CYCLE_TYPES = {"Plan", "Session", "Entry", "Eviction", "Eligibility", "NodeViews", "ArrayPackTable"}


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


@pytest.mark.parametrize("example", ["quickstart.yaml", "consolidation.yaml", "cluster-day.yaml",
                                     "topology.yaml"])
def test_a_cycle_leaves_nothing_only_a_collection_frees(example: str, collector_paused: None) -> None:
    out = one_cycle(load_scenario(ROOT / "examples" / example), load_packer("native"))
    assert out["decisions"]  # (a cycle ran: at least its CycleCompleted)
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    left = Counter(type(o).__name__ for o in gc.garbage)
    assert not CYCLE_TYPES & set(left), left.most_common(20)
