"""The pages of `kai-es serve` as HTML strings, from a `LiveView`, an explain report or a what-if
document. Pure: no I/O; the shell (`kai_es.serve`) serves what these return.

Contract:
- Every text that comes from a log or a report (names, messages, reasons) is HTML-escaped
  (`html.escape`, quotes included) where it is written, in element text and in attributes, so a
  pod named ``<script>`` is shown as that text and cannot add markup.
- Quantities stay integers until they are formatted for display (milli-GPU shown as GPUs with
  up to three decimals by integer arithmetic); the exact integer is also in each number cell's
  ``data-value`` attribute (what the browser tests compare with `kai-es explain -o json`).
- Each page is a whole document: `layout` wraps it with the navigation, the stylesheet and the
  live-refresh script (``/static/style.css``, ``/static/live.js``; nothing from another host),
  and its `<main id="live" data-position=N>` carries the count of records folded, which the
  script compares with ``/api/position`` to know when to fetch the page again.
- Bad query parameters are `BadQuery` (the shell answers 400 with `error_page`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Final
from urllib.parse import quote

from kai_es.events.registry import EVENT_TYPES
from kai_es.events.timefmt import format_duration, format_span, rfc3339
from kai_es.explain import RULES, render_text
from kai_es.visibility.brief import brief, unbalanced_brackets
from kai_es.visibility.live import LiveView, Point, QueueAtCut, tree_order
from kai_es.visibility.svg import line_chart

NAV = (("/", "queues"), ("/pending", "pending jobs"), ("/events", "decisions"), ("/whatif", "what-if"))
#: what the events page shows unless ?type= says otherwise: the scheduler's and binder's events
DECISIONS = ("kai.scheduler.*", "kai.binder.*")
MAX_LIMIT = 1000


class BadQuery(ValueError):
    """A query parameter the page cannot use (the message says which and why)."""


def e(value: object) -> str:
    return escape(str(value), quote=True)


# --- numbers --------------------------------------------------------------------------------


def fmt_milli(milli: int) -> str:
    """An integer in thousandths as a decimal (1500 -> "1.5", 2000 -> "2", -1 -> "none")."""
    if milli < 0:
        return "none"
    whole, frac = divmod(milli, 1000)
    return f"{whole}.{frac:03d}".rstrip("0").rstrip(".") if frac else str(whole)


def fmt_bytes(n: int) -> str:
    """Bytes as GiB with one decimal (rounded down), by integer arithmetic; -1 -> "none"."""
    if n < 0:
        return "none"
    tenths = n * 10 // 2**30
    return f"{tenths // 10}.{tenths % 10}Gi"


def fmt_amount(resource: str, value: int) -> str:
    return fmt_bytes(value) if resource == "memory" else fmt_milli(value)


def _cell(resource: str, field: str, value: int) -> str:
    return f'<td class="num" data-field="{resource}.{field}" data-value="{value}">{e(fmt_amount(resource, value))}</td>'


# --- layout ---------------------------------------------------------------------------------


def layout(title: str, body: str, *, position: int, status: str = "", poll_ms: int = 1000,
           source: str = "") -> str:
    """A whole page around `body` (see module docstring)."""
    nav = "".join(f'<a href="{href}">{e(label)}</a>' for href, label in NAV)
    banner = f'<p class="status">{e(status)}</p>' if status else ""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(title)} - kai-es serve</title>"
            '<link rel="stylesheet" href="/static/style.css"><script src="/static/live.js" defer></script>'
            f'</head><body><header><strong>kai-es</strong> <span class="source">{e(source)}</span> <nav>{nav}</nav>'
            f'</header><main id="live" data-position="{position}" data-poll-ms="{poll_ms}">{banner}'
            f"<h1>{e(title)}</h1>{body}</main></body></html>")


def error_page(status: int, message: str) -> str:
    """A page for a request that cannot be answered (400, 404, 405, 500): the message, no more."""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<title>{status}</title><link rel="stylesheet" href="/static/style.css"></head><body>'
            f'<main><h1>{status}</h1><p class="error">{e(message)}</p><p><a href="/">queues</a></p></main></body></html>')


def _when(view: LiveView, ns: int) -> str:
    return f"t+{format_duration(max(0, ns - view.first_ns))}"


def _summary(view: LiveView) -> str:
    cut = view.last_cut
    at = (f"last completed cycle {cut.cycle} (cut at position {cut.position}, {_when(view, cut.time_ns)})"
          if cut else "no completed cycle yet")
    return (f'<p class="summary">{view.fed} records folded (log time {e(rfc3339(view.last_ns)) if view.fed else "-"}); '
            f"{e(at)}. GPUs in GPUs, CPU in cores, memory in GiB.</p>")


# --- queues ---------------------------------------------------------------------------------


def queues_page(view: LiveView) -> str:
    """The queue tree at the last completed cycle's cut, with the cluster's GPU allocation over time."""
    cut = view.last_cut
    body = [_summary(view)]
    points = view.history.all()
    if cut is not None:
        roots = [name for name, depth in tree_order({n: q.parent for n, q in cut.queues.items()}) if depth == 0]
        series = [(label, css, [(pt.time_ns - view.first_ns, sum((pt.of(r, "gpu") or (0, 0, 0))[k] for r in roots))
                                for pt in points])
                  for label, css, k in (("allocated (root queues)", "allocated", 0),
                                        ("fair share (root queues)", "fairshare", 1))]
        body.append(line_chart(series, title="GPU allocated and fair share of the root queues over time",
                               y_label=lambda v: f"{fmt_milli(v)} GPU", x_label=_span_label))
    body.append(_queue_table(cut.queues if cut else {}))
    return "".join(body)


def _span_label(ns: int) -> str:
    return f"t+{format_duration(ns)}"


def _queue_table(queues: Mapping[str, QueueAtCut]) -> str:
    head = ("<table class=\"queues\"><thead><tr><th>queue</th><th>GPU quota</th><th>limit</th><th>fair share</th>"
            "<th>allocated</th><th>request</th><th>pending</th><th>pods waiting</th><th>jobs waiting</th>"
            "<th>CPU fair share</th><th>CPU allocated</th><th>memory fair share</th><th>memory allocated</th>"
            "</tr></thead><tbody>")
    rows = []
    for name, depth in tree_order({n: q.parent for n, q in queues.items()}):
        q = queues[name]
        g, c, m = q.resources["gpu"], q.resources["cpu"], q.resources["memory"]
        over = " over" if g.allocated > g.fair_share else ""
        rows.append(
            f'<tr data-queue="{e(name)}" class="depth{min(depth, 9)}{over}">'
            f'<td class="name"><a href="/queue?name={e(quote(name, safe=""))}">{e(name)}</a></td>'
            + _cell("gpu", "quota", g.quota) + _cell("gpu", "limit", g.limit) + _cell("gpu", "fairShare", g.fair_share)
            + _cell("gpu", "allocated", g.allocated) + _cell("gpu", "request", g.request)
            + _cell("gpu", "pending", g.pending)
            + f'<td class="num" data-field="pendingPods">{q.pending_pods}</td>'
            + f'<td class="num" data-field="pendingJobs">{q.pending_jobs}</td>'
            + _cell("cpu", "fairShare", c.fair_share) + _cell("cpu", "allocated", c.allocated)
            + _cell("memory", "fairShare", m.fair_share) + _cell("memory", "allocated", m.allocated) + "</tr>")
    if not rows:
        rows.append('<tr><td colspan="13">no queue at a completed cycle yet</td></tr>')
    return head + "".join(rows) + "</tbody></table>"


def _queue_chart(view: LiveView, points: Sequence[Point], name: str, resource: str) -> str:
    """`name`'s allocation, fair share and quota of `resource` over the history (an unlimited
    quota, -1, is left out of the chart: it has no height)."""
    sampled = [(pt.time_ns - view.first_ns, numbers) for pt in points if (numbers := pt.of(name, resource))]
    series = [(label, css, [(t, n[k]) for t, n in sampled if n[k] >= 0])
              for label, css, k in (("allocated", "allocated", 0), ("fair share", "fairshare", 1), ("quota", "quota", 2))]
    if sampled and not series[2][2]:
        series[2] = ("quota: unlimited", "quota", [])
    unit, title = UNITS[resource]
    return line_chart(series, title=f"{title} of queue {name} over time",
                      y_label=lambda v: f"{fmt_amount(resource, v)}{unit}", x_label=_span_label)


#: resource -> (what its chart's axis adds to a formatted amount, what its title calls it)
UNITS: Final = {"gpu": (" GPU", "GPU"), "cpu": (" cores", "CPU"), "memory": ("", "Memory")}  # (memory: "1.5Gi")


def queue_page(view: LiveView, name: str) -> str:
    """One queue: its numbers per resource at the last cut, its history per resource (GPU, CPU,
    memory), its waiting jobs."""
    cut = view.last_cut
    if not name:
        raise BadQuery("name the queue: /queue?name=QUEUE")
    q = cut.queues.get(name) if cut else None
    if q is None:
        raise KeyError(f"no queue named {name!r} at the last completed cycle")
    rows = "".join(
        f'<tr data-resource="{r}"><th>{r}</th>' + _cell(r, "quota", n.quota) + _cell(r, "limit", n.limit)
        + _cell(r, "fairShare", n.fair_share) + _cell(r, "allocated", n.allocated) + _cell(r, "request", n.request)
        + _cell(r, "pending", n.pending) + "</tr>"
        for r, n in q.resources.items())
    parent = f' (parent <a href="/queue?name={e(quote(q.parent, safe=""))}">{e(q.parent)}</a>)' if q.parent else ""
    points = view.history.all()
    chart = "".join(_queue_chart(view, points, name, resource) for resource in ("gpu", "cpu", "memory"))
    return (_summary(view) + f"<p>queue {e(name)}{parent}: {q.pending_pods} pod(s) of {q.pending_jobs} job(s) waiting</p>"
            '<table class="numbers"><thead><tr><th></th><th>quota</th><th>limit</th><th>fair share</th>'
            f"<th>allocated</th><th>request</th><th>pending</th></tr></thead><tbody>{rows}</tbody></table>"
            + chart + "<h2>waiting jobs, in the order a cycle takes them</h2>" + _waiting_table(view, name))


# --- pending jobs ---------------------------------------------------------------------------


def pending_page(view: LiveView) -> str:
    """Every leaf queue's waiting jobs now, with their positions and the rule that holds each."""
    queues = view.queues_waiting()
    if not queues:
        return _summary(view) + "<p>no job is waiting</p>"
    return _summary(view) + "".join(
        f'<h2><a href="/queue?name={e(quote(q, safe=""))}">{e(q)}</a></h2>' + _waiting_table(view, q) for q in queues)


