"""`kai-es serve` in a real browser: headless Chromium (the Debian package) driven by Playwright,
against a log `kai-es simulate` wrote from a scenario of tests/scenarios/. Each page's content is
checked against what the command line says for the same log (`kai-es explain`, `kai-es events`),
a page follows a log while a writer appends a simulation's records to it in bursts with pauses (it
shows the states in between, each as `explain` says it for the records so far, without a reload),
text from the log cannot run a script, and every page's screenshot is non-blank.

A browser that cannot start fails these tests: they never skip."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from tests.chromium import ChromiumDidNotStart, launch
from tests.live_writer import LiveWriter, appends_of, bursts_of, write_first

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "scenarios" / "hierarchy-quota-order.yaml"
HOSTILE = '<img src=x onerror="window.__pwned=1">'
#: the live writer's pause between bursts: five of the page's polls (`--poll 200`)
PAUSE_S = 1.0
GPU_FIELDS = ("quota", "limit", "fairShare", "allocated", "request", "pending")
#: what the page shows, read in one go (live.js swaps <main>'s children between two reads otherwise)
SNAPSHOT = """main => ({position: Number(main.dataset.position), rows: Array.from(
    main.querySelectorAll("table.queues tr[data-queue]"), r => [r.dataset.queue, Object.fromEntries(Array.from(
        r.querySelectorAll("td[data-field][data-value]"), c => [c.dataset.field, Number(c.dataset.value)]))])})"""


def _kai_es(*args: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-m", "kai_es", *args], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    return run


class Served:
    """A `kai-es serve` process and the address it listens on."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kai_es", "serve", *args, "--bind", "127.0.0.1:0",
                                      "--poll", "200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "http://" in line, line + (self.proc.stderr.read() if self.proc.stderr else "")
        self.url = line.split("http://", 1)[1].split()[0].rstrip("/")
        self.url = "http://" + self.url

    def stop(self) -> None:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)  # (closes the pipes)
        assert self.proc.returncode == 0, err  # SIGTERM is a normal end, no traceback


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        try:
            b = launch(pw)
        except ChromiumDidNotStart as exc:  # reported, never skipped
            pytest.fail(str(exc))
        yield b
        b.close()


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("serve")
    path = out / "run.events.jsonl"
    _kai_es("simulate", str(SCENARIO), "--log", str(path), "--report", str(out / "report"), "--force")
    _kai_es("whatif", str(path), "--set", "queue.other.gpu.quota=8", "--report", str(out / "whatif"),
            "--log", str(out / "whatif.events.jsonl"), "--force")
    return path


