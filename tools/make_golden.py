"""Regenerate the golden logs in tests/golden/ (run after an intended change of decisions):

    python tools/make_golden.py

- quickstart.events.jsonl: `kai-es simulate examples/quickstart.yaml` with the native packer
  (under the current policy version). Before regenerating it after a new policy version, move
  the old one into tests/golden/history/ (named by its policy and schema versions): logs written
  by older versions are never regenerated and must keep replaying byte for byte.
- consolidation.events.jsonl: `kai-es simulate examples/consolidation.yaml` (the current policy's
  moves, evictions and pipelined placements; kept like quickstart's, per policy version).
- quickstart.altered.events.jsonl: the same log with one decision changed on purpose (the second
  pod's node), re-framed with a valid CRC, so that only replay — not the file format — can
  notice. `kai-es replay` must reject it.
- quickstart.nondeterministic.events.jsonl: a must-fail history. The quickstart simulated with
  `CoinFlipPacker` (a packer that picks a random fitting node, seeded here so the file is
  reproducible), for the first seed whose log differs from the golden one. Its first differing
  decision is where `kai-es replay` must report the divergence.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from array import array
from pathlib import Path

import anyio

from kai_es.adapters.file_log import FileEventLog, frame
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import Placement, Strategy, TaskShape, load_packer
from kai_es.scheduling.packing.model import PackTable
from kai_es.app.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


class CoinFlipPacker:
    """A deliberately non-deterministic packer: a fitting node picked by `random.Random(seed)`."""

    kind = "coin-flip"

    def __init__(self, seed: int) -> None:
        self.inner = load_packer("reference")
        self.rng = random.Random(seed)

    def place(self, table: PackTable, task: TaskShape, strategy: Strategy,
              eligible: array[int] | None = None) -> Placement:
        best = self.inner.place(table, task, strategy, eligible)
        if not best.placed:
            return best
        options = []
        for node in range(len(table.free_pods)):
            if eligible is not None and not eligible[node]:
                continue
            mask = array("q", [1 if i == node else 0 for i in range(len(table.free_pods))])
            answer = self.inner.place(table, task, strategy, mask)
            if answer.placed:
                options.append(answer)
        return self.rng.choice(options)

    place_raw = place

    def rank_raw(self, table: PackTable, task: TaskShape, strategy: Strategy, eligible: array[int] | None,
                 cap: int) -> tuple[Placement, tuple[int, ...]]:
        """A coin flip and no ranked node after it: a run of alike pods asks again when its node fills."""
        return self.place(table, task, strategy, eligible), ()


def write_nondeterministic(golden: Path, target: Path) -> int:
    """Simulate the quickstart with coin-flip packers seeded 1, 2, ... into `target` until the
    log differs from `golden`; returns the seed."""
    scenario = load_scenario(ROOT / "examples" / "quickstart.yaml")
    for seed in range(1, 100):
        target.unlink(missing_ok=True)
        log = FileEventLog(target)
        anyio.run(lambda: simulate(scenario, log, CoinFlipPacker(seed)))  # type: ignore[arg-type]
        if target.read_bytes() != golden.read_bytes():
            return seed
    raise SystemExit("no seed in 1..99 made the coin-flip packer disagree with binpack")


def main() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    log = GOLDEN / "quickstart.events.jsonl"
    subprocess.run([sys.executable, "-m", "kai_es", "simulate", "examples/quickstart.yaml", "--log", str(log),
                    "--report", str(ROOT / "out" / "golden-report"), "--packer", "native", "--force"],
                   cwd=ROOT, check=True, capture_output=True)
    lines = log.read_bytes().splitlines(keepends=True)
    out = []
    changed = False
    binds = 0
    for line in lines:
        body = line[9:-1]
        event = json.loads(body)
        if event["type"] == "kai.scheduler.pod.bindingdecided" and not changed:
            binds += 1
            if binds == 3:
                event["data"]["node"] = "node-b" if event["data"]["node"] == "node-a" else "node-a"
                body = json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
                changed = True
        out.append(frame(body, more=line[8:9] == b"+"))  # the same batches, each line re-framed
    assert changed
    (GOLDEN / "quickstart.altered.events.jsonl").write_bytes(b"".join(out))
    seed = write_nondeterministic(log, GOLDEN / "quickstart.nondeterministic.events.jsonl")
    print(f"wrote {log.relative_to(ROOT)} ({len(lines)} records), the altered copy and the "
          f"non-deterministic history (coin-flip seed {seed})")
    moves = GOLDEN / "consolidation.events.jsonl"
    subprocess.run([sys.executable, "-m", "kai_es", "simulate", "examples/consolidation.yaml", "--log", str(moves),
                    "--report", str(ROOT / "out" / "golden-report"), "--packer", "native", "--force"],
                   cwd=ROOT, check=True, capture_output=True)
    print(f"wrote {moves.relative_to(ROOT)} ({len(moves.read_bytes().splitlines())} records)")


if __name__ == "__main__":
    main()
