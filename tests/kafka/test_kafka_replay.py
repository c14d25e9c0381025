"""`kai-es replay kafka://...` against a REAL broker: the records stream through the replay from
a reader process (`adapters.kafka_frames`) instead of being collected first, `--jobs N` spreads
the replay over processes, starting the later ones from the checkpoints the scheduler keeps in
the `<topic>.checkpoints` topic (`adapters.kafka_checkpoints`), and the verdict is the one a
replay of the same events in a file reaches (a file log appended as one transaction has its
positions as offsets, so the file's checkpoints are the topic's)."""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from kai_es.adapters.file_checkpoints import list_checkpoints, thinned
from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.kafka_checkpoints import KafkaCheckpointStore
from kai_es.adapters.kafka_frames import KafkaRange, end_offset, kafka_frames
from kai_es.adapters.kafka_log import KafkaEventLog, KafkaLogError
from kai_es.adapters.snapshot_codec import encode_stored
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ports import StoredSnapshot
from kai_es.replay_parallel import kafka_checkpoints, plan_checkpointed, replay_kafka
from tests.kafka.procs import append_file_log
from tests.kafka.test_faults import _dead_letter_keys, _produce_raw
from tests.replays import day_log_with_checkpoints, sequential, verdict

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "quickstart.events.jsonl"
ALTERED = ROOT / "tests" / "golden" / "quickstart.altered.events.jsonl"
CONSOLIDATION = ROOT / "tests" / "golden" / "consolidation.events.jsonl"


def _topic_of(bootstrap: str, topic: str, path: Path) -> KafkaEventLog:
    """A fresh topic holding the file log at `path` with its positions as offsets; a read-only
    log of it."""
    anyio.run(append_file_log, bootstrap, topic, path)
    return KafkaEventLog(bootstrap, topic, create=False)


@pytest.fixture(scope="module")
def day_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return day_log_with_checkpoints(tmp_path_factory.mktemp("day"))


def _with_checkpoints(bootstrap: str, topic: str, path: Path) -> KafkaEventLog:
    """`_topic_of(path)` with the file log's checkpoints in its checkpoints topic (its offsets
    are the file's positions, so they are checkpoints of it)."""
    log = _topic_of(bootstrap, topic, path)

    async def save() -> None:
        store = KafkaCheckpointStore(bootstrap, topic)
        try:
            for cp in list_checkpoints(path):
                await store.save(cp.position, cp.path.read_bytes())
        finally:
            await store.close()

    anyio.run(save)
    return log


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("path", [GOLDEN, CONSOLIDATION], ids=["quickstart", "consolidation"])
@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_a_kafka_replay_reaches_the_file_replays_verdict(kafka_bootstrap: str, unique_name: str,
                                                        path: Path, jobs: int) -> None:
    one = sequential(path)
    assert one.ok and one.cycles > 0
    log = _topic_of(kafka_bootstrap, unique_name, path)
    assert verdict(replay_kafka(log, jobs=jobs, min_records=1)) == verdict(one)
    assert log.dead_letters == []


@pytest.mark.parametrize("jobs", [1, 3])
def test_a_kafka_replay_finds_the_file_replays_divergence(kafka_bootstrap: str, unique_name: str,
                                                         jobs: int) -> None:
    one = sequential(ALTERED)
    assert one.divergence is not None and one.divergence.message == "decision differs"
    log = _topic_of(kafka_bootstrap, unique_name, ALTERED)
    assert replay_kafka(log, jobs=jobs, min_records=1).divergence == one.divergence
    run = _cli("replay", "--jobs", str(jobs), f"kafka://{kafka_bootstrap}/{unique_name}")
    assert run.returncode == 1 and "decision differs" in run.stderr, run.stdout + run.stderr