@pytest.fixture(scope="module")
def server(log: Path) -> Iterator[Served]:
    s = Served(str(log), "--whatif", str(log.parent / "whatif"))
    yield s
    s.stop()


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    context.set_default_timeout(10_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, errors


def _screenshot(page: Any, path: Path) -> None:
    """Save the page's screenshot and check that it shows something (not one flat colour)."""
    from PIL import Image

    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    with Image.open(path) as img:
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert img.width >= 1200 and img.height >= 100
        assert colours is None or len(colours) > 20, f"{path.name}: a blank page ({len(colours)} colours)"


def _wait(condition: Any, timeout_s: float = 10.0) -> None:
    """Poll `condition` (page.wait_for_function would evaluate a string, which the pages' CSP
    forbids, as it should)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the page did not update in time"
        time.sleep(0.05)


async def _append(path: Path, envelopes: list[Any]) -> int:
    """Append to the log file as a writer would; the position of the first appended record."""
    log = FileEventLog(path)
    return (await log.append(envelopes))[0]


def _outside_the_browsers_loop(fn: Any) -> Any:
    """anyio.run(fn) in a thread (Playwright's sync API runs an event loop in this one)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(anyio.run(fn)))
    t.start()
    t.join(30)
    return out[0]


def _shown(page: Any) -> tuple[int, list[Any]]:
    """The position `page` was rendered at and its queue rows ([name, {field: value}])."""
    shot = page.locator("main#live").evaluate(SNAPSHOT)
    return shot["position"], shot["rows"]


def _explain_queue(log: Path, queue: str) -> dict[str, Any]:
    return json.loads(_kai_es("explain", str(log), "--queue", queue, "-o", "json").stdout)  # type: ignore[no-any-return]


def _assert_queue_tree(page: Any, log: Path) -> None:
    """The queue tree on `page` has the scenario's five queues, parents first, each with the GPU
    numbers `kai-es explain LOG --queue` gives for the log's last cycle."""
    rows = page.locator("table.queues tr[data-queue]")
    names = rows.evaluate_all("rows => rows.map(r => r.dataset.queue)")
    assert sorted(names) == ["dept-a", "dept-b", "other", "team-a1", "team-b1"]
    assert names.index("dept-a") < names.index("team-a1")  # a parent before its children
    for name in names:
        want = _explain_queue(log, name)["runs"][-1]["numbers"]["gpu"]
        row = page.locator(f'tr[data-queue="{name}"]')
        got = {f: int(row.locator(f'td[data-field="gpu.{f}"]').get_attribute("data-value"))
               for f in GPU_FIELDS}
        assert got == {f: want[f] for f in got}, name
        shown = row.locator('td[data-field="gpu.fairShare"]').inner_text()
        assert shown == (f"{want['fairShare'] // 1000}" if want["fairShare"] % 1000 == 0 else shown)


def test_the_queue_tree_shows_explains_numbers_for_the_last_cycle(server: Served, log: Path, page: Any) -> None:
    page.goto(server.url + "/")
    _assert_queue_tree(page, log)
    assert page.locator("svg.chart polyline").count() == 2
    _screenshot(page, log.parent / "queues.png")


def test_pending_jobs_have_explains_positions_and_reasons(server: Served, log: Path, page: Any) -> None:
    page.goto(server.url + "/pending")
    want = _explain_queue(log, "other")["pending"]
    assert want
    for w in want:
        row = page.locator(f'tr[data-job="{w["job"]}"]')
        assert row.locator('td[data-field="position"]').inner_text() == f"#{w['position']} of {w['of']}"
        assert row.locator('td[data-field="rule"]').get_attribute("data-value") == w["rule"]
        assert w["reasons"][0]["message"] in row.inner_text()
    _screenshot(page, log.parent / "pending.png")
    page.locator(f'tr[data-job="{want[0]["job"]}"] a').click()  # on to its timeline
    page.wait_for_url(lambda url: "/job?name=" in url)
    lines = _kai_es("explain", str(log), want[0]["job"]).stdout.splitlines()
    assert page.locator("p.subject").inner_text() == lines[0]
    assert [t.rstrip() for t in page.locator("ol.timeline li").all_inner_texts()] == [ln.rstrip() for ln in lines[1:]]
    _screenshot(page, log.parent / "job.png")


def test_a_queue_page_charts_its_history_and_lists_its_waiting_jobs(server: Served, log: Path, page: Any) -> None:
    page.goto(server.url + "/")
    page.locator('tr[data-queue="other"] a').click()
    page.wait_for_url(lambda url: url.endswith("/queue?name=other"))
    numbers = _explain_queue(log, "other")["runs"][-1]["numbers"]
    for resource in ("gpu", "cpu", "memory"):
        cell = page.locator(f'tr[data-resource="{resource}"] td[data-field="{resource}.allocated"]')
        assert int(cell.get_attribute("data-value")) == numbers[resource]["allocated"]
    titles = page.locator("svg.chart > title").evaluate_all("ts => ts.map(t => t.textContent)")
    assert titles == [f"{r} of queue other over time" for r in ("GPU", "CPU", "Memory")]
    assert page.locator("svg.chart polyline").count() == 9  # allocated, fair share, quota in each
    assert page.locator("table.waiting tr[data-job]").count() == len(_explain_queue(log, "other")["pending"])
    _screenshot(page, log.parent / "queue.png")


def test_the_decision_stream_filters_like_kai_es_events(server: Served, log: Path, page: Any) -> None:
    page.goto(server.url + "/events")
    page.fill('input[name="type"]', "kai.binder.*")
    page.click("form.filter button")
    page.wait_for_url(lambda url: "type=kai.binder." in url)
    want = _kai_es("events", str(log), "--type", "kai.binder.*").stdout.splitlines()
    positions = page.locator("table.events tr[data-position]").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.position))")
    assert positions == sorted((int(line.split()[0]) for line in want), reverse=True) and positions
    page.goto(server.url + "/events?limit=0")
    assert "limit='0'" in page.locator("p.error").inner_text()  # a 400 page, and the server goes on
    page.goto(server.url + "/events?subject=pod/default/a1-*")
    subjects = page.locator("table.events tr[data-position] td:nth-child(4)").all_inner_texts()
    assert subjects and all(s.startswith("pod/default/a1-") for s in subjects)
    _screenshot(page, log.parent / "events.png")


