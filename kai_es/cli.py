"""The `kai-es` command line. click for parsing (sub-commands, typed options, help for free),
rich for tables and progress.

Every expected failure (bad scenario, bad config, corrupt log, missing file, a file that cannot
be read or written: no permission, a full disk) prints one readable message to stderr and exits
2; a replay that diverges exits 1. No tracebacks for user errors.

Text from the user's files (names, paths, messages) is never read as rich markup, and in the
one-line-per-event output of `events` control characters are escaped, so a name cannot forge
lines or styles.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import click
import msgspec
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kai_es import verify_mode
from kai_es.adapters.file_log import FileEventLog
from kai_es.app import bulk_fold, open_log
from kai_es.cli_common import (UserError, one_line, os_error_line, choose_packer, console, err, friendly,
                               packer_option, require_plots, warn, warn_unimplemented)
from kai_es.cli_common import records as _records, records_from as _records_from
from kai_es.cli_common import check_out_name as _check_out_name, holds_data as _holds_data, working
from kai_es.outputs import OutputError, check_log_output, check_report_dir, mark_report_dir
from kai_es.events import Record, encode
from kai_es.events import payloads as p
from kai_es.events.timefmt import format_duration, format_span, parse_duration
from kai_es.scenario import load_scenario
from kai_es.visibility.brief import brief as _brief, unbalanced_brackets


#: The commands defined in other modules, by name: each module is imported only when one of its
#: commands runs or help lists them, so `kai-es replay` does not load the HTTP server, the Kafka
#: client or the what-if engine (tests/test_cli.py checks this table against each `COMMANDS`).
LAZY_COMMANDS: dict[str, str] = {
    "scheduler": "kai_es.cli_services", "informer": "kai_es.cli_services", "binder": "kai_es.cli_services",
    "explain": "kai_es.cli_audit", "usage": "kai_es.cli_audit",
    "whatif": "kai_es.cli_whatif",
    "serve": "kai_es.cli_serve",
}


class _LazyGroup(click.Group):
    """A click group that imports a command's module (`LAZY_COMMANDS`) when the command is
    asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = LAZY_COMMANDS.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        commands: tuple[click.Command, ...] = importlib.import_module(module).COMMANDS
        return next(c for c in commands if c.name == cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kai-es")
def main() -> None:
    """kai-es: an event-sourced GPU scheduler with KAI Scheduler semantics."""


# --- simulate ----------------------------------------------------------------------------------


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--log", "log_url", default=None, help="Event log to write (file path or kafka://). "
              "Default: out/<scenario>.events.jsonl")
@click.option("--until", default=None, help="'idle' or a duration such as 24h (default: the scenario's).")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Directory for the summary and plot. Default: out/<scenario>-report")
@click.option("--force", "--overwrite", "force", is_flag=True,
              help="Replace the file given by --log if it already holds events.")
@click.option("--snapshot-every", default=0, show_default=True, type=click.IntRange(min=0),
              help="As `kai-es scheduler --snapshot-every`: a state snapshot every N cycles, kept "
                   "beside a file log with up to 8 checkpoints for `kai-es replay` (0: none).")
@packer_option
@friendly
def simulate(scenario_file: str, log_url: str | None, until: str | None, report_dir: str | None,
             force: bool, snapshot_every: int, packer: str | None) -> None:
    """Run a scenario through the whole pipeline on a simulated cluster."""
    require_plots("simulate")
    from kai_es.report import plot, plot_fair_share, summarize
    from kai_es.app.simulation import simulate as run_sim

    scenario = _load(scenario_file)
    until_ns: int | None = scenario.simulation.until_ns
    if until is not None:
        try:
            until_ns = None if until == "idle" else parse_duration(until)
        except ValueError as exc:
            raise UserError(f"--until: {exc}") from None
    if log_url is None or report_dir is None:
        _check_out_name(scenario.name)
    replacing = ""
    default_log = log_url is None
    if log_url is None:
        log_url = f"out/{scenario.name}.events.jsonl"
        if _holds_data(log_url):
            replacing = f" (replacing the previous run's {log_url})"
    report_path = Path(report_dir or f"out/{scenario.name}-report")
    try:
        if not log_url.startswith("kafka://"):
            check_log_output(log_url, inputs=[scenario_file], replace=force or default_log)
        if report_dir is not None:
            check_report_dir(report_path, SIMULATE_REPORT, inputs=[scenario_file])
    except OutputError as exc:
        raise UserError(str(exc)) from None
    engine = choose_packer(packer)
    warn_unimplemented(scenario.config)
    try:
        events = open_log(log_url, fresh=not log_url.startswith("kafka://"))
    except OSError as exc:
        raise UserError(f"--log {log_url}: cannot create the log: {os_error_line(exc)}") from None
    snapshots = None
    if snapshot_every:
        from kai_es.app.processes import snapshot_store  # noqa: PLC0415

        snapshots = snapshot_store(log_url, events)
        if scenario.config.state_digest_every != 1:
            err.print("warning: snapshots are taken only on cycles whose CycleCompleted carries a "
                      f"state digest (stateDigestEvery={scenario.config.state_digest_every})", highlight=False)
    console.print(f"[bold]kai-es simulate[/] {escape(scenario_file)}: {len(scenario.objects)} objects, "
                  f"packer={engine.kind}, log={escape(log_url)}{escape(replacing)}", highlight=False)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.fields[sim]}"), TimeElapsedColumn(), console=console,
                  transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("simulating", total=1000, sim="")

        def progress(elapsed: int, total: int | None) -> None:
            done = elapsed * 1000 // total if total else 0
            bar.update(task, completed=done, sim=f"t+{format_duration(elapsed)}")

        async def run_and_close() -> Any:
            try:
                return await run_sim(scenario, events, engine, until_ns=until_ns, progress=progress,
                                     snapshots=snapshots, snapshot_every=snapshot_every)
            finally:
                await events.close()
                if snapshots is not None:
                    await snapshots.close()

        try:
            result = anyio.run(run_and_close)
        except OSError as exc:
            raise UserError(f"--log {log_url}: writing the log failed: {os_error_line(exc)}") from None
    with bulk_fold():
        records = list(_records(events))
        summary = summarize(records, end_ns=result.end_ns, verify=verify_mode.enabled())
    plot_path = report_path / "gpu-allocation.png"
    _print_summary(summary, result.stopped_because, result.end_ns - result.start_ns, result.cycles)
    try:
        mark_report_dir(report_path)
        plot(summary, str(plot_path))
        plot_fair_share(summary, str(report_path / "fair-share.png"))
        (report_path / "summary.json").write_text(json.dumps(_summary_json(summary), indent=2) + "\n")
    except OSError as exc:
        raise UserError(f"--report {report_path}: cannot write the report: {os_error_line(exc)} "
                        f"(the log {log_url} is complete)") from None
    console.print(f"log: {escape(log_url)} ({len(records)} events)   plots: {escape(str(plot_path))}, "
                  f"{escape(str(report_path / 'fair-share.png'))}   "
                  f"summary: {escape(str(report_path / 'summary.json'))}", highlight=False)