def test_undecodable_records_are_skipped_and_dead_lettered_by_every_share(kafka_bootstrap: str,
                                                                          unique_name: str) -> None:
    """Records no kai-es writer wrote (garbage, one without a value) after the log: every
    reader skips them, so the replay does too, names them and copies them to the dead-letter
    topic, with one process or three."""
    one = sequential(GOLDEN)
    _topic_of(kafka_bootstrap, unique_name, GOLDEN)
    bad = [anyio.run(_produce_raw, kafka_bootstrap, unique_name, value) for value in (b'{"specversion": "1.0", "type": ', None)]
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    lines = set()
    for jobs in ("1", "3"):
        run = _cli("replay", "--jobs", jobs, url)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"dead-lettered: offset {bad[0]} (not a kai-es envelope" in run.stdout
        assert f"dead-lettered: offset {bad[1]} (record has no value)" in run.stdout
        lines.add(run.stdout.splitlines()[-1])
    assert len(lines) == 1 and next(iter(lines)).startswith(f"OK: {one.cycles} cycles, {one.decisions} decisions")
    log = KafkaEventLog(kafka_bootstrap, unique_name, create=False)
    result = replay_kafka(log, jobs=3, min_records=1)
    assert result.ok and result.records == one.records
    assert [d.offset for d in log.dead_letters] == bad
    keys = anyio.run(_dead_letter_keys, kafka_bootstrap, unique_name)
    assert {str(offset).encode() for offset in bad} <= set(keys)


def test_the_audit_commands_read_a_topic_as_they_read_the_file(kafka_bootstrap: str, unique_name: str) -> None:
    """`events`, `explain` and `usage` stream the topic (`cli_common.records_from`): what they
    print is what they print for the same log in a file (whose positions are its offsets)."""
    _topic_of(kafka_bootstrap, unique_name, GOLDEN)
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    for args in (["events", "-o", "json"], ["events", "--from", "40", "--type", "kai.scheduler.*", "-o", "json"],
                 ["explain", "default/finetune-1"], ["usage"]):
        from_topic, from_file = _cli(args[0], url, *args[1:]), _cli(args[0], str(GOLDEN), *args[1:])
        assert from_topic.returncode == from_file.returncode == 0, from_topic.stderr + from_file.stderr
        assert from_topic.stdout == from_file.stdout.replace(str(GOLDEN), url) and from_topic.stdout


def test_the_reader_streams_ranges_and_positions(kafka_bootstrap: str, unique_name: str) -> None:
    log = _topic_of(kafka_bootstrap, unique_name, GOLDEN)
    end = end_offset(log)
    records = FileEventLog(GOLDEN, readonly=True)
    frames = list(kafka_frames(log, 0, end))
    assert frames == [(position, bytes(body)) for position, body in records.frames(0, records.record_count())]
    assert list(kafka_frames(log, 7, 11)) == frames[7:11]
    assert list(kafka_frames(log, end, None)) == []
    marker = end - 1  # (the transaction's commit marker: an offset without a record)
    assert KafkaRange(log).bodies_at([5, 0, marker, end, 10**12, -1, 5]) == {0: frames[0][1], 5: frames[5][1]}


def _long_topic(bootstrap: str, topic: str) -> KafkaEventLog:
    """40,000 records, several of a reader's batches: after the first, the reader waits on the
    pipe (it runs at most a batch ahead), so it is still there while the caller reads."""
    envs = [make_envelope(p.NodeObserved(name=f"n{i}", milli_cpu=1000, memory_bytes=2**30), event_id=f"e{i}",
                          source="test", subject=f"node/n{i}", logicaltime=i + 1) for i in range(40_000)]

    async def append() -> None:
        writer = KafkaEventLog(bootstrap, topic, transactional_id=f"{topic}-w")
        try:
            for k in range(0, len(envs), 10_000):
                await writer.append(envs[k:k + 10_000])
        finally:
            await writer.close()

    anyio.run(append)
    return KafkaEventLog(bootstrap, topic, create=False)


def test_the_reader_stops_with_its_iterator(kafka_bootstrap: str, unique_name: str) -> None:
    log = _long_topic(kafka_bootstrap, unique_name)
    early = kafka_frames(log, 0, end_offset(log))
    assert next(early)[0] == 0
    assert multiprocessing.active_children()  # its reader
    early.close()
    assert not multiprocessing.active_children()


def test_a_reader_that_dies_midway_is_an_error_not_a_short_log(kafka_bootstrap: str, unique_name: str) -> None:
    log = _long_topic(kafka_bootstrap, unique_name)
    frames = kafka_frames(log, 0, end_offset(log))
    next(frames)
    (reader,) = multiprocessing.active_children()
    os.kill(reader.pid or 0, signal.SIGKILL)
    with pytest.raises(KafkaLogError, match="ended without finishing .exit code -9"):
        for _ in frames:
            pass
    assert not multiprocessing.active_children()


