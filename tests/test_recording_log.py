"""The what-if's log (`whatif.recording_log.RecordingFileLog`): it keeps only the last records in
memory, yet every read returns what was appended, from memory or, further back, from its file;
without a file, a read from before the kept records fails loudly instead of skipping them."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.whatif.recording_log import AppendedNotDecodedError, RecordingFileLog


def _envelopes(start: int, n: int) -> list[Envelope]:
    return [make_envelope(p.CycleStarted(cycle=i, config_digest="sha256:" + "0" * 64), event_id=f"e{i}",
                          source="test", subject=f"cycle/{i}", logicaltime=1_000_000_000 * (i + 1))
            for i in range(start, start + n)]


async def _read(log: RecordingFileLog, start: int) -> list[Record]:
    return [r async for r in log.read(start)]


def test_every_read_returns_what_was_appended_though_only_a_window_is_kept(tmp_path: Path) -> None:
    async def run() -> None:
        log = RecordingFileLog(tmp_path / "w.events.jsonl", window=4)
        appended: list[Envelope] = []
        for batch in range(7):
            events = _envelopes(len(appended), batch % 3 + 1)
            assert await log.append(events) == list(range(len(appended), len(appended) + len(events)))
            appended += events
            assert len(log.records) <= 8
            for start in (0, 1, len(appended) // 2, len(appended) - 1, len(appended)):
                got = await _read(log, start)
                assert [(r.position, r.envelope) for r in got] == list(enumerate(appended))[start:]
        assert log.base > 0  # the early records left memory
        assert await log.end_position() == len(appended)
        await log.close()
        on_disk = [r.envelope for r in FileEventLog(tmp_path / "w.events.jsonl", readonly=True).scan()]
        assert on_disk == appended

    anyio.run(run)


def test_a_follower_sees_each_record_once_across_the_window_moving(tmp_path: Path) -> None:
    async def run() -> None:
        log = RecordingFileLog(tmp_path / "f.events.jsonl", window=2)
        await log.append(_envelopes(0, 3))
        seen: list[int] = []

        async def follow() -> None:
            async for record in log.read(0, follow=True):
                seen.append(record.position)
                if record.position == 9:
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            for i in range(3, 10):
                await anyio.sleep(0)
                await log.append(_envelopes(i, 1))
        assert seen == list(range(10))
        await log.close()

    anyio.run(run)


def test_without_a_file_a_read_from_before_the_window_fails() -> None:
    async def run() -> None:
        log = RecordingFileLog(None, window=2)
        await log.append(_envelopes(0, 6))
        assert [r.position for r in await _read(log, log.base)] == list(range(log.base, 6))
        with pytest.raises(RuntimeError, match="no longer kept"):
            await _read(log, 0)

    anyio.run(run)


def test_in_verification_mode_an_append_that_its_bytes_would_not_give_back_is_refused(tmp_path: Path) -> None:
    """The what-if folds the objects it appended, a replay their bytes decoded: a payload field
    holding a list where it decodes a tuple (msgspec does not convert at construction) would
    fold the two differently. Verification mode (CI's) refuses such an append, naming it."""
    bound = p.PodBound(namespace="default", name="a", uid="u", node="n", decision_id="d",
                       gpu_devices=[0, 1])  # type: ignore[arg-type]  # a list, as a careless writer makes it
    env = make_envelope(bound, event_id="e-bound", source="test", subject="pod/default/a", logicaltime=1)
    good = make_envelope(msgspec.structs.replace(bound, gpu_devices=(0, 1)), event_id="e-good",
                         source="test", subject="pod/default/a", logicaltime=2)

    async def run() -> None:
        checked = RecordingFileLog(tmp_path / "v.events.jsonl", verify=True)
        assert await checked.append([good]) == [0]
        with pytest.raises(AppendedNotDecodedError, match=r"kai\.binder\.pod\.bound pod/default/a \(e-bound\)"):
            await checked.append([env])
        await checked.close()
        unchecked = RecordingFileLog(None, verify=False)
        assert await unchecked.append([env]) == [0]  # outside verification mode: served as appended
        await unchecked.close()

    anyio.run(run)