def _waiting_table(view: LiveView, queue: str) -> str:
    waiting = view.waiting(queue)
    if not waiting:
        return "<p>no job waits in this queue</p>"
    rows = []
    for w in waiting:
        reason = w["reasons"][0] if w["reasons"] else None
        why = (f'<span class="rule">{e(RULES.get(w["rule"], w["rule"]))}</span>: '
               f'<code>{e(reason["code"])}</code> {e(reason["message"])}' if reason else "no verdict recorded yet")
        since = format_span(max(0, view.last_ns - w["since"])) if w["since"] else "-"
        cluster = f'#{w["inCluster"]} of {w["clusterOf"]}' if w.get("inCluster") else "-"
        rows.append(f'<tr data-job="{e(w["job"])}"><td class="num" data-field="position">#{w["position"]} of {w["of"]}</td>'
                    f'<td class="num" data-field="cluster">{cluster}</td>'
                    f'<td><a href="/job?name={e(quote(w["job"], safe="/"))}">{e(w["job"])}</a></td>'
                    f'<td class="num">{len(w["pods"])}</td>'
                    f'<td class="num" data-field="gpu.requested" data-value="{w["gpuRequested"]}">{e(fmt_milli(w["gpuRequested"]))}</td>'
                    f'<td class="num">{w["priority"]}</td><td class="num">{e(since)}</td>'
                    f'<td data-field="rule" data-value="{e(w["rule"])}">{why}</td></tr>')
    return ('<table class="waiting"><thead><tr><th>position</th><th>in the cluster</th><th>job</th><th>pods</th><th>GPU</th>'
            "<th>priority</th><th>waiting</th><th>held by</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


# --- one job ----------------------------------------------------------------------------------


def job_page(report: dict[str, Any]) -> str:
    """A pod's or job's timeline: the lines `kai-es explain LOG NS/NAME` prints, one per entry."""
    lines = render_text(report)
    items = "".join(f"<li>{e(line)}</li>" for line in lines[1:])
    return f'<p class="subject">{e(lines[0])}</p><ol class="timeline">{items}</ol>'


# --- decision stream --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What the decision-stream page shows: globs on type and subject (as `kai-es events`), at
    most `limit` of the newest matches before position `before` (None: the newest)."""

    #: a glob; "" for the decisions (`DECISIONS`)
    type: str = ""
    subject: str = ""
    limit: int = 200
    before: int | None = None

    @classmethod
    def parse(cls, query: Mapping[str, Sequence[str]]) -> EventFilter:
        """From a parsed query string; BadQuery for an unknown parameter or a bad value."""
        unknown = sorted(set(query) - {"type", "subject", "limit", "before"})
        if unknown:
            raise BadQuery(f"unknown parameter {unknown[0]!r} (the decision stream takes type, subject, limit, before)")
        one = {k: v[-1] for k, v in query.items() if v}
        kind = one.get("type", "").strip()
        subject = one.get("subject", "").strip()
        for option, pattern in (("type", kind), ("subject", subject)):
            if unbalanced_brackets(pattern):
                raise BadQuery(f"{option}={pattern!r}: a '[' without its ']'")
        if kind and not any(fnmatch.fnmatchcase(t, kind) for t in EVENT_TYPES):
            raise BadQuery(f"type={kind!r} matches no event type (they are named like kai.cluster.pod.observed "
                           "or kai.scheduler.*)")
        limit = _int(one, "limit", 1, MAX_LIMIT)
        before = _int(one, "before", 0, None)
        return cls(kind, subject, 200 if limit is None else limit, before)

    def matches(self, kind: str, subject: str) -> bool:
        types = (self.type,) if self.type else DECISIONS
        return (any(fnmatch.fnmatchcase(kind, t) for t in types)
                and (not self.subject or fnmatch.fnmatchcase(subject, self.subject)))

    @property
    def type_label(self) -> str:
        return self.type or "decisions (" + ", ".join(DECISIONS) + ")"


def _int(query: Mapping[str, str], name: str, lo: int, hi: int | None) -> int | None:
    """The whole number parameter `name` (None when absent or empty)."""
    text = query.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or (hi is not None and not lo <= int(text) <= hi) or int(text) < lo:
        bound = f"{lo}..{hi}" if hi is not None else f"{lo} or more"
        raise BadQuery(f"{name}={text!r}: expected a whole number, {bound}")
    return int(text)


def events_page(view: LiveView, f: EventFilter) -> str:
    """The newest events matching `f` among the last records folded, newest first."""
    rows = []
    oldest = None
    for pos, ns, kind, subject, data in reversed(view.recent):
        if f.before is not None and pos >= f.before:
            continue
        if not f.matches(kind, subject):
            continue
        rows.append(f'<tr data-position="{pos}"><td class="num">{pos}</td><td>{e(_when(view, ns))}</td>'
                    f"<td>{e(kind)}</td><td>{e(subject)}</td><td>{e(brief(data))}</td></tr>")
        oldest = pos
        if len(rows) >= f.limit:
            break
    window = (f"the last {len(view.recent)} records folded (positions {view.recent[0][0]}..{view.recent[-1][0]})"
              if view.recent else "no record yet")
    form = ('<form method="get" action="/events" class="filter">'
            f'<label>type <input name="type" value="{e(f.type)}" placeholder="kai.scheduler.*"></label> '
            f'<label>subject <input name="subject" value="{e(f.subject)}" placeholder="pod/default/train-*"></label> '
            f'<label>limit <input name="limit" value="{f.limit}" size="5"></label> <button>filter</button></form>')
    more = ""
    if oldest is not None and len(rows) >= f.limit:
        more = (f'<p><a href="/events?type={e(quote(f.type))}&amp;subject={e(quote(f.subject))}&amp;limit={f.limit}'
                f'&amp;before={oldest}">older</a></p>')
    table = ('<table class="events"><thead><tr><th>position</th><th>time</th><th>type</th><th>subject</th><th></th></tr>'
             "</thead><tbody>" + "".join(rows) + "</tbody></table>") if rows else "<p>no event matches</p>"
    return (form + f"<p>{len(rows)} event(s) of type {e(f.type_label)}" + (f", subject {e(f.subject)}" if f.subject else "")
            + f", newest first, among {e(window)} (older ones: <code>kai-es events LOG</code>).</p>" + table + more)


# --- what-if ------------------------------------------------------------------------------------


def whatif_page(doc: dict[str, Any] | None, images: Sequence[str], where: str) -> str:
    """The comparison `kai-es whatif` wrote (whatif.json), with its plots when they are there."""
    if doc is None:
        return ("<p>no what-if output was given: start <code>kai-es serve LOG --whatif DIR</code> with the report "
                "directory of a <code>kai-es whatif</code> run (its whatif.json).</p>")
    ref = doc.get("comparedWith", "recorded")
    runs = doc["runs"]
    label = "re-run" if ref == "rerun" else "recorded"
    verdict = "identical decisions" if doc.get("identicalDecisions") else "decisions differ"
    out = [f"<p>from {e(where)}: {e('; '.join(doc.get('changes') or []) or 'no changes')} "
           f'(<span class="verdict">{e(verdict)}</span>; compared with the {e(label)} run)</p>']
    names = {n: q.get("parent") or "" for n, q in doc["queues"].items()}
    rows = []
    for name, depth in tree_order(names):
        q = doc["queues"][name]
        a, b = q[ref], q["counterfactual"]
        rows.append(f'<tr data-queue="{e(name)}" class="depth{min(depth, 9)}"><td class="name">{e(name or "(none)")}</td>'
                    + "".join(f"<td class=\"num\">{e(_span(a[k]))} &rarr; {e(_span(b[k]))}</td>"
                              for k in ("waitP50Ns", "waitP95Ns", "waitMaxNs"))
                    + f'<td class="num">{a["pendingAtEnd"]} &rarr; {b["pendingAtEnd"]}</td>'
                    f'<td class="num">{e(_gpu_hours(a["gpuMilliNs"]))} &rarr; {e(_gpu_hours(b["gpuMilliNs"]))}</td></tr>')
    out.append(f"<h2>per queue: {e(label)} &rarr; counterfactual</h2>"
               '<table class="whatif"><thead><tr><th>queue</th><th>wait p50</th><th>wait p95</th><th>wait max</th>'
               "<th>pending at end</th><th>GPU-hours</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    columns = [c for c in ("recorded", "rerun", "counterfactual") if c in runs]
    facts: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (("GPU utilisation", lambda r: f"{r['gpuUtilizationPermille'] // 10}.{r['gpuUtilizationPermille'] % 10}%"),
             ("pods scheduled", lambda r: str(r["podsScheduled"])), ("pending at end", lambda r: str(r["pendingAtEnd"])),
             ("evictions", lambda r: str(r["evictions"])), ("cycles", lambda r: str(r["cycles"])),
             ("decisions", lambda r: str(r["decisions"])),
             ("stranded GPU-hours", lambda r: _gpu_hours(r["strandedGpuMilliNs"])))
    out.append("<h2>cluster</h2><table class=\"runs\"><thead><tr><th></th>"
               + "".join(f"<th>{e('re-run' if c == 'rerun' else c)}</th>" for c in columns) + "</tr></thead><tbody>"
               + "".join(f"<tr><th>{e(row)}</th>" + "".join(f'<td class="num">{e(fn(runs[c]))}</td>' for c in columns)
                         + "</tr>" for row, fn in facts) + "</tbody></table>")
    jobs = doc.get("jobsChangedMost") or []
    if jobs:
        out.append("<h2>jobs whose wait changed most</h2><table class=\"jobs\"><thead><tr><th>job</th><th>queue</th>"
                   f"<th>{e(label)} wait</th><th>counterfactual wait</th><th>change</th></tr></thead><tbody>"
                   + "".join(f"<tr><td>{e(j['job'])}</td><td>{e(j['queue'])}</td><td class=\"num\">{e(_span(j[f'{ref}WaitNs']))}"
                             f"{' (never started)' if j.get(f'{ref}Censored') else ''}</td>"
                             f"<td class=\"num\">{e(_span(j['counterfactualWaitNs']))}"
                             f"{' (never started)' if j.get('counterfactualCensored') else ''}</td>"
                             f"<td class=\"num\">{'+' if j['deltaNs'] >= 0 else '-'}{e(format_span(abs(j['deltaNs'])))}</td></tr>"
                             for j in jobs) + "</tbody></table>")
    for image in images:
        out.append(f'<figure><img src="/whatif/{e(image)}" alt="{e(image)}"><figcaption>{e(image)}</figcaption></figure>')
    if doc.get("waitCounting"):
        out.append(f"<p>{e(str(doc['waitCounting']).capitalize())}.</p>")
    return "".join(out)


def _span(ns: int | None) -> str:
    return "-" if ns is None else format_span(ns)


def _gpu_hours(milli_ns: int) -> str:
    """milli-GPU nanoseconds as GPU-hours with one decimal (rounded down), in integers."""
    tenths = milli_ns * 10 // (1000 * 3600 * 10**9)
    return f"{tenths // 10}.{tenths % 10}"