def test_a_failing_reader_raises_in_the_caller(kafka_bootstrap: str, unique_name: str) -> None:
    missing = KafkaEventLog(kafka_bootstrap, unique_name, create=False)
    with pytest.raises(KafkaLogError, match=f"topic '{unique_name}' does not exist"):
        list(kafka_frames(missing, 0, 10))
    assert not multiprocessing.active_children()


# -- checkpoints --------------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", [2, 4])
def test_a_spread_kafka_replay_starts_from_the_topics_checkpoints(kafka_bootstrap: str, unique_name: str,
                                                                 day_log: Path, jobs: int) -> None:
    one = sequential(day_log)
    assert one.ok and one.cycles > 100
    log = _with_checkpoints(kafka_bootstrap, unique_name, day_log)
    assert [cp.position for cp in kafka_checkpoints(log)] == [cp.position for cp in list_checkpoints(day_log)]
    many = replay_kafka(log, jobs=jobs, min_records=1)
    assert verdict(many) == verdict(one) and many.resumed == jobs - 1
    plain = replay_kafka(log, jobs=jobs, min_records=1, checkpoints=False)
    assert verdict(plain) == verdict(one) and plain.resumed == 0


def test_a_kafka_log_without_checkpoints_is_replayed_without_creating_them(kafka_bootstrap: str,
                                                                           unique_name: str) -> None:
    log = _topic_of(kafka_bootstrap, unique_name, GOLDEN)
    assert kafka_checkpoints(log) == []
    assert replay_kafka(log, jobs=2, min_records=1).resumed == 0
    run = _cli("events", f"kafka://{kafka_bootstrap}/{unique_name}.checkpoints")
    assert run.returncode != 0 and "does not exist" in run.stderr  # (a read-only replay created nothing)


