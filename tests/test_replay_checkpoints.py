"""Checkpoints: the scheduler keeps past snapshots beside a file log, and `kai-es replay --jobs N`
starts its later shares from them, reaching exactly the verdict of one process folding from 0."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.adapters.file_checkpoints import (
    Checkpoint,
    checkpoint_dir,
    clear_checkpoints,
    list_checkpoints,
    save_checkpoint,
    thinned,
)
from kai_es.adapters.file_log import FileEventLog, frame
from kai_es.adapters.snapshot_codec import encode_stored
from kai_es.app import open_log
from kai_es.events import Envelope, Record, decode, encode
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.ports import StoredSnapshot
from kai_es.replay import Share
from kai_es.replay_parallel import even_cuts, plan_checkpointed, replay_file
from kai_es.scheduling.config import SchedulerConfig, config_digest, config_event
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.policy import state_digest
from kai_es.services.snapshotting import cut_snapshot
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.state.snapshot import snapshot_bytes as cut_bytes
from tests.replays import day_log_with_checkpoints, sequential, verdict

ROOT = Path(__file__).resolve().parents[1]
SEC = 1_000_000_000


@pytest.fixture(scope="module")
def day_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return day_log_with_checkpoints(tmp_path_factory.mktemp("day"))


def _events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line[9:]) for line in path.read_bytes().splitlines()]


def _copy(src: Path, dst: Path, events: list[dict] | None = None) -> Path:  # type: ignore[type-arg]
    """`src` (or `events` in its place, re-framed) at `dst`, with its checkpoints."""
    if events is None:
        shutil.copyfile(src, dst)
    else:
        dst.write_bytes(b"".join(frame(json.dumps(e, sort_keys=True, separators=(",", ":")).encode())
                                 for e in events))
    shutil.copytree(checkpoint_dir(src), checkpoint_dir(dst))
    return dst


# -- the store ----------------------------------------------------------------------------------


@given(positions=st.lists(st.integers(1, 2**62), min_size=0, max_size=60, unique=True), keep=st.integers(0, 20))
def test_thinning_keeps_at_most_keep_and_always_the_newest(positions: list[int], keep: int) -> None:
    positions.sort()
    gone = thinned(positions, keep)
    left = [x for x in positions if x not in gone]
    assert len(left) == min(len(positions), max(1, keep)) and set(gone) <= set(positions)
    if positions:
        assert left[-1] == positions[-1]
    assert thinned(positions, keep) == gone  # (deterministic)


@given(n=st.integers(2, 200), keep=st.integers(2, 16), step=st.integers(1, 10**9))
def test_thinning_evenly_written_checkpoints_leaves_them_spread(n: int, keep: int, step: int) -> None:
    positions = [k * step for k in range(1, n + 1)]
    left = [x for x in positions if x not in set(thinned(positions, keep))]
    gaps = [b - a for a, b in zip([0, *left], left)]
    ideal = n * step // min(n, keep)
    assert max(gaps) <= 2 * ideal


@given(end=st.integers(2, 2**64), data=st.data(), jobs=st.integers(1, 6))
def test_cuts_make_the_longest_stretch_the_shortest_any_choice_of_checkpoints_can(
        end: int, data: st.DataObject, jobs: int) -> None:
    positions: list[int] = sorted(data.draw(st.sets(st.integers(1, end - 1), max_size=9)))
    cuts = even_cuts(positions, end, jobs)
    assert cuts == sorted(set(cuts)) and set(cuts) <= set(positions) and len(cuts) <= jobs - 1

    def longest(chosen: tuple[int, ...] | list[int]) -> int:
        bounds: list[int] = [0, *chosen, end]
        return max(b - a for a, b in zip(bounds, bounds[1:]))

    best = min(longest(c) for k in range(min(jobs - 1, len(positions)) + 1)
               for c in itertools.combinations(positions, k))
    assert longest(cuts) == best


def test_the_scheduler_keeps_checkpoints_that_agree_with_the_log(day_log: Path) -> None:
    cps = list_checkpoints(day_log)
    assert len(cps) == 8 and [c.position for c in cps] == sorted({c.position for c in cps})
    records = {r.position: r.envelope for r in FileEventLog(day_log, readonly=True).scan()}
    for cp in cps:
        started, completed = records[cp.position], records[cp.completed_position]
        assert isinstance(started.data, p.CycleStarted) and started.data.cycle == cp.cycle
        assert isinstance(completed.data, p.CycleCompleted) and completed.basedon == cp.position
        assert completed.statedigest == cp.digest and cp.load().digest == cp.digest
    newest = json.loads(Path(f"{day_log}.snapshot").read_bytes().split(b"\n", 1)[0])
    assert newest["position"] == cps[-1].position  # the newest snapshot is also the newest checkpoint
    assert cps[-1].path.samefile(f"{day_log}.snapshot")  # (linked, not written twice)
    assert not any(cp.path.samefile(f"{day_log}.snapshot") for cp in cps[:-1])


def test_unreadable_or_misnamed_files_are_skipped_and_others_never_touched(tmp_path: Path, day_log: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    log = _copy(day_log, tmp_path / "day.log")
    folder = checkpoint_dir(log)
    first, second = sorted(folder.glob("*.checkpoint"))[:2]
    shutil.copyfile(second, first)  # its header names another position than its file
    (folder / "notes.txt").write_text("mine")
    (folder / "000000000001.checkpoint").write_bytes(b"not a header\n")
    with caplog.at_level(logging.WARNING):
        cps = list_checkpoints(log)
    assert len(cps) == 7 and first.name in caplog.text and "000000000001.checkpoint" in caplog.text
    blob = encode_stored(cps[-1].load())
    save_checkpoint(log, cps[-1].position + 1, blob, keep=3)
    assert (folder / "notes.txt").read_text() == "mine"
    assert len(list(folder.glob("*.checkpoint"))) == 3
    assert clear_checkpoints(log) == 3 and (folder / "notes.txt").exists()


def test_positions_past_twelve_digits_are_kept_read_and_thinned_in_order(tmp_path: Path, day_log: Path) -> None:
    """A position of 10**12 or more (a long-lived Kafka offset) has a longer name: it is still
    listed, in numeric order, and thinned as any other."""
    log = tmp_path / "big.log"
    stored = list_checkpoints(day_log)[0].load()
    big = [999_999_999_999, 10**12, 2**62, 2**63 - 1]
    for position in big:
        blob = encode_stored(StoredSnapshot(position, position + 1, stored.cycle, stored.logicaltime, stored.digest,
                                            stored.data))
        save_checkpoint(log, position, blob, keep=3)
    assert [cp.position for cp in list_checkpoints(log)] == [p for p in big if p not in thinned(big, 3)]
    assert list_checkpoints(log)[-1].position == 2**63 - 1


def test_a_log_started_afresh_loses_its_former_checkpoints(tmp_path: Path, day_log: Path) -> None:
    log = _copy(day_log, tmp_path / "day.log")
    open_log(str(log), fresh=True)
    assert list_checkpoints(log) == [] and not checkpoint_dir(log).exists() and log.read_bytes() == b""


# -- replay from checkpoints --------------------------------------------------------------------


def _plan(path: Path, jobs: int, **kw: object) -> list[tuple[Share, Checkpoint | None]]:
    log = FileEventLog(path, readonly=True)
    return plan_checkpointed(log, log.record_count(), jobs, list_checkpoints(path), min_records=1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("jobs", [2, 3, 4, 5])
def test_replay_from_checkpoints_equals_one_process(day_log: Path, jobs: int) -> None:
    one = sequential(day_log)
    assert one.ok and one.cycles > 100
    from_checkpoints = sum(cp is not None for _, cp in _plan(day_log, jobs))
    assert from_checkpoints >= 1
    many = replay_file(day_log, jobs=jobs, min_records=1)
    assert verdict(many) == verdict(one) and many.resumed == from_checkpoints
    assert replay_file(day_log, jobs=jobs, min_records=1, checkpoints=False).resumed == 0


def test_checkpoints_cut_the_log_where_the_longest_share_is_shortest(day_log: Path) -> None:
    log = FileEventLog(day_log, readonly=True)
    end = log.record_count()
    positions = [cp.position for cp in list_checkpoints(day_log)]
    for jobs in range(2, 9):
        plan = _plan(day_log, jobs)
        shares = [s for s, _ in plan]
        assert shares[0].start == 0 and shares[-1].stop is None and plan[0][1] is None
        for (a, _), (b, cp) in zip(plan, plan[1:]):
            assert cp is not None and a.stop == b.start == cp.position and a.stop_digest == cp.digest
        cuts = [s.start for s in shares[1:]]
        longest = max(b - a for a, b in zip([0, *cuts], [*cuts, end]))
        for k in range(1, min(jobs, len(positions) + 1)):  # no choice of cuts does better
            for other in itertools.combinations(positions, k):
                assert max(b - a for a, b in zip([0, *other], [*other, end])) >= longest
    # a lone checkpoint near the end leaves a longer share than folding from 0 does: not used
    last = list_checkpoints(day_log)[-1:]
    assert last[0].position > end * 3 // 4
    assert all(cp is None for _, cp in plan_checkpointed(log, end, 2, last, min_records=1))
    assert any(cp is not None for _, cp in plan_checkpointed(log, end, 2, last, min_records=1, ratio=(0, 1)))
    far = [Checkpoint(1, 2, 1, "x", day_log)]  # one checkpoint, whose cycle records no such digest
    assert all(cp is None for _, cp in plan_checkpointed(log, end, 3, far, min_records=1))


def test_a_checkpoint_that_does_not_restore_to_its_digest_is_not_used(
        tmp_path: Path, day_log: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = _copy(day_log, tmp_path / "day.log")
    cp = _plan(log, 2)[1][1]
    assert cp is not None
    stored = cp.load()
    state = json.loads(stored.data)
    state["records"] += 1  # a state the log never folds to, under the log's own digest
    data = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    cp.path.write_bytes(encode_stored(StoredSnapshot(stored.position, stored.completed_position, stored.cycle,
                                                     stored.logicaltime, stored.digest, data)))
    with caplog.at_level(logging.WARNING):
        many = replay_file(log, jobs=2, min_records=1)
    assert many.resumed == 0 and f"position {cp.position}" in caplog.text and "rejected" in caplog.text
    assert verdict(many) == verdict(sequential(log))


def test_a_log_that_does_not_fold_to_a_checkpoint_diverges_as_in_one_process(tmp_path: Path, day_log: Path) -> None:
    """A record just before a checkpoint's cut edited (a label on a pod): the log's fold no longer
    reaches the digest the scheduler recorded there. The checkpoint itself agrees with the log
    after the cut, so only the share before it can see this (`Share.stop_digest`)."""
    events = _events(day_log)
    cp = _plan(day_log, 2)[1][1]
    assert cp is not None
    cut = cp.position
    edited = max(i for i in range(cut) if events[i]["type"] == "kai.cluster.pod.observed"
                 and events[i - 1]["type"] != "kai.scheduler.cycle.completed")
    assert edited > max(i for i in range(cut) if events[i]["type"] == "kai.scheduler.cycle.started")
    events[edited]["data"]["labels"] = {**events[edited]["data"].get("labels", {}), "edited": "yes"}
    log = _copy(day_log, tmp_path / "edited.log", events)
    one = sequential(log)
    assert one.divergence is not None and one.divergence.position == cut
    many = replay_file(log, jobs=2, min_records=1)
    assert many.resumed == 1 and many.divergence == one.divergence


@pytest.mark.parametrize("jobs", [2, 4])
def test_a_decision_of_a_cycle_before_a_checkpoint_found_after_it_is_judged_from_the_prefix(
        tmp_path: Path, day_log: Path, jobs: int, caplog: pytest.LogCaptureFixture) -> None:
    events = _events(day_log)
    early = next(e for e in events if e["type"] == "kai.scheduler.pod.bindingdecided")
    log = _copy(day_log, tmp_path / "late.log", [*events, early])
    one = sequential(log)
    assert one.divergence is not None and "already completed" in one.divergence.message
    with caplog.at_level(logging.WARNING):
        many = replay_file(log, jobs=jobs, min_records=1)
    assert many.divergence == one.divergence and "folding the log from the beginning" in caplog.text


def test_a_forged_checkpoint_off_a_cycle_start_sends_its_share_back_to_folding_from_0(
        tmp_path: Path, day_log: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A log edited so that a CycleCompleted claims a cut that is no CycleStarted, with a
    checkpoint of the state there under the digest it now records: the checkpoint passes the
    restart's checks, yet no cycle can be re-run from it."""
    cp = _plan(day_log, 2)[1][1]
    assert cp is not None
    events = _events(day_log)
    off = cp.position - 1
    assert events[off]["type"] != "kai.scheduler.cycle.started"
    state = ClusterState()
    for r in FileEventLog(day_log, readonly=True).scan():
        if r.position > off:
            break
        apply(state, r)
    data = cut_bytes(state)
    digest = state_digest(events[cp.completed_position]["policyversion"], state)
    events[cp.completed_position]["basedon"] = off
    events[cp.completed_position]["statedigest"] = digest
    log = tmp_path / "forged.log"
    _copy(day_log, log, events)
    clear_checkpoints(log)
    save_checkpoint(log, off, encode_stored(StoredSnapshot(off, cp.completed_position, cp.cycle, 0, digest, data)))
    one = sequential(log)
    assert one.divergence is not None
    with caplog.at_level(logging.WARNING):
        many = replay_file(log, jobs=2, min_records=1)
    assert many.resumed == 0 and many.divergence == one.divergence
    assert "cannot judge from there" in caplog.text