#: the files `simulate` writes into its report directory
SIMULATE_REPORT = ("gpu-allocation.png", "fair-share.png", "summary.json")


def _load(scenario_file: str) -> Any:
    """`load_scenario`, with a transient spinner on a terminal (big files take a while)."""
    if not err.is_terminal:
        return load_scenario(scenario_file)
    try:
        size = f" ({os.path.getsize(scenario_file) / 1e6:.1f} MB)"
    except OSError:
        size = ""
    with err.status(f"loading {escape(scenario_file)}{size}"):
        return load_scenario(scenario_file)


def _fmt_ns(ns: int | None) -> str:
    return "-" if ns is None else format_span(ns)


def _print_summary(s: Any, why: str, duration: int, cycles: int) -> None:
    console.print(f"simulated {format_duration(duration)} ({why}); {cycles} cycles; "
                  f"{s.pods_scheduled}/{s.pods_seen} pods scheduled; {s.pending_at_end} pending at end; "
                  f"GPU utilization {s.utilization_permille / 10:.1f}%")
    table = Table(title="per queue")
    for col in ("queue", "scheduled", "wait p50", "wait p95", "wait max", "GPU-hours", "pending"):
        table.add_column(col, justify="right" if col != "queue" else "left")
    for name in sorted(s.queues, key=lambda n: _queue_path(s, n)):
        q = s.queues[name]
        depth = _queue_path(s, name).count("/")
        table.add_row(Text("  " * depth + (name or "(none)")), str(q.scheduled), _fmt_ns(q.percentile_ns(50)),
                      _fmt_ns(q.percentile_ns(95)), _fmt_ns(q.max_wait_ns), f"{q.gpu_milli_ns / 3.6e15:.2f}",
                      str(q.pending_at_end))
    console.print(table)
    censored = sum(q.censored for q in s.queues.values() if not q.parent)
    if censored:
        console.print(f"waits include {censored} pod(s) that never ran: each counts its wait from arrival to "
                      "the end of the run (a lower bound of its real wait)", highlight=False)
    from kai_es.report import fragmentation_lines

    for line in fragmentation_lines(s):
        console.print(Text(line))


