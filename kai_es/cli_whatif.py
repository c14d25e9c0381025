"""`kai-es whatif LOG`: the workload recorded in LOG re-run under other settings, compared with
the recorded run (see `kai_es.whatif`). `kai_es.cli` registers `COMMANDS`.

Output: a side-by-side table (or `--output json`: the comparison document of
`kai_es.whatif.compare`), the counterfactual's own log (it replays with `kai-es replay`), and a
report folder with `whatif.json`, `allocation.png` and `waits.png`. Same log and same changes
give byte-identical output, log and JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kai_es import verify_mode
from kai_es.app import bulk_fold, open_log
from kai_es.outputs import OutputError, check_log_output, check_report_dir, mark_report_dir
from kai_es.cli_common import UserError, check_out_name, choose_packer, console, friendly, \
    os_error_line, packer_option, records, require_plots
from kai_es.events import Record
from kai_es.events.timefmt import format_span, parse_duration
from kai_es.scheduling.config import config_digest


#: the files `whatif` writes into its report directory
WHATIF_REPORT = ("whatif.json", "allocation.png", "waits.png")


@click.command()
@click.argument("log_url")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A change: scheduler.<path>=V, queue.<name>.<gpu|cpu|memory>.<quota|limit|overQuotaWeight>=V, "
                   "queue.<name>.priority=N, nodes.remove=A,B, cyclePeriod=5s (repeatable).")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
              help="A scheduler config (YAML) replacing the recorded one.")
@click.option("--scenario-patch", "patch_file", default=None, type=click.Path(dir_okay=False),
              help="A scenario file whose Nodes and Queues are added or replace the recorded ones "
                   "(a Node annotated kai-es.io/whatif: remove is removed).")
@click.option("--log", "out_log", default=None, help="Where to write the counterfactual's log "
              "(default: out/<log name>.whatif.events.jsonl).")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Directory for whatif.json and the plots (default: out/<log name>-whatif).")
@click.option("--until", default=None, help="Compare only this long from the start (default: the whole recorded run).")
@click.option("--top", default=10, type=click.IntRange(min=0), help="How many most-changed jobs to list.")
@click.option("--force", is_flag=True, help="Replace the file given by --log if it already holds events.")
@click.option("--compare-with", type=click.Choice(["auto", "recorded"]), default="auto", show_default=True,
              help="auto: with changes, also re-run the recorded settings and compare with that re-run "
                   "when it does not reproduce the record (a live cluster's log); recorded: compare "
                   "with the record, no re-run (half the work; right for logs kai-es simulate wrote).")
@click.option("--output", "-o", type=click.Choice(["json", "text"]), default="text")
@click.option("--sweep", default=None, metavar="KEY=V1,V2,...",
              help="Re-run once per value of one --set KEY (a YAML list for values with commas: "
                   "KEY=[[a,b],[c]]), on top of the other changes, in parallel processes, and print one "
                   "table: the fast answer to \"which quota keeps waits under an hour?\". Writes no log "
                   "or report (run --set KEY=V for one value's).")
@click.option("--jobs", default=None, type=click.IntRange(min=1),
              help="With --sweep: how many re-runs at once (default: the CPUs available).")
@packer_option
@friendly
def whatif(log_url: str, sets: tuple[str, ...], config_file: str | None, patch_file: str | None,
           out_log: str | None, report_dir: str | None, until: str | None, top: int, force: bool,
           compare_with: str, output: str, sweep: str | None, jobs: int | None, packer: str | None) -> None:
    """Re-run the workload recorded in LOG under changed settings; compare with the record."""
    if sweep is None and jobs is not None:
        raise UserError("--jobs sets how many --sweep re-runs run at once: it needs --sweep")
    if sweep is None:
        require_plots("whatif")
    elif out_log is not None or report_dir is not None or force:
        raise UserError("--sweep writes no log or report: --log, --report and --force are for one what-if")
    from kai_es.whatif.changes import ChangeError, Changes, apply_changes, parse_set, read_config, read_patch
    from kai_es.whatif.compare import compare
    from kai_es.whatif.plots import plot_allocation, plot_waits
    from kai_es.whatif.recording_log import RecordingFileLog

    changes = Changes()
    try:
        if config_file is not None:
            read_config(changes, config_file)
        if patch_file is not None:
            read_patch(changes, patch_file)
        for item in sets:
            parse_set(changes, item)
    except ChangeError as exc:
        raise UserError(str(exc)) from None
    until_ns = None
    if until is not None:
        try:
            until_ns = parse_duration(until)
        except ValueError as exc:
            raise UserError(f"--until: {exc}") from None
    if sweep is not None:
        _sweep(log_url, changes, sweep, until_ns, compare_with, output, jobs, packer, top)
        return
    stem = Path(log_url.rstrip("/")).name.removesuffix(".jsonl").removesuffix(".events") or "log"
    if out_log is None or report_dir is None:
        check_out_name(stem)
    out_log = out_log or f"out/{stem}.whatif.events.jsonl"
    if out_log.startswith("kafka://"):
        raise UserError("--log: the counterfactual's log is a file (kafka:// is not supported here)")
    report_path = Path(report_dir or f"out/{stem}-whatif")
    inputs = [log_url] + [f for f in (config_file, patch_file) if f is not None]
    try:
        check_log_output(out_log, inputs=inputs, replace=force or out_log == f"out/{stem}.whatif.events.jsonl")
        if report_dir is not None:
            check_report_dir(report_path, WHATIF_REPORT, inputs=inputs)
    except OutputError as exc:
        raise UserError(str(exc)) from None
    engine = choose_packer(packer)

    # the recorded run's summary is folded in a forked process while this one extracts the
    # workload and runs the counterfactual (two passes over the log, on two cores)
    end_limit = _end_limit(log_url, until_ns)
    recorded_job = _Forked(lambda: _summarize_log(log_url, end_limit))
    rerun_job: _Forked | None = None
    try:
        workload = _workload(log_url)
        try:
            changed = apply_changes(workload, changes)
        except ChangeError as exc:
            raise UserError(str(exc)) from None
        configs = (config_digest(workload.config), config_digest(changed.config))
        # with changes, the recorded settings are re-run too (in a process forked now, which has
        # the workload without copying it), meanwhile: a log whose timing was a live cluster's is
        # compared with that re-run, not with its own record
        if changes.described and compare_with == "auto":
            rerun_seed = _seed(log_url, workload.start_ns, [], configs[0], until_ns)
            rerun_job = _Forked(lambda: _rerun(workload, rerun_seed, packer, until_ns))
        seed = _seed(log_url, workload.start_ns, changes.described, configs[1], until_ns)
        try:
            events = RecordingFileLog(out_log)
        except OSError as exc:
            raise UserError(f"--log {out_log}: cannot create the log: {os_error_line(exc)}") from None
        try:
            counterfactual, cf_facts = _play(changed, events, engine, seed, until_ns)
        except OSError as exc:
            raise UserError(f"--log {out_log}: writing the log failed: {os_error_line(exc)}") from None
        # the workloads and the log's last records are not needed any more: their memory takes
        # the two summaries about to arrive (the re-run's worker has its own copy of the
        # workload; on the benchmark the peak went 0.96 -> 0.81 GiB)
        written = events.base + len(events.records)
        events.records.clear()
        del workload, changed
        recorded, rec_facts = recorded_job.result()
        rerun = rerun_job.result() if rerun_job is not None else None
    finally:  # finished by now, or abandoned after an error
        recorded_job.stop()
        if rerun_job is not None:
            rerun_job.stop()
    doc = compare(recorded, rec_facts, counterfactual, cf_facts,
                  changes=changes.described, configs=configs, top=top, rerun=rerun)
    reference = rerun[0] if doc["comparedWith"] == "rerun" and rerun is not None else recorded
    try:
        mark_report_dir(report_path)
        (report_path / "whatif.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        # the two plots side by side: the waits' in a forked process (~0.5 s of the 30 s target)
        waits_plot = _Forked(lambda: plot_waits(reference, counterfactual, str(report_path / "waits.png")))
        try:
            plot_allocation(reference, counterfactual, str(report_path / "allocation.png"))
            waits_plot.result()
        finally:
            waits_plot.stop()
    except OSError as exc:
        raise UserError(f"--report {report_path}: cannot write the report: {os_error_line(exc)}") from None
    if output == "json":
        sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        return
    _print(doc)
    console.print(f"counterfactual log: {escape(out_log)} ({written} events; `kai-es replay` verifies it)   "
                  f"report: {escape(str(report_path))}/{{whatif.json,allocation.png,waits.png}}", highlight=False)


def _sweep_values(text: str) -> tuple[str, list[str]]:
    """(KEY, each value's text) of `--sweep KEY=V1,V2` or `KEY=[V1, V2]` (a YAML list)."""
    import yaml

    key, sep, values = text.partition("=")
    if not sep or not key or not values.strip():
        raise UserError(f"--sweep {text!r}: expected KEY=V1,V2,... (at least one value)")
    if values.lstrip().startswith("["):
        try:
            items = yaml.safe_load(values)
        except yaml.YAMLError as exc:
            raise UserError(f"--sweep {key}: the values are not a YAML list ({exc})") from None
        if not isinstance(items, list):
            raise UserError(f"--sweep {key}: expected a YAML list of values, got {values!r}")
        texts = [json.dumps(item) for item in items]
    else:
        texts = [v.strip() for v in values.split(",")]
    if not texts or any(not t for t in texts):
        raise UserError(f"--sweep {key}: an empty value in {values!r}")
    if len(set(texts)) != len(texts):
        raise UserError(f"--sweep {key}: a value is given twice in {values!r}")
    return key, texts


def _sweep(log_url: str, base: Any, sweep: str, until_ns: int | None, compare_with: str, output: str,
           jobs: int | None, packer: str | None, top: int) -> None:
    """`--sweep`: one counterfactual per value, `jobs` at a time in forked processes (each
    shares the extracted workload), each compared as a single what-if compares it."""
    import copy
    import os

    from kai_es.whatif.changes import ChangeError, apply_changes, parse_set
    from kai_es.whatif.compare import compare

    key, texts = _sweep_values(sweep)
    variants = []
    for text in texts:
        changes = copy.deepcopy(base)
        try:
            parse_set(changes, f"{key}={text}")
        except ChangeError as exc:
            raise UserError(str(exc)) from None
        variants.append(changes)
    end_limit = _end_limit(log_url, until_ns)
    workload = _workload(log_url)
    plans = []
    for changes in variants:
        try:
            changed = apply_changes(workload, changes)
        except ChangeError as exc:
            raise UserError(str(exc)) from None
        configs = (config_digest(workload.config), config_digest(changed.config))
        plans.append((changes, changed, configs, _seed(log_url, workload.start_ns, changes.described, configs[1], until_ns)))
    choose_packer(packer)  # an unusable --packer is said here, not by a worker
    tasks: list[Callable[[], Any]] = [lambda: _summarize_log(log_url, end_limit)]
    if compare_with == "auto":
        rerun_seed = _seed(log_url, workload.start_ns, [], plans[0][2][0], until_ns)
        tasks.append(lambda: _rerun(workload, rerun_seed, packer, until_ns))
    for _, changed, _, seed in plans:
        tasks.append(functools.partial(_rerun, changed, seed, packer, until_ns))
    results = _in_parallel(tasks, jobs or len(os.sched_getaffinity(0)))
    recorded = results[0]
    rerun = results[1] if compare_with == "auto" else None
    outcomes = results[2 if compare_with == "auto" else 1:]
    docs = [compare(recorded[0], recorded[1], cf[0], cf[1], changes=changes.described, configs=configs, top=top,
                    rerun=rerun)
            for (changes, _, configs, _), cf in zip(plans, outcomes, strict=True)]
    if output == "json":
        sys.stdout.write(json.dumps({"sweep": key, "values": texts, "whatifs": docs}, indent=1, sort_keys=True) + "\n")
        return
    _print_sweep(key, texts, docs)


def _in_parallel(tasks: list[Callable[[], Any]], jobs: int) -> list[Any]:
    """Each task's result, in order, running at most `jobs` forked processes at once."""
    results: list[Any] = [None] * len(tasks)
    running: list[tuple[int, _Forked]] = []
    try:
        for i, task in enumerate(tasks):
            if len(running) >= jobs:
                j, job = running.pop(0)
                results[j] = job.result()
                job.stop()
            running.append((i, _Forked(task)))
        for j, job in running:
            results[j] = job.result()
    finally:
        for _, job in running:
            job.stop()
    return results


def _print_sweep(key: str, texts: list[str], docs: list[dict[str, Any]]) -> None:
    parts = key.split(".")
    queue = parts[1] if parts[0] == "queue" and len(parts) >= 3 else None
    ref = docs[0]["comparedWith"]
    base = docs[0]["runs"][ref]
    label = "re-run" if ref == "rerun" else "recorded"
    against = "a re-run of the recorded settings (the record's timing was a live cluster's)" \
        if ref == "rerun" else "the recorded run"
    console.print(Text(f"what-if sweep of {key} ({len(texts)} values), each compared with {against}; "
                       "'decisions': whether it made the recorded decisions"
                       + (f"; also: {'; '.join(docs[0]['changes'][:-1])}" if len(docs[0]["changes"]) > 1 else "")))
    table = Table()
    cols = [key, "decisions"]
    if queue is not None:
        cols += [f"{queue} wait p50", f"{queue} wait p95", f"{queue} wait max"]
    cols += ["worst queue wait p95", "pods scheduled", "pending at end", "evictions", "GPU utilisation"]
    for col in cols:
        table.add_column(col, justify="left" if col == key else "right")

    def worst_p95(doc: dict[str, Any], run: str) -> str:
        waits = [q[run]["waitP95Ns"] for q in doc["queues"].values() if q.get(run) and q[run]["waitP95Ns"] is not None]
        return _d(max(waits)) if waits else "-"

    def row(name: str, doc: dict[str, Any], run: str, decisions: str) -> list[str]:
        r = doc["runs"][run]
        cells = [name, decisions]
        if queue is not None:
            q = doc["queues"].get(queue, {}).get(run) or {}
            cells += [_d(q.get(k)) for k in ("waitP50Ns", "waitP95Ns", "waitMaxNs")]
        cells += [worst_p95(doc, run), str(r["podsScheduled"]), str(r["pendingAtEnd"]), str(r["evictions"]),
                  f"{r['gpuUtilizationPermille'] / 10:.1f}%"]
        return cells

    table.add_row(*(Text(c) for c in row(f"({label})", docs[0], ref, str(base["decisions"]))))
    for text, doc in zip(texts, docs, strict=True):
        same = "same" if doc["identicalDecisions"] else "differ"
        table.add_row(*(Text(c) for c in row(text, doc, "counterfactual", same)))
    console.print(table)


def _end_limit(log_url: str, until_ns: int | None) -> int | None:
    """The logical time `--until` ends the comparison at: the log's first record's plus it."""
    if until_ns is None:
        return None
    first = next(iter(records(open_log(log_url, readonly=True))), None)
    return first.envelope.logicaltime + until_ns if first is not None else None


def _workload(log_url: str) -> Any:
    """The workload recorded in the log (`kai_es.whatif.workload.extract`); a UserError when
    the log is empty."""
    from kai_es.whatif.workload import extract

    with bulk_fold(keep=True):
        workload = extract(records(open_log(log_url, readonly=True)))
    if workload.records == 0:
        raise UserError(f"{log_url}: the log is empty: there is no recorded run to re-run")
    return workload


def _seed(log_url: str, start_ns: int, described: list[str], config: str, until_ns: int | None) -> str:
    """The ids' seed of a re-run: a function of the log's name, its start, the changes and the
    config (so the same whatif writes the same bytes)."""
    return hashlib.sha256(json.dumps([log_url.rsplit("/", 1)[-1], start_ns, described, config,
                                      until_ns]).encode()).hexdigest()[:16]


def _play(workload: Any, events: Any, engine: Any, seed: str, until_ns: int | None) -> tuple[Any, Any]:
    """Run `workload` into `events` (closed at the end); (its summary, its decision facts),
    taken from the fold its scheduler does anyway."""
    from kai_es.report import SummaryObserver
    from kai_es.state import ClusterState
    from kai_es.whatif.compare import DecisionDigest
    from kai_es.whatif.run import run_workload

    state = ClusterState()
    observer = SummaryObserver(state, verify=verify_mode.enabled())
    digest = DecisionDigest()

    def on_fold(record: Record) -> None:
        digest.add(record)
        observer.observe(record)

    async def run_and_close() -> Any:
        try:
            return await run_workload(workload, events, engine, seed=seed, until_ns=until_ns,
                                      state=state, on_fold=on_fold)
        finally:
            await events.close()

    with bulk_fold(keep=True):
        anyio.run(run_and_close)
    end_ns = workload.start_ns + until_ns if until_ns is not None else workload.end_ns
    return observer.finish(end_ns), digest.facts()


class _Forked:
    """`fn()` in a forked process (which shares the parent's memory as it was at the fork, so
    large arguments are not copied); `result()` waits for its return value, or raises the
    exception it raised (the same type, so the CLI reports it as it would its own)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)

        def child() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
                outcome = (False, exc)
            try:
                send.send(outcome)
            except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
                send.send((False, RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]} ({exc})")))
            finally:
                send.close()

        # not daemonic: a daemonic process may not start processes, and its task may read a Kafka
        # log through a reader process (`adapters.kafka_frames`); every user stops it in a finally
        self._proc = ctx.Process(target=child)
        self._proc.start()  # which drops `child` (and so `fn`) in this process
        send.close()

    def result(self) -> Any:
        try:
            ok, value = self._recv.recv()
        except (EOFError, OSError):  # (OSError: it died while sending, the pipe ends inside the message)
            self._proc.join(5)
            raise RuntimeError(f"a worker process ended without a result (exit code "
                               f"{self._proc.exitcode})") from None
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
        self._recv.close()


def _rerun(workload: Any, seed: str, packer: str | None, until_ns: int | None) -> tuple[Any, Any]:
    """(summary, decision facts) of `workload` re-run as recorded (in a worker), its log kept
    only as far back as its scheduler and binder read."""
    from kai_es.whatif.recording_log import RecordingFileLog

    return _play(workload, RecordingFileLog(None), choose_packer(packer), seed, until_ns)


def _until(stream: Any, end_ns: int | None) -> Any:
    """The records up to logical time `end_ns` (all when None)."""
    for record in stream:
        if end_ns is not None and record.envelope.logicaltime > end_ns:
            return
        yield record


def _summarize_log(log_url: str, end_ns: int | None) -> tuple[Any, Any]:
    """(summary, decision facts) of a log up to `end_ns` (in a worker process)."""
    from kai_es.report import summarize
    from kai_es.whatif.compare import DecisionDigest

    digest = DecisionDigest()
    with bulk_fold(keep=True):
        summary = summarize(digest.tee(_until(records(open_log(log_url, readonly=True)), end_ns)), end_ns=end_ns,
                            verify=verify_mode.enabled())
    return summary, digest.facts()


def _never(censored: bool) -> str:
    return " (never ran)" if censored else ""


def _d(ns: int | None) -> str:
    return "-" if ns is None else format_span(ns)


def _print(doc: dict[str, Any]) -> None:
    ref = doc["comparedWith"]
    rec = doc["runs"][ref]
    what = "; ".join(doc["changes"]) or "no changes"
    verdict = "identical decisions" if doc["identicalDecisions"] else "decisions differ"
    console.print(Text(f"what-if: {what} ({verdict})"))
    label = "recorded"
    if ref == "rerun":
        label = "re-run"
        console.print(Text(
            f"A re-run of the recorded settings does not make the recorded decisions ({doc['runs']['recorded']['decisions']}"
            f" recorded, {rec['decisions']} re-run: the record's timing was a live cluster's), so the "
            "counterfactual is compared with that re-run: what differs is what the changes did."))
    console.print(Text(f"per queue: {label} -> counterfactual"))
    table = Table()
    for col in ("queue", "wait p50", "wait p95", "wait max", "pending at end", "GPU-hours"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    def path(name: str) -> str:
        parts, seen = [name], {name}
        parent = doc["queues"][name]["parent"]
        while parent and parent in doc["queues"] and parent not in seen:
            parts.append(parent)
            seen.add(parent)
            parent = doc["queues"][parent]["parent"]
        return "/".join(reversed(parts))

    for name in sorted(doc["queues"], key=path):
        q = doc["queues"][name]
        a, b = q[ref], q["counterfactual"]
        indent = "  " * path(name).count("/") + (name or "(none)")
        table.add_row(Text(indent), *(f"{_d(a[k])} -> {_d(b[k])}" for k in ("waitP50Ns", "waitP95Ns", "waitMaxNs")),
                      f"{a['pendingAtEnd']} -> {b['pendingAtEnd']}",
                      f"{a['gpuMilliNs'] / 3.6e15:.1f} -> {b['gpuMilliNs'] / 3.6e15:.1f}")
    console.print(table)
    columns = ["recorded", "rerun", "counterfactual"] if "rerun" in doc["runs"] else ["recorded", "counterfactual"]
    runs = Table(title="cluster")
    runs.add_column("", justify="left")
    for col in columns:
        runs.add_column("re-run" if col == "rerun" else col, justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [("GPU utilisation", lambda r: f"{r['gpuUtilizationPermille'] / 10:.1f}%"),
            ("pods scheduled", lambda r: str(r["podsScheduled"])),
            ("pending at end", lambda r: str(r["pendingAtEnd"])),
            ("evictions", lambda r: str(r["evictions"])),
            ("stranded GPU-hours", lambda r: f"{r['strandedGpuMilliNs'] / 3.6e15:.1f}"),
            ("idle / stranded GPUs at end", lambda r: f"{r['fragmentationAtEnd']['idleMilliGpu'] / 1000:g} / "
                                                      f"{r['fragmentationAtEnd']['strandedMilliGpu'] / 1000:g}"),
            ("fair-share error (mean GPU)", lambda r: f"{r['fairShareErrorMeanMilliGpu'] / 1000:.1f}"),
            ("cycles", lambda r: str(r["cycles"])),
            ("decisions", lambda r: str(r["decisions"]))]
    for row, fn in rows:
        runs.add_row(row, *(fn(doc["runs"][col]) for col in columns))
    console.print(runs)
    if doc["jobsChangedMost"]:
        console.print(Text("jobs whose wait changed most:"))
        jobs = Table()
        for col in ("job", "queue", f"{label} wait", "counterfactual wait", "change"):
            jobs.add_column(col, justify="left" if col in ("job", "queue") else "right")
        for j in doc["jobsChangedMost"]:
            delta = j["deltaNs"]
            jobs.add_row(Text(j["job"]), Text(j["queue"]), _d(j[f"{ref}WaitNs"]) + _never(j[f"{ref}Censored"]),
                         _d(j["counterfactualWaitNs"]) + _never(j["counterfactualCensored"]),
                         ("+" if delta >= 0 else "-") + format_span(abs(delta)))
        console.print(jobs)
    console.print(Text(doc["waitCounting"].capitalize() + "."))


COMMANDS: tuple[click.Command, ...] = (whatif,)