# -- binder outcomes across a checkpoint -----------------------------------------------------------


def _late_binder_log(path: Path, cycles: int = 24, every: int = 4) -> None:
    """A log whose binder confirms each cycle's bindings only after the next cycle started (as a
    slow binder does), with a checkpoint every `every` cycles written as the scheduler writes
    them: outcomes after a checkpoint name decisions before it."""
    packer = load_packer("native")
    config = SchedulerConfig()
    state = ClusterState()
    out: list[bytes] = []
    n = 0
    t = 1_767_225_600 * SEC

    def emit(envs: list[Envelope]) -> None:
        for env in envs:
            body = encode(env)
            apply(state, Record(len(out), decode(body)))
            out.append(frame(body))

    def ev(payload: p.Payload, subject: str, source: str = "kai-es/informer") -> Envelope:
        nonlocal n
        n += 1
        return make_envelope(payload, event_id=derived_id("late", n), source=source, subject=subject, logicaltime=t)

    emit([config_event(config, event_id="cfg", logicaltime=t), ev(p.QueueObserved(name="q"), "queue/q")])
    emit([ev(p.NodeObserved(name=f"n{i}", milli_cpu=64_000, memory_bytes=2**38, gpus=8), f"node/n{i}")
          for i in range(4)])
    unconfirmed: list[Envelope] = []
    snaps: list[StoredSnapshot] = []
    for cycle in range(1, cycles + 1):
        t += 5 * SEC
        emit([ev(p.PodObserved(namespace="d", name=f"p{cycle}-{k}", uid=f"u{cycle}-{k}", queue="q",
                               podgroup=f"g{cycle}-{k}", implicit_podgroup=True, created_ns=t,
                               requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30),
                               gpu=p.GpuRequest(whole=1)), f"pod/d/p{cycle}-{k}") for k in range(3)])
        started = ev(p.CycleStarted(cycle=cycle, config_digest=config_digest(config)), f"cycle/{cycle}",
                     "kai-es/scheduler")
        emit([started])
        cut = Record(len(out) - 1, started)
        decisions = run_cycle(state, cut, config, packer)
        snap = cut_snapshot(state, config, decisions) if cycle % every == 0 else None
        emit(decisions)
        if snap is not None:
            snaps.append(StoredSnapshot(cut.position, len(out) - 1, cycle, t, decisions[-1].statedigest or "", snap))
        t += SEC
        emit([make_envelope(p.PodBound(namespace="d", name=d.data.name, uid=d.data.uid, node=d.data.node,
                                       decision_id=d.id, gpu_devices=d.data.gpu_devices),
                            event_id=derived_id(d.id, 0), source="kai-es/binder", subject=d.subject, logicaltime=t)
              for d in unconfirmed])
        unconfirmed = [d for d in decisions if isinstance(d.data, p.BindingDecided)]
    path.write_bytes(b"".join(out))
    for stored in snaps:
        save_checkpoint(path, stored.position, encode_stored(stored))


