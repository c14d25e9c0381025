"""`kai-es replay --jobs N`: a replay spread over processes reaches exactly the verdict of one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.adapters.file_log import frame
from kai_es.events import DecodeError
from kai_es.replay import Share
from kai_es.replay_parallel import plan_shares, replay_file
from tests.replays import sequential, verdict

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"
ALTERED = ROOT / "tests" / "golden" / "quickstart.altered.events.jsonl"
JOBS = [2, 3, 5]


@pytest.fixture(scope="module")
def day_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log with a few hundred cycles: examples/cluster-day.yaml cut to its first hours."""
    out = tmp_path_factory.mktemp("day")
    run = subprocess.run([sys.executable, "-m", "kai_es", "simulate", "examples/cluster-day.yaml",
                          "--until", "3h", "--log", str(out / "day.log"), "--report", str(out / "r")],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return out / "day.log"


def _rewrite(src: Path, dst: Path, edit: object) -> Path:
    """Copy a log through `edit(list of event dicts) -> list of event dicts`, re-framed."""
    events = [json.loads(line[9:-1]) for line in src.read_bytes().splitlines(keepends=True)]
    events = edit(events)  # type: ignore[operator]
    dst.write_bytes(b"".join(frame(json.dumps(e, sort_keys=True, separators=(",", ":")).encode())
                             for e in events))
    return dst


@given(end=st.integers(0, 10**7), jobs=st.integers(1, 8), num=st.integers(1, 20), den=st.integers(1, 20))
def test_shares_cover_the_log_in_order_with_longer_stretches_first(end: int, jobs: int, num: int,
                                                                   den: int) -> None:
    shares = plan_shares(end, jobs, (num, den), min_records=1000)
    assert 1 <= len(shares) <= jobs and shares[0].start == 0 and shares[-1].stop is None
    for a, b in zip(shares, shares[1:]):
        assert a.stop == b.start and a.start < b.start
    stretches = [s.stop - s.start for s in shares[:-1] if s.stop is not None] + [end - shares[-1].start]
    assert stretches == sorted(stretches, reverse=True) or len(shares) == 1
    assert all(Share(s.start, s.stop).owns(s.start) for s in shares)


def test_a_short_log_is_not_split() -> None:
    assert len(plan_shares(50_000, 8)) == 2
    assert plan_shares(19_999, 8) == [Share()]


@pytest.mark.parametrize("jobs", JOBS)
def test_spread_replay_of_a_golden_log_equals_one_process(jobs: int) -> None:
    one = sequential(GOLDEN)
    assert one.ok and one.cycles == sum(1 for line in GOLDEN.read_text().splitlines() if "kai.scheduler.cycle.completed" in line) > 0
    assert verdict(replay_file(GOLDEN, jobs=jobs, min_records=1)) == verdict(one)


@pytest.mark.parametrize("jobs", JOBS)
def test_spread_replay_of_many_cycles_equals_one_process(day_log: Path, jobs: int) -> None:
    one = sequential(day_log)
    assert one.ok and one.cycles > 100
    many = replay_file(day_log, jobs=jobs, min_records=1)
    assert verdict(many) == verdict(one)


@pytest.mark.parametrize("jobs", [1, *JOBS])
def test_spread_replay_finds_the_same_divergence(jobs: int) -> None:
    one = sequential(ALTERED)
    assert one.divergence is not None and one.divergence.message == "decision differs"
    many = replay_file(ALTERED, jobs=jobs, min_records=1)
    assert many.divergence == one.divergence


@pytest.mark.parametrize("jobs", [1, *JOBS])
def test_a_decision_after_its_cycle_completed_is_caught_by_whoever_reads_it(
        tmp_path: Path, day_log: Path, jobs: int) -> None:
    def replay_an_early_decision_at_the_end(events: list[dict]) -> list[dict]:  # type: ignore[type-arg]
        early = next(e for e in events if e["type"] == "kai.scheduler.pod.bindingdecided")
        return [*events, early]

    log = _rewrite(day_log, tmp_path / "late.log", replay_an_early_decision_at_the_end)
    one = sequential(log)
    assert one.divergence is not None and "already completed" in one.divergence.message
    assert replay_file(log, jobs=jobs, min_records=1).divergence == one.divergence


@pytest.mark.parametrize("jobs", [1, *JOBS])
def test_a_cycle_cut_short_by_a_crash_is_abandoned_not_diverged(
        tmp_path: Path, day_log: Path, jobs: int) -> None:
    def drop_the_last_cycles_decisions(events: list[dict]) -> list[dict]:  # type: ignore[type-arg]
        last = max(i for i, e in enumerate(events) if e["type"] == "kai.scheduler.cycle.started")
        return [e for e in events if e.get("basedon") != last]

    log = _rewrite(day_log, tmp_path / "crash.log", drop_the_last_cycles_decisions)
    one = sequential(log)
    assert one.ok and one.abandoned == 1
    assert verdict(replay_file(log, jobs=jobs, min_records=1)) == verdict(one)


@pytest.mark.parametrize("jobs", [1, *JOBS])
def test_a_missing_decision_in_the_middle_diverges_the_same_way(
        tmp_path: Path, day_log: Path, jobs: int) -> None:
    def drop_one_decision_midway(events: list[dict]) -> list[dict]:  # type: ignore[type-arg]
        binds = [i for i, e in enumerate(events) if e["type"] == "kai.scheduler.pod.bindingdecided"]
        gone = binds[len(binds) // 2]
        return events[:gone] + events[gone + 1:]

    log = _rewrite(day_log, tmp_path / "gap.log", drop_one_decision_midway)
    one = sequential(log)
    assert one.divergence is not None
    assert replay_file(log, jobs=jobs, min_records=1).divergence == one.divergence


def test_cli_jobs_option_gives_the_same_line() -> None:
    lines = set()
    for jobs in ("1", "2"):
        run = subprocess.run([sys.executable, "-m", "kai_es", "replay", "--jobs", jobs, str(GOLDEN)],
                             cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        lines.add(run.stdout)
    cycles = sum(1 for line in GOLDEN.read_text().splitlines() if "kai.scheduler.cycle.completed" in line)
    assert len(lines) == 1 and next(iter(lines)).startswith(f"OK: {cycles} cycles")


def test_cli_rejects_zero_jobs() -> None:
    run = subprocess.run([sys.executable, "-m", "kai_es", "replay", "--jobs", "0", str(GOLDEN)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr


@pytest.mark.parametrize("jobs", [1, 3])
def test_a_record_that_is_no_event_stops_any_share_naming_its_position(tmp_path: Path, jobs: int) -> None:
    def break_record_5(events: list[dict]) -> list[dict]:  # type: ignore[type-arg]
        events[5]["data"]["oops"] = 1
        return events

    log = _rewrite(GOLDEN, tmp_path / "bad.log", break_record_5)
    with pytest.raises(DecodeError, match="record at position 5: .*unknown field `oops`"):
        replay_file(log, jobs=jobs, min_records=1)
    run = subprocess.run([sys.executable, "-m", "kai_es", "replay", str(log)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2 and "position 5" in run.stderr and "Traceback" not in run.stderr
