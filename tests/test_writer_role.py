"""How a long-running process keeps its writer role: `while_writer` stops work that has nothing to
append once `EventLog.check_writer` reports fencing, and `supervise` never starts a fenced
session again, even when a task group wrapped the fencing error."""

from __future__ import annotations

import logging

import anyio
import pytest

from kai_es.adapters.kafka_log import FencedError
from kai_es.adapters.kafka_tenure import WriterTenure
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.processes import supervise, while_writer
from kai_es.ingest.shards import ShardMap
from kai_es.ports import SetupError


class TakenOverLog(MemoryEventLog):
    """A memory log whose `check_writer` raises `error` from its `fence_at`-th call on."""

    def __init__(self, fence_at: int, error: BaseException | None = None) -> None:
        super().__init__()
        self.fence_at = fence_at
        self.error = error
        self.checks = 0

    async def check_writer(self) -> None:
        self.checks += 1
        if self.checks >= self.fence_at:
            raise self.error or FencedError("scheduler-0", "kai-es.events", when="check")


async def idle_forever() -> None:
    await anyio.sleep(3600)


async def test_an_idle_process_stops_when_another_took_over() -> None:
    log = TakenOverLog(fence_at=3)
    with anyio.fail_after(5), pytest.raises(FencedError, match="took over.*nothing to write"):
        await while_writer(log, idle_forever(), every_s=0.01)
    assert log.checks == 3


async def test_work_that_ends_ends_the_checks() -> None:
    log = TakenOverLog(fence_at=10**9)
    await while_writer(log, anyio.sleep(0.05), every_s=0.01)
    checks = log.checks
    await anyio.sleep(0.05)
    assert 1 <= checks == log.checks


async def test_a_check_that_fails_otherwise_is_logged_and_tried_again(
        caplog: pytest.LogCaptureFixture) -> None:
    log = TakenOverLog(fence_at=1, error=ConnectionError("broker unreachable"))
    with caplog.at_level(logging.WARNING, logger="kai_es.app.processes"):
        await while_writer(log, anyio.sleep(0.1), every_s=0.01)
    assert log.checks >= 3
    assert "checking the writer role failed: ConnectionError: broker unreachable" in caplog.text


async def test_an_error_of_the_work_arrives_unwrapped() -> None:
    async def broken() -> None:
        raise KeyError("the work's own error")

    with pytest.raises(KeyError, match="the work's own error"):
        await while_writer(TakenOverLog(fence_at=10**9), broken(), every_s=0.01)


async def test_a_fenced_session_is_not_started_again_even_from_a_task_group() -> None:
    sessions = 0

    async def session() -> None:
        nonlocal sessions
        sessions += 1

        async def append() -> None:
            raise FencedError("scheduler-0", "kai-es.events")

        async with anyio.create_task_group() as tg:  # wraps the error in an ExceptionGroup
            tg.start_soon(append)
            await anyio.sleep(3600)

    with anyio.fail_after(5), pytest.raises(FencedError, match="its last append is not visible"):
        await supervise("scheduler", session, backoff_s=0.01)
    assert sessions == 1


async def test_other_errors_start_a_new_session() -> None:
    sessions = 0

    async def session() -> None:
        nonlocal sessions
        sessions += 1
        if sessions < 3:
            raise ConnectionError("lost the broker")

    await supervise("scheduler", session, backoff_s=0.01)
    assert sessions == 3