def _queue_path(s: Any, name: str) -> str:
    """`parent/child` path of a queue in the summary (for tree order and indentation)."""
    parts, seen = [name], {name}
    parent = s.queues[name].parent if name in s.queues else ""
    while parent and parent not in seen:
        parts.append(parent)
        seen.add(parent)
        parent = s.queues[parent].parent if parent in s.queues else ""
    return "/".join(reversed(parts))


def _summary_json(s: Any) -> dict[str, Any]:
    from kai_es.report import summary_json

    return summary_json(s)


# --- cycle -------------------------------------------------------------------------------------


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Choice(["json", "text"]), default="text")
@packer_option
@friendly
def cycle(scenario_file: str, output: str, packer: str | None) -> None:
    """Run exactly one scheduling cycle on the scenario's initial state."""
    from kai_es.oneshot import one_cycle

    scenario = _load(scenario_file)
    warn_unimplemented(scenario.config)
    engine = choose_packer(packer)
    with working(f"one cycle over {len(scenario.objects)} objects"):
        outcome = one_cycle(scenario, engine)
    if output == "json":
        sys.stdout.write(json.dumps(outcome, sort_keys=True, indent=1) + "\n")
        return
    table = Table(title=Text(f"one cycle of {scenario_file}"))
    for col in ("pod", "status", "node", "gpu groups"):
        table.add_column(col)
    for key, pod in outcome["pods"].items():
        node = pod["node"] or "-"
        if pod.get("movesTo"):
            node = f"{node} -> {pod['movesTo']} (moves)"
        table.add_row(Text(key), Text(pod["status"]), Text(node),
                      Text(",".join(pod["gpuGroups"]) or "-"))
    console.print(table)
    for d in outcome["decisions"]:
        if d["type"] == "kai.scheduler.pod.unschedulable":
            for reason in d["data"]["reasons"]:
                console.print(f"[yellow]{escape(one_line(d['subject']))}[/] "
                              f"{escape(one_line(reason['code'] + ': ' + reason['message']))}", highlight=False)