def test_outcomes_of_decisions_before_a_checkpoint_are_checked_against_them(tmp_path: Path) -> None:
    log = tmp_path / "late.log"
    _late_binder_log(log)
    cps = list_checkpoints(log)
    assert len(cps) == 6
    events = _events(log)
    decided_at = {e["id"]: i for i, e in enumerate(events) if e["type"] == "kai.scheduler.pod.bindingdecided"}
    crossing = [i for i, e in enumerate(events) if e["type"] == "kai.binder.pod.bound"
                and any(decided_at[e["data"]["decision_id"]] < cp.position < i for cp in cps)]
    assert crossing  # the case under test: outcomes after a checkpoint of decisions before it
    one = sequential(log)
    assert one.ok and one.cycles == 24
    for jobs in (2, 3, 4):
        many = replay_file(log, jobs=jobs, min_records=1)
        assert many.resumed == jobs - 1 and verdict(many) == verdict(one)


@pytest.mark.parametrize("field", ["name", "node"])
def test_an_impossible_outcome_of_a_decision_before_a_checkpoint_diverges_as_in_one_process(
        tmp_path: Path, field: str) -> None:
    src = tmp_path / "late.log"
    _late_binder_log(src)
    events = _events(src)
    cp = _plan(src, 2)[1][1]
    assert cp is not None
    cut = cp.position
    decided_at = {e["id"]: i for i, e in enumerate(events) if e["type"] == "kai.scheduler.pod.bindingdecided"}
    bad = next(i for i, e in enumerate(events) if e["type"] == "kai.binder.pod.bound" and i > cut
               and decided_at[e["data"]["decision_id"]] < cut)
    events[bad]["data"][field] = "elsewhere"
    log = _copy(src, tmp_path / "impossible.log", events)
    one = sequential(log)
    assert one.divergence is not None and one.divergence.found_at == bad and one.divergence.cycle == -1
    assert f"{field} 'elsewhere'" in one.divergence.message
    many = replay_file(log, jobs=2, min_records=1)
    assert many.resumed == 1 and many.divergence == one.divergence


def test_an_outcome_naming_no_decision_after_a_checkpoint_diverges_as_in_one_process(tmp_path: Path) -> None:
    src = tmp_path / "late.log"
    _late_binder_log(src)
    events = _events(src)
    cut = list_checkpoints(src)[2].position
    bad = next(i for i, e in enumerate(events) if e["type"] == "kai.binder.pod.bound" and i > cut)
    events[bad]["data"]["decision_id"] = "never-decided"
    log = _copy(src, tmp_path / "orphan.log", events)
    one = sequential(log)
    assert one.divergence is not None and "not in the log before it" in one.divergence.message
    many = replay_file(log, jobs=4, min_records=1)
    assert many.resumed >= 1 and many.divergence == one.divergence
