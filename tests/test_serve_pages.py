"""`kai-es serve` without a browser: the pure fold and pages (`kai_es.visibility.live`, `pages`,
`svg`), the address rule, the read-only HTTP surface, the follower's incremental fold, and the
command's one-line errors. The browser tests are tests/test_serve_browser.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.explain import explain_queue
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from kai_es.serve.bind import BindRefused, serve_address
from kai_es.serve.follow import Follower
from kai_es.serve.http import Site, ViewServer
from kai_es.visibility import pages
from kai_es.visibility.live import Cut, History, LiveView, Numbers, Point, QueueAtCut, point_of, tree_order
from kai_es.visibility.svg import line_chart

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "scenarios" / "hierarchy-quota-order.yaml"
HOSTILE = '<img src=x onerror="document.title=1">'


def _records(scenario: Path = SCENARIO) -> list[Record]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario(str(scenario)), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return _records()


def _view(records: list[Record]) -> LiveView:
    view = LiveView()
    for record in records:
        view.feed(record)
    return view


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)


def _parse(html: str) -> _Tags:
    t = _Tags()
    t.feed(html)
    return t


def test_every_queues_numbers_at_the_last_cut_equal_explain_queue(records: list[Record]) -> None:
    view = _view(records)
    assert view.last_cut is not None and len(view.last_cut.queues) == 5
    for name, q in view.last_cut.queues.items():
        last = explain_queue(records, name)["runs"][-1]["numbers"]
        for resource, n in q.resources.items():
            want = last[resource]
            assert (n.quota, n.limit, n.fair_share, n.allocated, n.request, n.pending) == (
                want["quota"], want["limit"], want["fairShare"], want["allocated"], want["request"], want["pending"]), name
    html = pages.queues_page(view)
    some = next(iter(view.last_cut.queues.values()))
    assert f'data-field="gpu.fairShare" data-value="{some.resources["gpu"].fair_share}"' in html


def test_the_waiting_jobs_are_explain_queues_with_position_and_rule(records: list[Record]) -> None:
    view = _view(records)
    queue = view.queues_waiting()[0]
    want = explain_queue(records, queue)["pending"]
    assert view.waiting(queue) == want and want
    html = pages.pending_page(view)
    assert f'#{want[0]["position"]} of {want[0]["of"]}' in html and f'data-value="{want[0]["rule"]}"' in html
    assert want[0]["inCluster"] and f'data-field="cluster">#{want[0]["inCluster"]} of {want[0]["clusterOf"]}<' in html


def test_text_from_the_log_cannot_add_markup(records: list[Record]) -> None:
    view = _view(records)
    hostile = p.PodObserved(namespace="default", name=HOSTILE, uid="u-hostile", podgroup=HOSTILE, queue=HOSTILE)
    env = make_envelope(hostile, event_id="hostile", source="kai-es/test", subject=f"pod/default/{HOSTILE}",
                        logicaltime=view.last_ns)
    view.feed(Record(view.position, env))
    reject = p.ObjectRejected(kind="Pod", namespace="default", name="x", path="spec", reason=f"</td>{HOSTILE}")
    view.feed(Record(view.position, make_envelope(reject, event_id="r", source="kai-es/test", subject="pod/default/x",
                                                  logicaltime=view.last_ns)))
    for html in (pages.events_page(view, pages.EventFilter(type="kai.cluster.*")), pages.pending_page(view),
                 pages.layout(HOSTILE, "", position=1, status=HOSTILE, source=HOSTILE),
                 pages.error_page(400, HOSTILE)):
        parsed = _parse(html)
        assert "img" not in parsed.tags
        assert all(name != "onerror" for name, _ in parsed.attrs)
    events = pages.events_page(view, pages.EventFilter(type="kai.cluster.*"))
    assert "&lt;img src=x onerror=&quot;document.title=1&quot;&gt;" in events


def test_a_job_page_is_explains_text() -> None:
    report = {"subject": {"kind": "pod", "namespace": "default", "name": HOSTILE, "pods": [f"default/{HOSTILE}"],
                          "queues": []},
              "log": {"from": 0, "until": 0},
              "timeline": [{"kind": "removed", "pod": f"default/{HOSTILE}", "position": 3, "logicaltime": 0}]}
    html = pages.job_page(report)
    assert "img" not in _parse(html).tags and "removed" in html


def test_numbers_are_formatted_from_integers() -> None:
    assert [pages.fmt_milli(v) for v in (0, 1, 1500, 2000, 12345, -1)] == ["0", "0.001", "1.5", "2", "12.345", "none"]
    assert pages.fmt_bytes(3 * 2**30 + 2**29) == "3.5Gi" and pages.fmt_bytes(-1) == "none"


@pytest.mark.parametrize(("query", "message"), [
    ({"limit": ["0"]}, "limit='0'"), ({"limit": ["ten"]}, "limit='ten'"), ({"limit": ["5000"]}, "1..1000"),
    ({"type": ["kai.sched[uler"]}, "without its ']'"), ({"type": ["nope.*"]}, "matches no event type"),
    ({"before": ["-3"]}, "before='-3'"), ({"colour": ["red"]}, "unknown parameter 'colour'")])
def test_a_bad_event_filter_says_which_parameter(query: dict[str, list[str]], message: str) -> None:
    with pytest.raises(pages.BadQuery, match=None) as info:
        pages.EventFilter.parse(query)
    assert message in str(info.value)


def test_the_event_filter_matches_like_kai_es_events(records: list[Record]) -> None:
    view = _view(records)
    f = pages.EventFilter.parse({"type": ["kai.binder.*"], "limit": ["2"]})
    html = pages.events_page(view, f)
    binder = [r.position for r in records if r.envelope.type.startswith("kai.binder.")]
    assert html.count("<tr data-position=") == 2 and f'data-position="{binder[-1]}"' in html
    assert "kai.cluster." not in html.split("<tbody>", 1)[1]
    older = pages.events_page(view, pages.EventFilter(type="kai.binder.*", before=binder[-1]))
    assert f'data-position="{binder[-1]}"' not in older and f'data-position="{binder[-2]}"' in older


def test_the_history_is_bounded_and_evenly_spaced_over_the_whole_log() -> None:
    h = History(limit=16)
    for cycle in range(1000):
        h.add(Point(cycle, cycle, {}))
    points = h.all()
    assert len(points) <= 17
    kept = [pt.cycle for pt in h.points]
    assert kept[0] == 0 and len({b - a for a, b in zip(kept, kept[1:])}) == 1  # from the start, even
    assert points[-1].cycle == 999  # the newest cut is always shown


def test_the_history_keeps_each_queues_resources_at_every_cut(records: list[Record]) -> None:
    view = LiveView()
    cuts = 0
    for record in records:
        view.feed(record)
        if isinstance(record.envelope.data, p.CycleCompleted) and view.last_cut is not None:
            cut, point = view.last_cut, view.history.newest()
            assert point is not None and point.cycle == cut.cycle
            for name, q in cut.queues.items():
                for resource, n in q.resources.items():
                    assert point.of(name, resource) == (n.allocated, n.fair_share, n.quota), (cut.cycle, name, resource)
            assert point.of("no-such-queue", "gpu") is None
            cuts += 1
    assert cuts >= 3
    kept = view.history.all()
    assert all(a.rows is b.rows for a, b in zip(kept, kept[1:])), "the same queues share one row map"
    name = "other"
    html = pages.queue_page(view, name)
    for title in ("GPU", "CPU", "Memory"):
        assert f"<title>{title} of queue {name} over time</title>" in html
    assert view.last_cut is not None
    cpu = view.last_cut.queues[name].resources["cpu"]
    assert cpu.quota < 0 and "quota: unlimited" in html  # an unlimited quota is said, not drawn at 0


def test_a_history_sample_keeps_numbers_beyond_64_bits_exactly() -> None:
    big = Numbers(quota=2**128, limit=-1, fair_share=2**70 + 1, allocated=3, request=0, pending=0)
    small = Numbers(quota=-1, limit=-1, fair_share=0, allocated=0, request=0, pending=0)
    queues = {"a": QueueAtCut("a", "", {"gpu": big, "cpu": small, "memory": small}, 0, 0),
              "b": QueueAtCut("b", "a", {"gpu": small, "cpu": big, "memory": big}, 0, 0)}
    point = point_of(Cut(1, 10, 2**64 + 5, queues), {})
    assert point.of("a", "gpu") == (3, 2**70 + 1, 2**128) and point.of("b", "memory") == (3, 2**70 + 1, 2**128)
    assert point.of("b", "gpu") == (0, 0, -1) and point.time_ns == 2**64 + 5
    again = point_of(Cut(2, 11, 0, queues), point.rows)
    assert again.rows is point.rows  # (the same queues: the row map is shared)
    fewer = point_of(Cut(3, 12, 0, {"b": queues["b"]}), point.rows)
    assert dict(fewer.rows) == {"b": 0} and fewer.of("a", "gpu") is None and fewer.of("b", "cpu") == (3, 2**70 + 1, 2**128)


def test_a_chart_keeps_spikes_and_its_size_does_not_grow_with_the_series() -> None:
    series = [(i, 5 if i != 7777 else 900) for i in range(100_000)]
    svg = line_chart([("allocated", "allocated", series)], width=300, title=HOSTILE)
    points = svg.split('points="', 1)[1].split('"', 1)[0].split()
    assert len(points) <= 4 * 300
    assert min(int(pt.split(",")[1]) for pt in points) == 8  # the spike reaches the top
    assert "<img" not in svg
    assert "no cycle yet" in line_chart([("a", "a", [])])


def test_the_tree_puts_parents_first_and_survives_loops() -> None:
    assert tree_order({"b": "", "a1": "a", "a": "", "a0": "a"}) == [("a", 0), ("a0", 1), ("a1", 1), ("b", 0)]
    assert sorted(tree_order({"x": "y", "y": "x", "z": "gone"})) == [("x", 0), ("y", 0), ("z", 0)]


@pytest.mark.parametrize("text", ["127.0.0.1:8090", "localhost:0", "[::1]:0", "127.1.2.3:80"])
def test_loopback_addresses_are_served(text: str) -> None:
    serve_address(text, allow_remote=False)


@pytest.mark.parametrize("text", ["0.0.0.0:8090", "192.168.1.4:80", "example.com:80", "[::]:80"])
def test_other_addresses_need_allow_remote(text: str) -> None:
    with pytest.raises(BindRefused, match="--allow-remote"):
        serve_address(text, allow_remote=False)
    assert serve_address(text, allow_remote=True)[1] in (8090, 80)


@pytest.mark.parametrize("text", ["8090", ":8090", "host:99999", "host:port"])
def test_a_malformed_bind_is_refused(text: str) -> None:
    with pytest.raises(BindRefused, match="expected HOST:PORT"):
        serve_address(text, allow_remote=True)


def _write(path: Path, records: list[Record]) -> None:
    log = FileEventLog(path)
    anyio.run(lambda: log.append([r.envelope for r in records]))


def test_following_folds_each_record_once_as_the_log_grows(tmp_path: Path, records: list[Record]) -> None:
    path = tmp_path / "live.events.jsonl"
    half = len(records) // 2
    _write(path, records[:half])
    view = LiveView()
    fed: list[int] = []
    feed = view.feed

    def counting(record: Record) -> None:
        fed.append(record.position)
        feed(record)

    view.feed = counting  # type: ignore[method-assign]
    follower = Follower(FileEventLog(path, readonly=True), view, threading.Lock())
    follower.start()
    _until(lambda: view.fed == half)
    _write(path, records[half:])  # the log grows while it is followed
    _until(lambda: view.fed == len(records))
    assert fed == list(range(len(records)))  # each once, in order: nothing re-folded
    assert follower.status() == "" and view.last_cut == _view(records).last_cut


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_server_answers_get_and_head_only_and_never_writes_the_log(tmp_path: Path, records: list[Record]) -> None:
    path = tmp_path / "served.events.jsonl"
    _write(path, records)
    before = path.read_bytes()
    view, lock = LiveView(), threading.Lock()
    follower = Follower(FileEventLog(path, readonly=True), view, lock)
    follower.start()
    _until(lambda: view.fed == len(records))
    site = Site(view, lock, follower, source=str(path), job_records=lambda: FileEventLog(path, readonly=True).scan())
    server = ViewServer(site, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        def status(path_: str, method: str = "GET") -> int:
            req = urllib.request.Request(server.url.rstrip("/") + path_, method=method, data=b"x" if method in ("POST", "PUT") else None)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert status("/") == 200 and status("/", "HEAD") == 200
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            assert status("/", method) == 405
        assert status("/events?limit=abc") == 400 and status("/queue") == 400 and status("/queue?name=x&y=1") == 400
        assert status("/queue?name=nope") == 404 and status("/job?name=default/nope") == 404
        assert status("/static/../pyproject.toml") == 404 and status("/whatif/../../etc/passwd") == 404
        assert status("/job?name=a/b/c/d") == 404
        assert status("/") == 200  # still serving after the errors
        with urllib.request.urlopen(server.url + "api/position", timeout=10) as r:
            assert r.read().decode().strip() == str(len(records))
            csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
    finally:
        server.close()
    assert path.read_bytes() == before


def _kai_es(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_es", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.parametrize(("args", "message"), [
    (["--bind", "0.0.0.0:0"], "not a loopback address"),
    (["--bind", "nonsense"], "expected HOST:PORT"),
    (["--whatif", "/nonexistent/whatif"], "--whatif"),
])
def test_serve_refuses_bad_options_in_one_line(tmp_path: Path, records: list[Record], args: list[str],
                                               message: str) -> None:
    path = tmp_path / "x.events.jsonl"
    _write(path, records[:3])
    run = _kai_es("serve", str(path), *args)
    assert run.returncode == 2 and message in run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_serve_on_a_missing_or_corrupt_log_is_one_line(tmp_path: Path) -> None:
    run = _kai_es("serve", str(tmp_path / "missing.jsonl"), "--bind", "127.0.0.1:0")
    assert run.returncode == 2 and "no such log file" in run.stderr and run.stderr.count("\n") == 1, run.stderr
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text("not a log\nat all\n")
    run = _kai_es("serve", str(corrupt), "--bind", "127.0.0.1:0")
    assert run.returncode == 2 and run.stderr.startswith("error:") and run.stderr.count("\n") == 1, run.stderr
