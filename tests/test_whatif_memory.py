"""A what-if simulation runs with the cyclic collector paused (`bulk_fold`), and each cycle's
plan, session and pack tables hold reference cycles: unless collected, every cycle's stayed in
memory (on the 1,000,000-event benchmark, 500 cycles of them: 1.07 GiB instead of 0.72). `_play`
collects what the previous cycle left at each cycle's start; its results are those of a run
that collects nothing."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from kai_es import cli_whatif
from kai_es.scheduling.plan import Plan
from kai_es.whatif.recording_log import RecordingFileLog

GOLDEN = Path(__file__).parent / "golden"


def plans_alive() -> int:
    gc.unfreeze()  # frozen objects are not listed
    return sum(1 for o in gc.get_objects() if type(o) is Plan)


def play(log: str) -> tuple[Any, Any]:
    workload = cli_whatif._workload(log)
    return cli_whatif._play(workload, RecordingFileLog(None), cli_whatif.choose_packer(None), "seed", None)


def test_a_simulation_does_not_keep_every_cycles_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    log = str(GOLDEN / "consolidation.events.jsonl")
    gc.collect()
    before = plans_alive()
    kept = play(log)
    assert plans_alive() - before <= 1  # at most the last cycle's
    monkeypatch.setattr(cli_whatif, "_collect_young", lambda: None)
    gc.collect()
    before = plans_alive()
    uncollected = play(log)
    assert plans_alive() - before > 5  # one per cycle: what the collection saves
    assert kept == uncollected
    gc.collect()
