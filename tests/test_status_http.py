"""The HTTP face of a running process (`kai_es/adapters/status_http.py`): /healthz follows the
event loop's heartbeat, /readyz the session's announcement, /metrics what went through the log;
`_serve` wires them (not ready until the body announces itself, not ready again while a
session starts over)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.adapters.status_http import (
    BadAddress,
    MeteredLog,
    ProcessStatus,
    StatusServer,
    parse_bind_address,
)
from kai_es.app import processes
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ports import EventLog


def get(server: StatusServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{server.address}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def status() -> ProcessStatus:
    return ProcessStatus("scheduler", stall_s=60)


@pytest.fixture
def server(status: ProcessStatus) -> Iterator[StatusServer]:
    srv = StatusServer(status, "127.0.0.1:0")
    try:
        yield srv
    finally:
        srv.close()


def env(payload: object, n: int) -> object:
    return make_envelope(payload, event_id=f"e{n}", source="test", subject=f"s/{n}",  # type: ignore[arg-type]
                         logicaltime=n)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in:\n{text}")


def test_readiness_follows_the_announcement(status: ProcessStatus, server: StatusServer) -> None:
    assert get(server, "/readyz") == (503, "starting\n")
    status.set_ready(True)
    assert get(server, "/readyz") == (200, "ok\n")
    status.set_ready(False, "scheduler starting again after KafkaConnectionError: down")
    assert get(server, "/readyz") == (503, "scheduler starting again after KafkaConnectionError: down\n")
    assert metric(get(server, "/metrics")[1], "kai_es_ready") == 0


def test_liveness_fails_when_the_loop_stops_beating(status: ProcessStatus, server: StatusServer) -> None:
    status.beat()
    assert get(server, "/healthz") == (200, "ok\n")
    status.stall_s = 0.0
    code, why = get(server, "/healthz")
    assert code == 503 and "event loop unresponsive" in why
    assert get(server, "/nothing")[0] == 404


async def test_metered_log_counts_appends_and_times_cycles(status: ProcessStatus,
                                                          server: StatusServer) -> None:
    log = MeteredLog(MemoryEventLog(), status)
    await log.append([env(p.NodeObserved(name="n1", milli_cpu=1000, memory_bytes=2**30, gpus=8), 1)])
    await log.append([env(p.CycleStarted(cycle=1, config_digest="d"), 2)])
    await log.append([env(p.PodUnschedulable(namespace="a", name="x", uid="u", podgroup="g", queue="q",
                                             reasons=()), 3),
                      env(p.CycleCompleted(cycle=1, decisions=1, unschedulable=1), 4)])
    text = get(server, "/metrics")[1]
    assert metric(text, 'kai_es_appended_events_total{type="kai.scheduler.cycle.started"}') == 1
    assert metric(text, "kai_es_cycle_duration_seconds_count") == 1
    assert metric(text, "kai_es_append_duration_seconds_count") == 3
    assert metric(text, "kai_es_log_appended_position") == 3
    assert [r.envelope.id for r in [r async for r in log.read()]] == ["e1", "e2", "e3", "e4"]


@pytest.mark.parametrize("text", ["8080", "host:", "h:99999", ":http"])
def test_a_bad_bind_address_is_a_clear_error(text: str) -> None:
    with pytest.raises(BadAddress, match="expected HOST:PORT"):
        parse_bind_address(text)


def test_an_address_in_use_is_a_clear_error(server: StatusServer, status: ProcessStatus) -> None:
    with pytest.raises(BadAddress, match=f"'{server.address}'"):
        StatusServer(status, server.address)


async def test_serve_is_ready_only_once_the_body_announces_and_counts_restarts(
        status: ProcessStatus, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[EventLog] = []
    monkeypatch.setattr(processes, "open_log",
                        lambda url, writer, tenure: opened.append(MemoryEventLog()) or opened[-1])
    seen: list[bool] = []
    sessions = 0

    async def body(events: EventLog, _: object) -> None:
        nonlocal sessions
        sessions += 1
        assert isinstance(events, MeteredLog)
        seen.append(status.readiness()[0])
        ready = processes.announcing(None, status)
        assert ready is not None
        ready("ready")
        seen.append(status.readiness()[0])
        if sessions == 1:
            raise ConnectionError("lost the log")
        await events.append([env(p.CycleStarted(cycle=1, config_digest="d"), 1)])

    with anyio.fail_after(10):
        await processes._serve("scheduler", "memory:", "w", body, status=status)
    assert seen == [False, True, False, True]
    assert status.registry.get_sample_value("kai_es_session_restarts_total") == 1
    assert status.registry.get_sample_value("kai_es_appended_events_total",
                                            {"type": "kai.scheduler.cycle.started"}) == 1