async def test_an_unwrapped_error_keeps_its_own_cause(caplog: pytest.LogCaptureFixture) -> None:
    """A library's wrapper error (aiokafka's "Unexpected error during batch delivery") arrives
    from `while_writer` and `supervise` with the error it was raised from, and the restart's
    warning names both: unwrapping from the task group's ExceptionGroup must not cut the
    chain that says what happened."""
    sessions = 0

    async def broken() -> None:
        try:
            raise ValueError("the broker's answer")
        except ValueError as root:
            raise RuntimeError("unexpected error during batch delivery") from root

    with pytest.raises(RuntimeError) as caught:
        await while_writer(TakenOverLog(fence_at=10**9), broken(), every_s=0.01)
    assert isinstance(caught.value.__cause__, ValueError)

    async def session() -> None:
        nonlocal sessions
        sessions += 1
        if sessions == 1:
            await while_writer(TakenOverLog(fence_at=10**9), broken(), every_s=0.01)

    with caplog.at_level(logging.WARNING, logger="kai_es.app.processes"):
        await supervise("scheduler", session, backoff_s=0.01)
    assert ("scheduler: RuntimeError: unexpected error during batch delivery <- ValueError: "
            "the broker's answer; starting again") in caplog.text


async def test_a_fencing_error_raised_from_another_keeps_it() -> None:
    """`supervise` re-raises a fencing error it found inside an ExceptionGroup with its cause."""
    async def session() -> None:
        async def append() -> None:
            try:
                raise KeyError("ProducerFenced")
            except KeyError as root:
                raise FencedError("scheduler-0", "kai-es.events") from root

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            await anyio.sleep(3600)

    with anyio.fail_after(5), pytest.raises(FencedError) as caught:
        await supervise("scheduler", session, backoff_s=0.01)
    assert isinstance(caught.value.__cause__, KeyError)


async def test_the_sessions_of_one_process_share_its_writer_tenure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each session opens its log again; all of them get the one `WriterTenure` of the
    process's role, so a restarted session's claim is checked against the earlier ones'."""
    from kai_es.app import processes  # noqa: PLC0415

    tenures: list[object] = []
    sessions = 0

    def opening(url: str, *, writer: str | None = None, tenure: object = None) -> MemoryEventLog:
        tenures.append(tenure)
        return MemoryEventLog()

    async def body(events: object, store: object) -> None:
        nonlocal sessions
        sessions += 1
        if sessions < 3:
            raise ConnectionError("lost the broker")

    monkeypatch.setattr(processes, "open_log", opening)
    await processes._serve("scheduler", "kafka://127.0.0.1:1/t", "scheduler-0", body)
    assert sessions == 3 and len(tenures) == 3
    assert isinstance(tenures[0], WriterTenure) and tenures[1] is tenures[0] and tenures[2] is tenures[0]


async def test_the_informer_keeps_each_shard_logs_tenure_across_sessions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharded informer writes one log per shard; each shard's log gets its own
    `WriterTenure`, the same one in every session of the process."""
    from kai_es.adapters.kubernetes import client  # noqa: PLC0415
    from kai_es.app import processes  # noqa: PLC0415

    opened: dict[str, list[object]] = {}
    sessions = 0

    def opening(url: str, *, writer: str | None = None, tenure: object = None) -> MemoryEventLog:
        opened.setdefault(url, []).append(tenure)
        return MemoryEventLog()

    async def no_apiserver(kubeconfig: str | None) -> None:
        nonlocal sessions
        sessions += 1
        if sessions == 2:
            raise SetupError("enough sessions")  # (supervise stops on it)
        raise ConnectionError("no apiserver yet")

    monkeypatch.setattr(processes, "open_log", opening)
    monkeypatch.setattr(client, "api_client", no_apiserver)
    with anyio.fail_after(10), pytest.raises(SetupError):
        await processes.run_informer("kafka://127.0.0.1:1/t", None,
                                     shards=ShardMap.parse(["default=", "gpu=gpu-nodes"]))
    assert sorted(opened) == ["kafka://127.0.0.1:1/t", "kafka://127.0.0.1:1/t.gpu"]
    for url, tenures in opened.items():
        assert len(tenures) == 2 and isinstance(tenures[0], WriterTenure) and tenures[1] is tenures[0], url
    assert opened["kafka://127.0.0.1:1/t"][0] is not opened["kafka://127.0.0.1:1/t.gpu"][0]
