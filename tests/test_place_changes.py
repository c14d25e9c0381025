"""A job's place over one wait (`kai_es.visibility.place_changes`): `kai-es explain LOG NS/NAME`
lists, under each wait, every change of the job's place in its queue and in the order a cycle
tried the jobs in, with the cycle it took effect in — once per change, not per cycle — in its
text, its JSON (`positionChanges`, beside the older `positionAtFirst`/`positionAtLast`) and
`kai-es serve`'s job page; a wait keeps at most 2 * KEPT changes.

The scenario (tests/data/explain/moving-up.yaml) is a user's: queues, PodGroups and pods; the
numbers expected are derived from it by hand, and checked against the place read from the fold
at every cycle of the wait (`positions.position` at the cut, the tried order at its end)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.timefmt import MAX_TIME_NS
from kai_es.explain import _Cut, _Run, event_positions, explain, render_text, resolve
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.visibility import pages, place_changes
from kai_es.visibility.live import LiveView
from kai_es.visibility.positions import position

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "explain"
S = 10**9


def _simulated(name: str, directory: Path) -> Path:
    path = directory / f"{name}.events.jsonl"
    scenario = load_scenario(DATA / f"{name}.yaml")
    anyio.run(lambda: simulate(scenario, FileEventLog(path), load_packer("native")))
    return path


@pytest.fixture(scope="module")
def moving_up(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _simulated("moving-up", tmp_path_factory.mktemp("places"))


def _records(path: Path) -> list[Record]:
    return list(FileEventLog(path, readonly=True).scan())


def _waits(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in report["timeline"] if e["kind"] == "wait"]


def _places_by_fold(records: list[Record], job: str, first: int, last: int) -> list[tuple[int, dict[str, int]]]:
    """The job's place at every cycle `first`..`last`, read from the fold: its queue's order at
    the cut, the order the cycle recorded it tried (its CycleCompleted) for the cluster."""
    state = ClusterState()
    at_cut: dict[int, tuple[int, int] | None] = {}
    cycle_of: dict[int, int] = {}
    out = []
    for record in records:
        apply(state, record)
        data = record.envelope.data
        if isinstance(data, p.CycleStarted) and first <= data.cycle <= last:
            at_cut[data.cycle] = position(state, job)
            cycle_of[record.position] = data.cycle
        elif isinstance(data, p.CycleCompleted) and record.envelope.basedon in cycle_of:
            cycle = cycle_of[record.envelope.basedon]
            queue = at_cut[cycle]
            assert queue is not None and job in state.tried_order
            out.append((cycle, {"inQueue": queue[0], "of": queue[1],
                                "inCluster": state.tried_order.index(job) + 1, "clusterOf": len(state.tried_order)}))
    assert [c for c, _ in out] == list(range(first, last + 1))
    return out


def _changes_of(places: list[tuple[int, dict[str, int]]]) -> list[tuple[int, dict[str, int]]]:
    """The cycles whose place differs from the cycle before's (counts aside), the first's first."""
    out = places[:1]
    for (_, before), (cycle, now) in zip(places, places[1:]):
        if (before["inQueue"], before["inCluster"]) != (now["inQueue"], now["inCluster"]):
            out.append((cycle, now))
    return out


def _cuts(records: list[Record]) -> dict[int, Record]:
    return {r.envelope.data.cycle: r for r in records if isinstance(r.envelope.data, p.CycleStarted)}


def _place_lines(report: dict[str, Any]) -> list[str]:
    """The text lines under the first wait that tell its changes of place."""
    lines = [line.strip() for line in render_text(report)]
    at = next(n for n, line in enumerate(lines) if line.startswith("its place changed"))
    out = [lines[at]]
    for line in lines[at + 1:]:
        if not line.startswith(("cycle ", "...")):
            break
        out.append(line)
    return out


def test_a_job_moving_up_its_queue_has_each_change_of_place_listed_in_order(moving_up: Path) -> None:
    records = _records(moving_up)
    report = explain(records, "default/train")
    [wait] = _waits(report)
    # one verdict throughout (no node fits): one wait, cycles 1-6, cuts at 0s, 30s, 2m, 2m30s, 4m, 4m30s
    assert (wait["firstCycle"], wait["lastCycle"], wait["cycles"]) == (1, 6, 6)
    changes = wait["positionChanges"]
    # by hand from the scenario: #4 of 4 in team-a (prep-1..3 are older), `sweep` tried before it;
    # then one place up at the cut after each prep job is placed (prep-2 at 2m, prep-3 at 4m)
    assert [(c["cycle"], c["place"]) for c in changes] == [
        (1, {"inQueue": 4, "of": 4, "inCluster": 5, "clusterOf": 5}),
        (2, {"inQueue": 3, "of": 3, "inCluster": 4, "clusterOf": 4}),
        (4, {"inQueue": 2, "of": 2, "inCluster": 3, "clusterOf": 3}),
        (6, {"inQueue": 1, "of": 1, "inCluster": 2, "clusterOf": 2})]
    assert wait["positionChangesElided"] == 0
    start, cuts = records[0].envelope.logicaltime, _cuts(records)
    assert [(c["logicaltime"] - start) // S for c in changes] == [0, 30, 150, 270]
    for c in changes:  # each change at its cycle's cut
        cut = cuts[c["cycle"]]
        assert (c["position"], c["logicaltime"], c["queue"]) == (cut.position, cut.envelope.logicaltime, "team-a")
    # the same as the place read from the fold at each of the six cycles, where it changed
    assert [(c["cycle"], c["place"]) for c in changes] == _changes_of(_places_by_fold(records, "default/train", 1, 6))
    # the older fields keep their meaning: the first and last cut's place
    assert (wait["positionAtFirst"], wait["positionAtLast"]) == (changes[0]["place"], changes[-1]["place"])
    assert _place_lines(report) == [
        "its place changed 3 time(s) in these cycles:",
        "cycle 1 (t+0s): #4 of 4 in queue team-a, #5 of 5 in the cluster",
        "cycle 2 (t+30s): #3 of 3 in queue team-a, #4 of 4 in the cluster",
        "cycle 4 (t+2m30s): #2 of 2 in queue team-a, #3 of 3 in the cluster",
        "cycle 6 (t+4m30s): #1 of 1 in queue team-a, #2 of 2 in the cluster"]


def test_the_command_prints_the_changes_and_gives_them_as_json(moving_up: Path) -> None:
    def cli(*args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "kai_es", "explain", str(moving_up), *args], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout

    text = cli("default/train")
    assert "cycle 4 (t+2m30s): #2 of 2 in queue team-a, #3 of 3 in the cluster" in text
    assert json.loads(cli("default/train", "-o", "json")) == explain(_records(moving_up), "default/train")


def test_a_place_that_changes_only_in_the_cluster_order_is_listed_too(moving_up: Path) -> None:
    """`sweep` stays #1 of 1 in team-b; in the cycles that place a prep job, that job is tried
    before it (#2), in the others it is tried first (#1)."""
    records = _records(moving_up)
    [wait, *_] = _waits(explain(records, "default/sweep"))
    changes = [(c["cycle"], c["place"]) for c in wait["positionChanges"]]
    assert changes == _changes_of(_places_by_fold(records, "default/sweep", wait["firstCycle"], wait["lastCycle"]))
    assert [place["inCluster"] for _, place in changes] == [2, 1, 2, 1, 2, 1, 2, 1]
    assert all((place["inQueue"], place["of"]) == (1, 1) for _, place in changes)


def test_a_job_whose_place_never_changes_gets_one_entry(tmp_path: Path) -> None:
    """held-by-limit.yaml: `second` waits 16 cycles, first in its queue and in every tried order,
    while CPU-only pods come and go behind it (the counts change, its place does not)."""
    records = _records(_simulated("held-by-limit", tmp_path))
    report = explain(records, "default/second")
    [wait] = _waits(report)
    assert wait["cycles"] == 16
    places = _places_by_fold(records, _job_of(records, "default/second"), wait["firstCycle"], wait["lastCycle"])
    assert {place["of"] for _, place in places} == {1, 2}  # a tick job waited behind it at some cuts
    [change] = wait["positionChanges"]
    assert (change["cycle"], change["place"]) == (wait["firstCycle"], places[0][1]) == (
        3, {"inQueue": 1, "of": 1, "inCluster": 1, "clusterOf": 1})
    assert wait["positionChangesElided"] == 0
    assert not any("its place changed" in line for line in render_text(report))


def test_a_wait_keeps_the_first_and_last_changes_and_counts_the_rest(
        moving_up: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(place_changes, "KEPT", 2)
    records = _records(moving_up)
    report = explain(records, "default/sweep")
    [wait, *_] = _waits(report)
    # its place changed at each of its 8 cycles (above): the first 2 and the last 2 are kept
    assert [c["cycle"] for c in wait["positionChanges"]] == [1, 2, 7, 8]
    assert wait["positionChangesElided"] == 4
    assert [c["place"]["inCluster"] for c in wait["positionChanges"]] == [2, 1, 2, 1]
    assert wait["positionAtLast"] == wait["positionChanges"][-1]["place"]
    assert _place_lines(report) == [
        "its place changed 7 time(s) in these cycles:",
        "cycle 1 (t+0s): #1 of 1 in queue team-b, #2 of 5 in the cluster",
        "cycle 2 (t+30s): #1 of 1 in queue team-b, #1 of 4 in the cluster",
        "... 4 more change(s) ...",
        "cycle 7 (t+6m): #1 of 1 in queue team-b, #2 of 2 in the cluster",
        "cycle 8 (t+6m30s): #1 of 1 in queue team-b, #1 of 1 in the cluster"]


def _job_of(records: list[Record], pod: str) -> str:
    """The job key (NS/PODGROUP) of pod `pod` (a bare pod's PodGroup is made for it)."""
    state = ClusterState()
    for record in records:
        apply(state, record)
        if pod in state.pods:
            return state.pods[pod].job_key
    raise AssertionError(pod)


def _cut(cycle: int, rank: int) -> _Cut:
    return _Cut(cycle, 10 * cycle, cycle * S, {}, None, place=(rank, 50), job="default/j", cluster=(rank + 7, 90),
                queue_name="team-a")


def test_a_long_wait_costs_one_entry_standing_still_and_at_most_2_kept_moving() -> None:
    """3,000 cycles: at one place, one entry and nothing kept beyond the run's cuts; moving every
    cycle, the first KEPT and the last KEPT changes (`kai-es serve` keeps a timeline per job)."""
    still = _Run((), [], _cut(1, 40), _cut(1, 40))
    for cycle in range(2, 3001):
        still.extend(_cut(cycle, 40))
    assert still.moves is None and still.cycles == 3000
    assert [c["cycle"] for c in still.as_json()["positionChanges"]] == [1]

    moving = _Run((), [], _cut(1, 1), _cut(1, 1))
    for cycle in range(2, 3001):
        moving.extend(_cut(cycle, 1 + (cycle - 1) % 2))  # #1, #2, #1, ...
    kept = place_changes.KEPT
    entry = moving.as_json()
    assert [c["cycle"] for c in entry["positionChanges"]] == [*range(1, kept + 1), *range(3001 - kept, 3001)]
    assert entry["positionChangesElided"] == 3000 - 2 * kept
    assert entry["positionChanges"][-1]["place"] == {"inQueue": 2, "of": 50, "inCluster": 9, "clusterOf": 90}


def test_a_change_is_a_new_rank_or_queue_and_is_kept_exactly() -> None:
    change = place_changes.Change
    first = change(1, 40, S, "team-a", (3, 9), (4, 20))
    assert not place_changes.moved(first, change(2, 41, 2 * S, "team-a", (3, 12), (4, 25)))  # counts alone
    assert place_changes.moved(first, change(2, 41, 2 * S, "team-a", (3, 9), (5, 20)))  # the cluster rank
    assert place_changes.moved(first, change(2, 41, 2 * S, "team-b", (3, 9), (4, 20)))  # another queue
    assert place_changes.moved(first, change(2, 41, 2 * S, "team-a", None, (4, 20)))  # out of its queue's order
    # no queue place: a tried-order place alone is none (explain shows none then)
    assert not place_changes.moved(change(1, 40, S, "team-a", None, (4, 20)), change(2, 41, 2 * S, "team-a", None, None))
    kept = place_changes.PlaceChanges(first)
    # a log may hold times up to the year 9999 (past 2**63 ns) and any cycle number: kept exactly
    last = change(2**64 - 1, 41, MAX_TIME_NS, "team-a", (2, 9), None)
    kept.add(change(2, 41, 2 * S, "team-a", (1, 9), (1, 20)))
    kept.add(last)
    assert list(kept) == [first, change(2, 41, 2 * S, "team-a", (1, 9), (1, 20)), last]
    assert place_changes.change_json(last)["time"] == "9999-12-31T23:59:59.999999999Z"


def test_serves_job_page_shows_the_changes_as_explain_does(moving_up: Path) -> None:
    """The view's kept timeline (`visibility.timelines`) is explain's at every cut, changes
    included, and the job page prints its lines."""
    records = _records(moving_up)
    view = LiveView()
    fed = 0
    opened = next(r.position for r in records if isinstance(r.envelope.data, p.CycleStarted)) + 2
    for cut in (opened, 2 * len(records) // 3, len(records)):  # (the first while cycle 1 is open)
        for record in records[fed:cut]:
            view.feed(record)
        fed = cut
        for job in ("default/train", "default/sweep"):
            kept = view.timeline(job)
            assert kept is not None
            assert resolve(kept, {at: records[at] for at in event_positions(kept)}) == explain(records[:cut], job)
    kept = view.timeline("default/train")
    assert kept is not None
    page = pages.job_page(resolve(kept, {at: records[at] for at in event_positions(kept)}))
    assert page == pages.job_page(explain(records, "default/train"))
    assert "cycle 2 (t+30s): #3 of 3 in queue team-a, #4 of 4 in the cluster</li>" in page
