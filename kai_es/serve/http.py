"""The HTTP side of `kai-es serve`: routes to pages, GET and HEAD only.

Contract:
- Routes: ``/`` (queue tree), ``/queue?name=Q``, ``/pending``, ``/job?name=NS/NAME``,
  ``/events?type=&subject=&limit=&before=``, ``/whatif`` and its two plots, ``/static/*`` (the
  two committed assets), ``/api/position`` (records folded, as text: what live.js polls),
  ``/get-job-order`` (KAI's `reflectjoborder` JSON of the last cycle's tried order,
  `kai_es.visibility.job_order`; 404 when the log recorded none).
- GET and HEAD are the only methods with a handler; POST, PUT, DELETE, PATCH and OPTIONS get
  405 (others http.server's 501). Nothing here writes the log: it is only read, through the
  `LiveView` a `Follower` fills and, for a job's timeline, through `records_at` (the records of
  its event entries) or `job_records()`.
- A bad query parameter is a 400 page, an unknown subject or path a 404 page, a failure while
  rendering a 500 page with one line; the server keeps serving after each.
- Every response has a Content-Security-Policy allowing only this origin's script, style and
  images (so even markup that escaped escaping could not run a script of its own), and is not
  cached.
- A job's timeline is the one the view keeps while it folds (`LiveView.timeline`: the report
  `kai_es.explain.explain` makes over the records folded so far), its event entries made from
  their records, read by position with `records_at` (a file's index, Kafka's offsets; default:
  picked from `job_records()`).
  A subject the view keeps no timeline for (a pod that is not a job, a `pod/` or `job/` target, a
  name not in the log) is `explain` over `job_records()` (the log read from its start), kept
  per subject until the view has folded records it did not see.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import anyio

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import Record
from kai_es.explain import ExplainError, event_positions, explain, resolve
from kai_es.ports import EventLog, SetupError
from kai_es.serve.follow import Follower
from kai_es.visibility import pages
from kai_es.visibility.job_order import encoded
from kai_es.visibility.live import LiveView

log = logging.getLogger(__name__)

HTML = "text/html; charset=utf-8"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
STATIC = {"live.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
WHATIF_IMAGES = ("allocation.png", "waits.png")
JOB_CACHE = 16
#: positions at most this far apart are read in one pass for a job's timeline (records between
#: them decoded and dropped rather than the file's index looked up again)
READ_GAP = 256

Response = tuple[int, str, bytes]


class WhatifError(SetupError):
    """The --whatif path holds no readable what-if comparison."""


def whatif_file(path: str) -> Path:
    """The whatif.json of a `kai-es whatif` report directory, or the file itself; checked now."""
    p = Path(path)
    f = p / "whatif.json" if p.is_dir() else p
    read_whatif(f)
    return f


def read_whatif(f: Path) -> dict[str, Any]:
    try:
        doc = json.loads(f.read_text())
    except OSError as exc:
        raise WhatifError(f"--whatif {f}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise WhatifError(f"--whatif {f}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not {"runs", "queues"} <= set(doc):
        raise WhatifError(f"--whatif {f}: not a kai-es whatif comparison (whatif.json has runs and queues)")
    return doc


class Reader(Protocol):
    """What `records_at` needs of a log handle: reads from a position, and closing."""

    def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]: ...

    async def close(self) -> None: ...


def records_at(log: EventLog, reopen: Callable[[], Reader] | None = None
               ) -> Callable[[Sequence[int]], list[Record]] | None:
    """Reads of records by position for a job's timeline: of a file log, through a reader of its
    own (indexed now); of another log (Kafka), through `reopen()`'s handle, which reads from a
    position (Kafka seeks to the offset) in an event loop of the calling thread, closed after
    each call; None when neither applies (`Site` then picks them from `job_records()`). One
    read at a time; nearby positions (`READ_GAP`) in one pass."""
    if isinstance(log, FileEventLog):
        reader, reading = FileEventLog(log.path, readonly=True), threading.Lock()

        def read(positions: Sequence[int]) -> list[Record]:
            out: list[Record] = []
            with reading:
                for first, last, want in _windows(positions):  # (an older stretch is indexed per read)
                    out.extend(r for r in reader.scan(first, last + 1) if r.position in want)
            return out

        return read
    if reopen is None:
        return None
    handle, lock = reopen(), threading.Lock()

    async def collect(windows: list[tuple[int, int, set[int]]]) -> list[Record]:
        out: list[Record] = []
        try:
            for first, last, want in windows:
                stream = handle.read(first)
                try:
                    async for record in stream:
                        if record.position in want:
                            out.append(record)
                        if record.position >= last:
                            break
                finally:  # (a reader left half-read goes back to the log now, not at collection)
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()
        finally:
            await handle.close()
        return out

    def read_async(positions: Sequence[int]) -> list[Record]:
        windows = _windows(positions)
        if not windows:
            return []
        with lock:
            return anyio.run(collect, windows)

    return read_async


def _windows(positions: Sequence[int]) -> list[tuple[int, int, set[int]]]:
    """`positions` (any order, repeats) as (first, last, the positions) of runs at most
    `READ_GAP` apart, ascending: each run is one pass over the log."""
    wanted = sorted(set(positions))
    out: list[tuple[int, int, set[int]]] = []
    i = 0
    while i < len(wanted):
        j = i
        while j + 1 < len(wanted) and wanted[j + 1] - wanted[j] <= READ_GAP:
            j += 1
        out.append((wanted[i], wanted[j], set(wanted[i:j + 1])))
        i = j + 1
    return out


class Site:
    """What each route answers (no HTTP here: `handle` is called by the request handler)."""

    def __init__(self, view: LiveView, lock: threading.Lock, follower: Follower, *, source: str,
                 job_records: Callable[[], Iterable[Record]], whatif: Path | None = None,
                 poll_ms: int = 1000, records_at: Callable[[Sequence[int]], Iterable[Record]] | None = None) -> None:
        self.view = view
        self.lock = lock
        self.follower = follower
        self.source = source
        self.job_records = job_records
        self.records_at = records_at if records_at is not None else self._picked
        self.whatif = whatif
        self.poll_ms = poll_ms
        self._jobs: OrderedDict[str, tuple[int, dict[str, Any]]] = OrderedDict()
        self._jobs_lock = threading.Lock()
        self._static = {name: resources.files("kai_es.serve").joinpath("static", name).read_bytes()
                        for name in STATIC}

    def handle(self, target: str) -> Response:
        url = urlsplit(target)
        path = url.path
        try:
            query = parse_qs(url.query, keep_blank_values=True, strict_parsing=False, max_num_fields=20)
        except ValueError as exc:
            return self._error(400, f"the query string cannot be read: {exc}")
        try:
            return self._route(path, query)
        except pages.BadQuery as exc:
            return self._error(400, str(exc))
        except KeyError as exc:
            return self._error(404, str(exc.args[0]) if exc.args else "not found")
        except Exception as exc:  # noqa: BLE001 - one request fails, the server goes on
            log.exception("serving %s", path)
            return self._error(500, f"{path}: {type(exc).__name__}: {exc}")

    def _route(self, path: str, query: dict[str, list[str]]) -> Response:
        if path.startswith("/static/"):
            name = path.removeprefix("/static/")
            if name not in STATIC:
                raise KeyError(f"{path}: no such asset")
            return 200, STATIC[name], self._static[name]
        if path == "/api/position":
            _allow(query)
            with self.lock:
                return 200, "text/plain; charset=utf-8", f"{self.view.fed}\n".encode()
        if path == "/get-job-order":  # KAI's reflectjoborder endpoint, as the scheduler answers it
            _allow(query)
            with self.lock:
                body = encoded(self.view.state)
            if body is None:
                raise KeyError("no job order: no cycle of the log recorded one (policy kai-es/v13 on)")
            return 200, "application/json", body
        if path.startswith("/whatif/"):
            name = path.removeprefix("/whatif/")
            if self.whatif is None or name not in WHATIF_IMAGES or not (self.whatif.parent / name).is_file():
                raise KeyError(f"{path}: no such what-if plot")
            return 200, "image/png", (self.whatif.parent / name).read_bytes()
        if path == "/":
            _allow(query)
            return self._page("queues", pages.queues_page)
        if path == "/queue":
            name = _one(query, "name", required=True)
            return self._page(f"queue {name}", lambda v: pages.queue_page(v, name))
        if path == "/pending":
            _allow(query)
            return self._page("pending jobs", pages.pending_page)
        if path == "/events":
            f = pages.EventFilter.parse(query)
            return self._page("decisions", lambda v: pages.events_page(v, f))
        if path == "/job":
            name = _one(query, "name", required=True)
            report = self._job(name)
            return self._page(f"timeline of {name}", lambda v: pages.job_page(report))
        if path == "/whatif":
            _allow(query)
            doc = read_whatif(self.whatif) if self.whatif is not None else None
            images = [n for n in WHATIF_IMAGES if self.whatif is not None and (self.whatif.parent / n).is_file()]
            where = str(self.whatif) if self.whatif is not None else ""
            return self._page("what-if", lambda v: pages.whatif_page(doc, images, where))
        raise KeyError(f"{path}: no such page")

    def _page(self, title: str, render: Callable[[LiveView], str]) -> Response:
        with self.lock:
            body = render(self.view)
            position = self.view.fed
        html = pages.layout(title, body, position=position, status=self.follower.status(), poll_ms=self.poll_ms,
                            source=self.source)
        return 200, HTML, html.encode()

    def _job(self, name: str) -> dict[str, Any]:
        with self.lock:
            fed = self.view.fed
            kept = self.view.timeline(name)
        if kept is not None:
            positions = event_positions(kept)
            found = {record.position: record for record in self.records_at(positions)}
            gone = sorted(set(positions) - set(found))
            if gone:  # (a Kafka topic's retention, a log cut short since it was folded)
                raise KeyError(f"job {name}: the log no longer holds its records at positions "
                               f"{', '.join(map(str, gone[:5]))}{' ...' if len(gone) > 5 else ''}")
            return resolve(kept, found)
        with self._jobs_lock:
            cached = self._jobs.get(name)
        if cached is not None and cached[0] >= fed:
            return cached[1]
        read = 0

        def counted() -> Iterable[Record]:
            nonlocal read
            for record in self.job_records():
                read += 1
                yield record

        try:
            report = explain(counted(), name)
        except ExplainError as exc:
            raise KeyError(str(exc)) from None
        with self._jobs_lock:
            self._jobs[name] = (read, report)
            self._jobs.move_to_end(name)
            while len(self._jobs) > JOB_CACHE:
                self._jobs.popitem(last=False)
        return report

    def _picked(self, positions: Sequence[int]) -> Iterable[Record]:
        """The records at `positions` (ascending), picked from `job_records()` (a log without
        reads by position: read from its start to the last of them, decoded, not folded)."""
        if not positions:
            return
        wanted = set(positions)
        last = max(positions)
        for record in self.job_records():
            if record.position in wanted:
                yield record
            if record.position >= last:
                return

    def _error(self, status: int, message: str) -> Response:
        return status, HTML, pages.error_page(status, message).encode()


def _allow(query: dict[str, list[str]], *names: str) -> None:
    unknown = sorted(set(query) - set(names))
    if unknown:
        raise pages.BadQuery(f"unknown parameter {unknown[0]!r}" + (f" (this page takes {', '.join(names)})"
                                                                    if names else " (this page takes none)"))


def _one(query: dict[str, list[str]], name: str, *, required: bool = False) -> str:
    _allow(query, name)
    value = (query.get(name) or [""])[-1].strip()
    if required and not value:
        raise pages.BadQuery(f"give ?{name}=...")
    return value


class ViewServer:
    """Serves a `Site` on (host, port) with http.server's ThreadingHTTPServer."""

    def __init__(self, site: Site, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            server_version = "kai-es-serve"
            sys_version = ""

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._answer(body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(body=False)

            def _refuse(self) -> None:
                body = pages.error_page(405, f"{self.command}: kai-es serve is read-only (GET and HEAD only)").encode()
                self._send(405, HTML, body, True, allow=True)

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815

            def _answer(self, body: bool) -> None:
                status, ctype, data = site.handle(self.path)
                self._send(status, ctype, data, body)

            def _send(self, status: int, ctype: str, data: bytes, body: bool, allow: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Referrer-Policy", "no-referrer")
                self.send_header("Content-Security-Policy", CSP)
                if allow:
                    self.send_header("Allow", "GET, HEAD")
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                log.debug("http: " + format, *args)

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family

        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        bound = self._server.server_address
        self.host, self.port = str(bound[0]), int(bound[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