def test_the_whatif_page_shows_the_comparison_and_its_plots(server: Served, log: Path, page: Any) -> None:
    page.goto(server.url + "/whatif")
    doc = json.loads((log.parent / "whatif" / "whatif.json").read_text())
    rows = page.locator("table.whatif tr[data-queue]").evaluate_all("rows => rows.map(r => r.dataset.queue)")
    assert sorted(rows) == sorted(doc["queues"])
    assert "queue other gpu quota" in page.locator("main p").first.inner_text().replace(".", " ") or \
        doc["changes"][0] in page.locator("main p").first.inner_text()
    widths = page.locator("figure img").evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
    assert len(widths) == 2 and all(w > 0 for w in widths)
    _screenshot(page, log.parent / "whatif.png")


def test_a_page_follows_the_log_while_a_simulation_writes_it(tmp_path: Path, log: Path, page: Any) -> None:
    full = tmp_path / "simulated.events.jsonl"
    _kai_es("simulate", str(SCENARIO), "--log", str(full), "--report", str(tmp_path / "report"), "--force")
    appends = appends_of(full)
    bursts = bursts_of(appends)
    assert len(bursts) >= 3, [len(b) for b in bursts]
    live = tmp_path / "live.events.jsonl"
    live.write_bytes(b"")
    served = Served(str(live))
    try:
        page.goto(served.url + "/")
        assert page.locator("table.queues tr[data-queue]").count() == 0
        page.evaluate("window.__loadedOnce = true")
        writer = LiveWriter(live, bursts, pause_s=PAUSE_S)
        seen = writer.watch(lambda: _shown(page))  # what the page showed while the writer was appending
        end = writer.ends[-1]
        assert live.read_bytes() == full.read_bytes()  # the simulation's appends, replayed
        between = sorted(at for at in seen if 0 < at < end)
        assert len(between) >= 2, (f"the page showed positions {sorted(seen)} while the log grew through "
                                   f"{writer.ends}: it did not follow the log between the ends")
        checked = [at for at in writer.ends[:-1] if at in seen]
        for at in checked:  # the state at each burst's end, as explain says it for the records so far
            prefix = tmp_path / f"prefix-{at}.events.jsonl"
            _outside_the_browsers_loop(functools.partial(write_first, prefix, appends, at))
            runs = _explain_queue(prefix, "other")["runs"]
            rows = dict(seen[at])
            assert bool(rows) == bool(runs), (at, rows, runs)  # no queue shown before a completed cycle
            if runs:
                assert {f: rows["other"][f"gpu.{f}"] for f in GPU_FIELDS} == \
                    {f: runs[-1]["numbers"]["gpu"][f] for f in GPU_FIELDS}, at
        _wait(lambda: _shown(page)[0] == end)
        final = _shown(page)[1]
        assert any(seen[at] and seen[at] != final for at in checked), \
            "the page never showed a queue tree of the log in the middle of the simulation"
        assert page.evaluate("window.__loadedOnce") is True  # updated in place, not reloaded
        _assert_queue_tree(page, live)
        _screenshot(page, log.parent / "live.png")

        # more records, one of them with markup in its names: shown as text, never run
        page.goto(served.url + "/events?type=kai.cluster.pod.observed")
        page.evaluate("window.__loadedOnce = true")
        hostile = p.PodObserved(namespace="default", name=HOSTILE, uid="u-hostile", podgroup="pg-x", queue="other")
        end = _outside_the_browsers_loop(lambda: _append(live, [make_envelope(
            hostile, event_id="hostile", source="kai-es/test", subject=f"pod/default/{HOSTILE}", logicaltime=10**18)]))
        _wait(lambda: page.locator(f'tr[data-position="{end}"]').count() == 1)
        assert page.evaluate("window.__loadedOnce") is True
        assert page.locator(f'tr[data-position="{end}"] td:nth-child(4)').inner_text() == f"pod/default/{HOSTILE}"
        assert page.evaluate("window.__pwned") is None and page.locator("main img").count() == 0
    finally:
        served.stop()
