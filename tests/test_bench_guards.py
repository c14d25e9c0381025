"""The cycle's regression guard (`tools/bench/count_cycles.py --max-instructions`): it counts the
steady benchmark's cycles in instructions under valgrind, which a loaded machine does not move,
so a limit on it fails loudly on a regression and never on a busy day. Run here at a tiny shape
(seconds, not the issue's minutes): a limit below the count exits 1 naming it, one above exits 0,
and two runs count the same to within 0.1% (the exact totals compared, not the rounded figures). valgrind is installed by `.ci/run`; without it these
fail (the guard could not run), they do not skip."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ("--nodes", "40", "--running", "200", "--pending", "20", "--cycles", "4")

pytestmark = pytest.mark.slow


def _count(*extra: str) -> tuple[int, str, float, int]:
    """Exit code, output, the printed count a cycle (M, one decimal) and the exact total."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "count_cycles.py"), *TINY, *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    found = re.search(r"per counted cycle \(\d+\): ([\d,.]+) M instructions", run.stdout)
    exact = re.search(r"instructions counted: ([\d,]+) in \d+ cycles", run.stdout)
    assert found is not None and exact is not None, run.stdout[-2000:] + run.stderr[-2000:]
    return (run.returncode, run.stdout + run.stderr, float(found.group(1).replace(",", "")),
            int(exact.group(1).replace(",", "")))


def test_a_cycle_over_its_instruction_limit_fails_loudly_and_one_under_it_passes() -> None:
    code, _, count, total = _count()
    assert code == 0 and count > 0
    code, out, _, again = _count("--max-instructions", f"{count * 0.9:.1f}")
    assert code == 1 and "REGRESSION" in out and f"--max-instructions {count * 0.9:,.1f} M" in out
    # the count does not drift between runs: compared exactly, since the one-decimal figures of
    # two counts a hair apart can round 0.1 M apart (15.55 M printed 15.5 once and 15.6 once)
    assert abs(again - total) <= total * 0.001
    code, out, _, _ = _count("--max-instructions", f"{count * 1.1:.1f}")
    assert code == 0 and "REGRESSION" not in out


def test_the_allocate_benchmark_is_counted_too() -> None:
    """`--bench cycle` counts `bench_cycle.py`'s one allocate cycle (its own options), and an
    unknown benchmark is refused by name."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "count_cycles.py"), "--bench", "cycle",
                          "--nodes", "20", "--pods", "40"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "40 placements" in run.stdout and "per counted cycle (1): " in run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "count_cycles.py"), "--bench", "nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--bench is one of cycle, fold, steady" in bad.stderr


def test_the_upkeep_is_counted_apart_from_the_cycles() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "count_cycles.py"), *TINY,
                          "--count", "upkeep"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    found = re.search(r"per counted upkeep \((\d+)\): ([\d,.]+) M instructions", run.stdout)
    assert run.returncode == 0 and found is not None, run.stdout[-2000:] + run.stderr[-2000:]
    # --cycles 4 runs five cycles and an upkeep before each after the first: the first two skipped
    assert int(found.group(1)) == 2 and float(found.group(2)) > 0
    assert "per counted cycle" not in run.stdout
    wrong = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "count_cycles.py"), "--count", "fold"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "--count is cycle, or upkeep" in wrong.stderr


def _count_fold(*extra: str) -> tuple[int, str, float]:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "count_cycles.py"), "--bench", "fold",
                          "--events", "3000", *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)
    found = re.search(r"per counted fold \(1\): ([\d,.]+) M instructions", run.stdout)
    assert found is not None, run.stdout[-2000:] + run.stderr[-2000:]
    return run.returncode, run.stdout + run.stderr, float(found.group(1).replace(",", ""))


def test_the_fold_over_its_instruction_limit_fails_loudly_and_one_under_it_passes() -> None:
    code, out, count = _count_fold()
    per_event = re.search(r"per event folded \(([\d,]+)\): ([\d,]+) instructions", out)
    assert code == 0 and count > 0 and per_event is not None
    assert int(per_event.group(1).replace(",", "")) >= 3000  # the whole generated log, folded once
    code, out, again = _count_fold("--max-instructions", f"{count * 0.9:.1f}")
    assert code == 1 and "REGRESSION" in out
    assert abs(again - count) <= count * 0.001
    code, out, _ = _count_fold("--max-instructions", f"{count * 1.1:.1f}")
    assert code == 0 and "REGRESSION" not in out