# --- fairshare ---------------------------------------------------------------------------------


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Choice(["json", "text"]), default="text")
@friendly
def fairshare(scenario_file: str, output: str) -> None:
    """Fair share of every queue and resource on the scenario's initial state."""
    from kai_es.oneshot import fairshare_report

    scenario = _load(scenario_file)
    with working(f"dividing the capacity of {len(scenario.objects)} objects"):
        report = fairshare_report(scenario)
    if output == "json":
        sys.stdout.write(json.dumps(report, sort_keys=True, indent=1) + "\n")
        return
    table = Table(title=Text(f"fair share of {scenario_file}"))
    for col in ("queue", "resource", "quota", "limit", "request", "allocated", "fair share"):
        table.add_column(col, justify="left" if col in ("queue", "resource") else "right")
    for name, q in report["queues"].items():
        label = name if not q["parent"] else f"{q['parent']}/{name}"
        for resource, r in q["resources"].items():
            table.add_row(Text(label), resource, *(_unit(resource, r[k]) for k in
                                             ("quota", "limit", "request", "allocated", "fairShare")))
    console.print(table)


def _unit(resource: str, value: int) -> str:
    if value < 0:
        return "unlimited"
    if resource == "gpu":
        return f"{value / 1000:g}"
    if resource == "cpu":
        return f"{value}m"
    return f"{value / 2**30:.1f}Gi"


# --- replay ------------------------------------------------------------------------------------


@main.command()
@click.argument("log_url")
@packer_option
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Processes to spread the replay over (default: the CPUs available).")
@click.option("--checkpoints/--no-checkpoints", default=True, show_default=True,
              help="Start the later processes from the scheduler's checkpoints (LOG.checkpoints/ "
                   "beside a file log, the topic's .checkpoints topic beside a Kafka one; each "
                   "checked against the log), not by folding it from 0.")
@friendly
def replay(log_url: str, packer: str | None, jobs: int | None, checkpoints: bool) -> None:
    """Re-fold LOG and re-run every recorded cycle; exit 0 only if every decision matches."""
    from kai_es.replay import describe
    from kai_es.replay_parallel import replay_file, replay_kafka

    events = open_log(log_url, readonly=True)
    # a one-shot command: what the replay built is frozen, not scanned by a last collection
    # (1.5 s of a 1,000,000-event replay, for garbage the process exit frees anyway); the bar is
    # redrawn by each progress call, not by a thread of its own: the replay forks its workers and
    # readers, and a forked child must not inherit a lock such a thread may hold
    with bulk_fold(keep=True), Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
                                        TextColumn("records"), TimeElapsedColumn(), console=err,
                                        transient=True, disable=not err.is_terminal, auto_refresh=False) as bar:
        if isinstance(events, FileEventLog):
            task = bar.add_task("replay", total=events.record_count())
            result = replay_file(events, packer_kind=packer, jobs=jobs, checkpoints=checkpoints,
                                 progress=lambda n: bar.update(task, completed=n, refresh=True))
        else:
            from kai_es.adapters.kafka_frames import end_offset  # noqa: PLC0415 - optional backend
            from kai_es.adapters.kafka_log import KafkaEventLog  # noqa: PLC0415

            if not isinstance(events, KafkaEventLog):
                raise UserError(f"{log_url}: an in-memory log holds nothing to replay")
            end = end_offset(events)
            task = bar.add_task("replay", total=end)
            result = replay_kafka(events, packer_kind=packer, jobs=jobs, end=end, checkpoints=checkpoints,
                                  progress=lambda n: bar.update(task, completed=n, refresh=True))
    from kai_es.app.processes import describe_dead_letters

    for line in describe_dead_letters(list(getattr(events, "dead_letters", []))):
        console.print(line, highlight=False, markup=False)
    if result.divergence is not None:
        err.print(describe(result.divergence), highlight=False, markup=False)
        sys.exit(1)
    torn = getattr(events, "recovered", None)
    complete = result.cycles - result.abandoned  # cycles whose decisions were compared
    verified = (f"{complete} cycles, {result.decisions} decisions over {result.records} records "
                f"replayed byte for byte")
    if result.records == 0:
        what = (f"it ends with {torn.length} bytes that are not a complete record ({torn.reason})"
                if torn is not None else "it is empty")
        raise UserError(f"{log_url}: no complete record to verify: {what}")
    if complete == 0:
        abandoned = f" ({result.abandoned} abandoned: their decisions are not in the log)" if result.abandoned else ""
        raise UserError(f"{log_url}: {result.records} records but no complete scheduling cycle{abandoned}: "
                        "nothing to verify")
    if torn is not None:
        console.print(f"verified: {verified}, positions 0..{result.last_position}; state {result.state_digest}",
                      highlight=False, markup=False)
        raise UserError(f"{log_url}: the log ends with a torn record at position {torn.position} "
                        f"({torn.length} bytes: {torn.reason}): it is incomplete and that record was not verified")
    extra = f", {result.abandoned} abandoned" if result.abandoned else ""
    if result.abandoned_at and result.abandoned_at[-1] == result.last_position:
        extra += (f"; the log ends with the CycleStarted at position {result.last_position}, whose decisions "
                  "are not in it (not verified)")
    console.print(f"OK: {verified}{extra}; state {result.state_digest}", highlight=False, markup=False)
    if result.resumed:
        kept = f"{log_url}.checkpoints/" if isinstance(events, FileEventLog) else f"topic {events.topic}.checkpoints"
        err.print(f"({result.resumed} of the processes started from a checkpoint in {kept}, "
                  "each checked against the log)", highlight=False, markup=False)


