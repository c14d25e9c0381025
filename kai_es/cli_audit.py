"""`kai-es explain`, `kai-es usage` and `kai-es events --follow`: answers for engineers debugging
a decision and for audit consumers, read from a log (file or `kafka://`). The computations are
`kai_es.explain` and `kai_es.usage` (pure over records); this module reads the log and renders.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kai_es.app import bulk_fold, open_log
from kai_es.cli_common import UserError, console, friendly, one_line, records_from, working
from kai_es.events import Record
from kai_es.events.timefmt import parse_duration, parse_rfc3339, rfc3339
from kai_es.explain import ExplainError, explain, explain_queue, render_queue_text, render_text
from kai_es.usage import GROUPINGS, hours, render_csv, usage


@click.command(name="explain")
@click.argument("log_url")
@click.argument("target", required=False)
@click.option("--queue", "queue", default=None, help="Explain a queue instead: its fair share, allocation "
              "and pending demand at every cycle.")
@click.option("--output", "-o", type=click.Choice(["json", "text"]), default="text")
@friendly
def explain_cmd(log_url: str, target: str | None, queue: str | None, output: str) -> None:
    """The life of a pod or job (TARGET: NS/NAME, pod/NS/NAME or job/NS/NAME) as a timeline:
    observed, every cycle that considered it with its verdict and numbers (unchanged verdicts
    collapsed), bound or pipelined, evicted by whom and why, finished."""
    if (target is None) == (queue is None):
        raise UserError("name a pod or job (NS/NAME) or give --queue NAME, not both or neither")
    log = open_log(log_url, readonly=True)
    try:
        with bulk_fold(), working(f"folding {log_url}"):
            if queue is not None:
                report = explain_queue(records_from(log, 0), queue)
                lines = render_queue_text(report)
            else:
                assert target is not None
                report = explain(records_from(log, 0), target)
                lines = render_text(report)
    except ExplainError as exc:
        raise UserError(f"{log_url}: {exc}") from None
    try:
        if output == "json":
            sys.stdout.write(json.dumps(report, sort_keys=True, indent=1) + "\n")
            return
        for line in lines:
            sys.stdout.write(one_line(line) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        _quiet_stdout()


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _when(option: str, text: str | None, start_ns: int) -> int | None:
    """An RFC 3339 time, or a duration after the log's first event (`2h`, `+2h`)."""
    if text is None:
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        pass
    try:
        return start_ns + parse_duration(text.lstrip("+"))
    except ValueError as exc:
        if "longer than" in str(exc):
            raise UserError(f"{option}: {exc}") from None
        raise UserError(f"{option}: {text!r} is neither an RFC 3339 time nor a duration after the "
                        "log's first event (e.g. 2h)") from None


@click.command(name="usage")
@click.argument("log_url")
@click.option("--by", type=click.Choice(GROUPINGS), default="queue", help="Group by queue, namespace or job.")
@click.option("--from", "from_text", default=None,
              help="Charge from this time: RFC 3339, or a duration after the log's first event (e.g. 2h).")
@click.option("--until", "until_text", default=None, help="Charge until this time (same forms as --from).")
@click.option("--output", "-o", type=click.Choice(["table", "csv", "json"]), default="table")
@friendly
def usage_cmd(log_url: str, by: str, from_text: str | None, until_text: str | None, output: str) -> None:
    """Exact GPU-hours (and over quota), CPU-hours and memory GiB-hours, from each pod's bind to
    its end; a pod still running counts until the log's last event."""
    log = open_log(log_url, readonly=True)
    records: Iterator[Record] = records_from(log, 0)
    head = next(records, None)
    if head is None:
        raise UserError(f"{log_url}: the log is empty")
    start = head.envelope.logicaltime
    lo, hi = _when("--from", from_text, start), _when("--until", until_text, start)
    if lo is not None and hi is not None and hi < lo:
        raise UserError(f"--until {until_text} is before --from {from_text}")
    with bulk_fold(), working(f"folding {log_url}"):
        report = usage(itertools.chain([head], records), by, lo, hi)
    if output == "json":
        sys.stdout.write(json.dumps(report.as_json(), sort_keys=True, indent=1) + "\n")
        return
    if output == "csv":
        sys.stdout.write(render_csv(report))
        return
    table = Table(title=Text(f"usage by {by}, {rfc3339(report.from_ns)} .. {rfc3339(report.until_ns)}"))
    for col in (by, "pods", "GPU-hours", "over quota", "CPU-hours", "memory GiB-hours"):
        table.add_column(col, justify="left" if col == by else "right")
    for r in report.sorted_rows():
        table.add_row(Text(r.path or r.name), str(r.pods), hours(r.gpu_milli_ns, 1000),
                      "-" if r.gpu_over_quota_milli_ns is None else hours(r.gpu_over_quota_milli_ns, 1000),
                      hours(r.cpu_milli_ns, 1000), hours(r.memory_byte_ns, 2**30))
    console.print(table)
    if report.still_running:
        console.print(f"{report.still_running} pod(s) still held capacity at the log's last event "
                      f"({escape(rfc3339(report.log_end_ns))}): charged up to it", highlight=False)


def follow_log(log: Any, from_position: int, show: Callable[[Record], bool], limit: int | None) -> None:
    """Read `log` from `from_position` and keep reading as records are appended, calling `show`
    on each (True: it was printed) until `limit` printed records, an interrupt (exit 0) or a
    closed stdout (exit 0: `| head` is not an error)."""
    async def run() -> None:
        shown = 0
        try:
            async for record in log.read(from_position, follow=True):
                if show(record):
                    shown += 1
                    if limit is not None and shown >= limit:
                        return
        finally:
            await log.close()

    try:
        anyio.run(run)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        _quiet_stdout()


#: the commands this module adds to `kai-es` (registered by kai_es.cli)
COMMANDS: tuple[click.Command, ...] = (explain_cmd, usage_cmd)
