"""The informer's clock (`kai_es.app.processes._follow_times`): it never stays behind a logical
time another writer appended, and its work does not grow with the append rate (it reads only
the last records of each poll)."""

from __future__ import annotations

from pathlib import Path

import anyio

from kai_es.adapters.clock import FlowClock
from kai_es.adapters.file_log import FileEventLog
from kai_es.app import processes
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope

AHEAD_NS = 10**9 * 3600  # an hour ahead of this machine's clock


def _env(i: int, t: int) -> object:
    return make_envelope(p.ResyncStarted(kind="Pod"), event_id=f"e{i}", source="other", subject="s",
                         logicaltime=t)


async def test_the_clock_catches_up_with_a_writer_ahead_within_a_poll(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = FileEventLog(path)
    clock = FlowClock(1.0)
    ahead = clock.now_ns() + AHEAD_NS
    reads: list[int] = []
    real_open = processes.open_log

    def counting_open(url: str, **kw: object) -> object:
        opened = real_open(url, **kw)  # type: ignore[arg-type]
        read = opened.read

        def counted(from_position: int = 0, **k: object) -> object:
            reads.append(from_position)
            return read(from_position, **k)  # type: ignore[arg-type]

        opened.read = counted  # type: ignore[method-assign]
        return opened

    processes.open_log = counting_open  # type: ignore[assignment]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: processes._follow_times(str(path), clock, poll_s=0.02, tail=4))
            await anyio.sleep(0.05)
            # a burst of 1,000 records from another writer, the last one an hour ahead
            await log.append([_env(i, ahead - 1000 + i) for i in range(1000)])  # type: ignore[list-item]
            with anyio.fail_after(5):
                while clock.now_ns() < ahead:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        processes.open_log = real_open  # type: ignore[assignment]
        await log.close()
    assert clock.now_ns() >= ahead
    assert reads and min(reads) >= 1000 - 4  # only the tail of the burst was read
