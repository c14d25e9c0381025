"""What the replay tests compare: one process's replay of a file log, and a verdict's fields."""

from __future__ import annotations

from pathlib import Path

from kai_es.adapters.file_log import FileEventLog
from kai_es.replay import ReplayResult, replay
from kai_es.scheduling.packing import load_packer


def sequential(path: Path) -> ReplayResult:
    """The replay of `path` in this process, records decoded one by one (no shares)."""
    return replay(FileEventLog(path, readonly=True).scan(), load_packer("native"))


def verdict(r: ReplayResult) -> tuple[object, ...]:
    """What a spread replay must agree on with one process."""
    return (r.ok, r.cycles, r.decisions, r.records, r.abandoned, r.state_digest, r.divergence)