# --- events ------------------------------------------------------------------------------------


@main.command()
@click.argument("log_url")
@click.option("--type", "type_pattern", default=None,
              help="Event type or glob (e.g. 'kai.scheduler.*').")
@click.option("--subject", default=None, help="Subject or glob (e.g. 'pod/default/train-*').")
@click.option("--from", "from_position", default=0, type=click.IntRange(min=0),
              help="First position to read (to resume: the last position seen + 1).")
@click.option("--limit", default=None, type=click.IntRange(min=0),
              help="Stop after this many matching events (0: none).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep reading: print events as they are appended, until interrupted.")
@click.option("--output", "-o", type=click.Choice(["json", "text"]), default="text")
@friendly
def events(log_url: str, type_pattern: str | None, subject: str | None, from_position: int,
           limit: int | None, follow: bool, output: str) -> None:
    """Read the log like an audit consumer (one event per line; NDJSON with --output json)."""
    from kai_es.events.registry import EVENT_TYPES

    for option, pattern in (("--type", type_pattern), ("--subject", subject)):
        if pattern and unbalanced_brackets(pattern):
            raise UserError(f"{option} {pattern!r}: a '[' without its ']' (to match a bracket itself, write [[])")
    if type_pattern and not any(fnmatch.fnmatchcase(t, type_pattern) for t in EVENT_TYPES):
        raise UserError(f"--type {type_pattern!r} matches no event type (they are named like "
                        f"kai.cluster.pod.observed or kai.scheduler.*; all: {', '.join(sorted(EVENT_TYPES))})")
    log = open_log(log_url, readonly=True)
    out = sys.stdout
    if limit == 0:
        return

    def show(record: Record) -> bool:
        env = record.envelope
        if type_pattern and not fnmatch.fnmatchcase(env.type, type_pattern):
            return False
        if subject and not fnmatch.fnmatchcase(env.subject, subject):
            return False
        if output == "json":
            body = msgspec.json.decode(encode(env))
            out.write(json.dumps({"position": record.position, "event": body}, sort_keys=True,
                                 separators=(",", ":")) + "\n")
        else:
            out.write(one_line(f"{record.position:>8} {env.time} {env.type:<36} {env.subject}  "
                                f"{_brief(env.data)}") + "\n")
        if follow:
            out.flush()
        return True

    if follow:
        from kai_es.cli_audit import follow_log

        follow_log(log, from_position, show, limit)
        return
    shown = read = 0
    for record in _records_from(log, from_position):
        read += 1
        if show(record):
            shown += 1
            if limit is not None and shown >= limit:
                break
    if read and not shown and (type_pattern or subject):
        filters = " and ".join(f"{o} {v!r}" for o, v in (("--type", type_pattern), ("--subject", subject)) if v)
        warn(f"none of the {read} events read matched {filters}")


if __name__ == "__main__":
    main()