def test_a_kafka_checkpoint_that_does_not_restore_to_its_digest_is_not_used(
        kafka_bootstrap: str, unique_name: str, day_log: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = _with_checkpoints(kafka_bootstrap, unique_name, day_log)
    used = [cp for _, cp in plan_checkpointed(KafkaRange(log), end_offset(log), 2, kafka_checkpoints(log),
                                              min_records=1) if cp is not None]
    assert len(used) == 1
    stored = used[0].load()
    state = json.loads(stored.data)
    state["records"] += 1  # a state the log never folds to, under the log's own digest
    forged = encode_stored(StoredSnapshot(stored.position, stored.completed_position, stored.cycle,
                                          stored.logicaltime, stored.digest,
                                          json.dumps(state, sort_keys=True, separators=(",", ":")).encode()))

    async def overwrite() -> None:
        store = KafkaCheckpointStore(kafka_bootstrap, unique_name)
        try:
            await store.send(f"{stored.position:012d}".encode(), forged)
        finally:
            await store.close()

    anyio.run(overwrite)
    with caplog.at_level(logging.WARNING):
        many = replay_kafka(log, jobs=2, min_records=1)
    assert many.resumed == 0 and f"position {stored.position}" in caplog.text and "rejected" in caplog.text
    assert verdict(many) == verdict(sequential(day_log))


def test_the_checkpoint_store_thins_like_a_file_logs_and_across_restarts(kafka_bootstrap: str,
                                                                         unique_name: str, day_log: Path) -> None:
    """Twelve saves with `keep` 4, by two store instances (a restarted scheduler learns what the
    topic holds): the positions kept are those the file thinning keeps, the others tombstoned."""
    blob = list_checkpoints(day_log)[0].path.read_bytes()
    header, body = blob.split(b"\n", 1)
    positions = [100 * k for k in range(1, 13)]

    async def save(store: KafkaCheckpointStore, some: list[int]) -> None:
        try:
            for position in some:
                fields = {**json.loads(header), "position": position}
                await store.save(position, json.dumps(fields).encode() + b"\n" + body)
        finally:
            await store.close()

    anyio.run(save, KafkaCheckpointStore(kafka_bootstrap, unique_name, keep=4), positions[:7])
    anyio.run(save, KafkaCheckpointStore(kafka_bootstrap, unique_name, keep=4), positions[7:])
    expected = list(positions[:1])
    for position in positions[1:]:
        expected.append(position)
        expected = [x for x in expected if x not in thinned(expected, 4)]
    log = KafkaEventLog(kafka_bootstrap, unique_name, create=False)
    assert [cp.position for cp in kafka_checkpoints(log)] == expected and expected[-1] == positions[-1]


def test_positions_past_twelve_digits_are_listed_in_numeric_order(kafka_bootstrap: str, unique_name: str,
                                                                  day_log: Path) -> None:
    blob = list_checkpoints(day_log)[0].path.read_bytes()
    header, body = blob.split(b"\n", 1)
    big = [2**63 - 1, 999_999_999_998, 999_999_999_999, 5 * 10**12, 2**62, 2**62 + 1, 3 * 10**18]  # (as text, 5*10**12 < 999...)

    async def save() -> None:
        store = KafkaCheckpointStore(kafka_bootstrap, unique_name, keep=6)
        try:
            for position in sorted(big):
                await store.save(position, json.dumps({**json.loads(header), "position": position}).encode()
                                 + b"\n" + body)
        finally:
            await store.close()

    anyio.run(save)
    log = KafkaEventLog(kafka_bootstrap, unique_name, create=False)
    kept = [x for x in sorted(big) if x not in thinned(sorted(big), 6)]
    assert {999_999_999_999, 5 * 10**12} <= set(kept) and len(kept) == 6 and [cp.position for cp in kafka_checkpoints(log)] == kept


def test_the_scheduler_keeps_its_checkpoints_in_the_topic(kafka_bootstrap: str, unique_name: str,
                                                          tmp_path: Path) -> None:
    """`kai-es simulate --log kafka://... --snapshot-every 2` (the scheduler service and its snapshot
    store): checkpoints agree with the log, the newest is the snapshot a restart loads, and a
    spread replay starts from them."""
    url = f"kafka://{kafka_bootstrap}/{unique_name}"
    run = _cli("simulate", "examples/quickstart.yaml", "--log", url, "--report", str(tmp_path / "r"),
               "--snapshot-every", "2")
    assert run.returncode == 0, run.stderr
    log = KafkaEventLog(kafka_bootstrap, unique_name, create=False)
    cps = kafka_checkpoints(log)
    assert 2 <= len(cps) <= 8
    records = {position: body for position, body in kafka_frames(log, 0, end_offset(log))}
    for cp in cps:
        started, completed = (json.loads(records[x] or b"{}") for x in (cp.position, cp.completed_position))
        assert started["type"] == "kai.scheduler.cycle.started" and started["data"]["cycle"] == cp.cycle
        assert completed["basedon"] == cp.position and completed["statedigest"] == cp.digest == cp.load().digest
    one = replay_kafka(log, jobs=1)
    many = replay_kafka(log, jobs=3, min_records=1)
    assert one.ok and verdict(many) == verdict(one) and many.resumed >= 1


class _HeldStream(io.StringIO):
    """A stream whose lock a thread of the caller holds (as a spinner's redraw may at a fork):
    whoever writes to it waits for ever."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.lock.acquire()

    def write(self, s: str) -> int:
        with self.lock:
            return super().write(s)


def test_a_reader_forked_while_stderr_is_held_writes_to_its_own(kafka_bootstrap: str, unique_name: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader logs (here: a warning as it starts) to a stderr of its own, not to the inherited
    object, whose lock may be held for ever in it."""
    log = _topic_of(kafka_bootstrap, unique_name, GOLDEN)
    end = end_offset(log)
    original = KafkaEventLog.read_raw

    async def speaking(self: KafkaEventLog, start: int = 0, stop: int | None = None
                       ) -> AsyncIterator[list[tuple[int, bytes | None]]]:
        logging.getLogger("kai_es.adapters.kafka_log").warning("the reader starts")
        async for batch in original(self, start, stop):
            yield batch

    monkeypatch.setattr(KafkaEventLog, "read_raw", speaking)
    held = _HeldStream()
    handler = logging.StreamHandler(held)
    root = logging.getLogger()
    monkeypatch.setattr(sys, "stderr", held)
    root.addHandler(handler)
    got: list[tuple[int, bytes | None]] = []
    try:
        reading = threading.Thread(target=lambda: got.extend(kafka_frames(log, 0, end)), daemon=True)
        reading.start()
        reading.join(60)
        assert not reading.is_alive(), "the reader blocked on the inherited stderr"
    finally:
        root.removeHandler(handler)
    assert [position for position, _ in got] == [r.position for r in FileEventLog(GOLDEN, readonly=True).scan()]
