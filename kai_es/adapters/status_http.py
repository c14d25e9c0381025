"""What a running kai-es process tells Kubernetes and Prometheus over HTTP.

Endpoints (``--http-bind-address HOST:PORT`` on `kai-es scheduler`, `informer`, `binder`):
- ``/healthz`` (liveness): 200 while the process's event loop is responsive — it beats at
  least every `HEARTBEAT_S` and the last beat is younger than `stall_s`; 503 with the age of the
  last beat otherwise (a loop stuck that long will not recover by itself: restart it).
- ``/readyz`` (readiness): 200 once the current session announced itself ready (it claimed its
  writer role and folded the log), and while a replica stands by for the leader Lease (so that
  a rolling update can proceed); 503 before that and while it starts again after an error.
- ``/metrics``: Prometheus text exposition of `ProcessStatus.registry`.
- ``/get-job-order`` (the scheduler): KAI's `reflectjoborder` document of the last cycle's
  order (`kai_es.visibility.job_order`), JSON; 503 until a cycle recorded one (a policy before
  kai-es/v13 records none: the reason says so); 404 on the informer and binder.

The server runs in a daemon thread, not on the event loop, so that a long cycle cannot make a
probe time out; what the thread reads (a flag, a monotonic timestamp, the metrics) is set by the
loop with single assignments or prometheus_client's own locking.

prometheus_client: the reference Python client keeps the metric types and the exposition format
right (escaping, histogram buckets, ``_total`` suffixes) — not worth hand-writing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.ports import EventLog, SetupError

log = logging.getLogger(__name__)

#: how often the event loop beats (`ProcessStatus.heartbeat`)
HEARTBEAT_S: Final = 1.0
#: default age of the last beat after which /healthz fails
STALL_S: Final = 120.0
_CYCLE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_APPEND_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class ProcessStatus:
    """Readiness, liveness and the metrics of one process (see the module docstring)."""

    def __init__(self, process: str, *, stall_s: float = STALL_S) -> None:
        self.process = process
        self.stall_s = stall_s
        self.registry = CollectorRegistry()
        self._ready = False
        self._why = "starting"
        self._last_beat = time.monotonic()
        #: the scheduler's `/get-job-order` body (None: no such endpoint, the other processes),
        #: and why there is none yet
        self.job_order: bytes | None = None
        self.job_order_missing = "no cycle has completed yet"
        self.serves_job_order = False
        self.ready_gauge = Gauge("kai_es_ready", "1 while the process is ready (/readyz)",
                                 registry=self.registry)
        self.restarts = Counter("kai_es_session_restarts", "Sessions started again after an error",
                                registry=self.registry)
        self.appended = Counter("kai_es_appended_events", "Events this process appended to the log",
                                ["type"], registry=self.registry)
        self.append_seconds = Histogram("kai_es_append_duration_seconds",
                                        "Time one append took until readers see it",
                                        buckets=_APPEND_BUCKETS, registry=self.registry)
        self.position = Gauge("kai_es_log_appended_position",
                              "Log position of the last event this process appended",
                              registry=self.registry)
        self.cycle_seconds = Histogram(
            "kai_es_cycle_duration_seconds",
            "A scheduling cycle, from appending its CycleStarted to appending its decisions",
            buckets=_CYCLE_BUCKETS, registry=self.registry)

    # -- set by the event loop ----------------------------------------------------------------

    def set_ready(self, ready: bool, why: str = "") -> None:
        """`why`: what /readyz says (default "ok" when ready, "not ready" otherwise)."""
        self._why = why
        self._ready = ready
        self.ready_gauge.set(1 if ready else 0)

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    # -- read by the HTTP thread ----------------------------------------------------------------

    def liveness(self) -> tuple[bool, str]:
        age = time.monotonic() - self._last_beat
        if age > self.stall_s:
            return False, f"event loop unresponsive for {age:.0f} s (limit {self.stall_s:.0f} s)"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        return self._ready, self._why or ("ok" if self._ready else "not ready")

    def job_order_response(self) -> tuple[int, str, bytes]:
        if not self.serves_job_order:
            return 404, "text/plain", b"not found\n"
        body = self.job_order  # (one read: the loop replaces it whole)
        if body is None:
            return 503, "text/plain", f"no job order: {self.job_order_missing}\n".encode()
        return 200, "application/json", body


class MeteredLog:
    """An `EventLog` that counts what is appended through it into a `ProcessStatus`: events by
    type, append latency, the last appended position, and a cycle's duration (from the append
    of a CycleStarted to the append of the batch that ends with its CycleCompleted). Reads,
    claims and checks pass through unchanged."""

    def __init__(self, inner: EventLog, status: ProcessStatus) -> None:
        self.inner = inner
        self.status = status
        self._cycle_started: float | None = None

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        t0 = time.monotonic()
        positions = await self.inner.append(events)
        t1 = time.monotonic()
        if not events:
            return positions
        status = self.status
        status.append_seconds.observe(t1 - t0)
        status.position.set(positions[-1])
        by_type: dict[str, int] = {}  # one locked increment per type, not per event
        for env in events:
            by_type[env.type] = by_type.get(env.type, 0) + 1
        for kind in sorted(by_type):
            status.appended.labels(kind).inc(by_type[kind])
        last = events[-1].data
        if isinstance(events[0].data, p.CycleStarted) and len(events) == 1:
            self._cycle_started = t0
        elif isinstance(last, p.CycleCompleted) and self._cycle_started is not None:
            status.cycle_seconds.observe(t1 - self._cycle_started)
            self._cycle_started = None
        return positions

    def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        return self.inner.read(from_position, follow=follow)

    async def end_position(self) -> int:
        return await self.inner.end_position()

    async def claim_writer(self) -> None:
        await self.inner.claim_writer()

    async def check_writer(self) -> None:
        await self.inner.check_writer()

    async def close(self) -> None:
        await self.inner.close()


class BadAddress(SetupError):
    """``--http-bind-address`` is not HOST:PORT, or that address cannot be bound."""


def parse_bind_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (all interfaces) -> (host, port); port 0 picks a free one."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise BadAddress(f"--http-bind-address {text!r}: expected HOST:PORT or :PORT (e.g. :8080)")
    host = host.strip("[]")
    return host or "0.0.0.0", int(port_text)  # noqa: S104 - a probe port in a pod listens on all


class StatusServer:
    """Serves a `ProcessStatus` on HOST:PORT from a daemon thread until `close()`."""

    def __init__(self, status: ProcessStatus, address: str) -> None:
        host, port = parse_bind_address(address)
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/healthz": lambda: _probe(status.liveness()),
            "/livez": lambda: _probe(status.liveness()),
            "/readyz": lambda: _probe(status.readiness()),
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(status.registry)),
            "/get-job-order": status.job_order_response,
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                route = routes.get(self.path.split("?", 1)[0])
                code, ctype, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                log.debug("http: " + format, *args)

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise BadAddress(f"--http-bind-address {address!r}: {exc.strerror or exc}") from None
        self._server.daemon_threads = True
        bound = self._server.server_address
        self.host, self.port = str(bound[0]), int(bound[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="kai-es-http",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _probe(result: tuple[bool, str]) -> tuple[int, str, bytes]:
    ok, why = result
    return (200 if ok else 503), "text/plain; charset=utf-8", (why + "\n").encode()
