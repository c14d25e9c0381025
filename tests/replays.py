"""What the replay tests compare: one process's replay of a file log, and a verdict's fields;
and the log with checkpoints they replay."""

from __future__ import annotations

import subprocess
import sys
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


def day_log_with_checkpoints(out: Path) -> Path:
    """examples/cluster-day.yaml's first hours with a state digest on every cycle, simulated by
    the whole pipeline into `out`/day.log with `--snapshot-every 10`: the scheduler keeps its
    checkpoints (8) beside it."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "examples" / "cluster-day.yaml").read_text()
    assert "stateDigestEvery: 50" in text
    (out / "day.yaml").write_text(text.replace("stateDigestEvery: 50", "stateDigestEvery: 1"))
    run = subprocess.run([sys.executable, "-m", "kai_es", "simulate", str(out / "day.yaml"), "--until", "3h",
                          "--log", str(out / "day.log"), "--report", str(out / "r"), "--snapshot-every", "10"],
                         cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return out / "day.log"
