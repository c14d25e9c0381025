"""`kai-es scheduler` and `kai-es binder`: the services as long-running processes over one log.

Until the Kubernetes adapters land, the binder process hosts the simulated cluster built from a
scenario (plus the informer on it): process "binder" = simulated Kubernetes + informer + binder,
process "scheduler" = the scheduler. See `kai_es.services.processes` for time, restarts and
how the simulated cluster is rebuilt from the log.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import anyio
import click

from kai_es.app import open_log
from kai_es.cli import UserError, warn_unimplemented, err, friendly, main, packer_option
from kai_es.events.timefmt import parse_duration
from kai_es.scenario import load_scenario
from kai_es.scheduling.config import SchedulerConfig
from kai_es.app import packer_from_env


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def _seconds(option: str, text: str) -> float:
    try:
        return parse_duration(text) / 1e9
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


def _open_writer(log_url: str, default_txn: str) -> Any:
    if log_url.startswith("kafka://"):
        from kai_es.adapters.kafka_log import KafkaEventLog, parse_url  # noqa: PLC0415

        cfg = parse_url(log_url)
        return KafkaEventLog.from_url(log_url, transactional_id=cfg.transactional_id or default_txn)
    return open_log(log_url)


def _ready(line: str) -> None:
    err.print(line, highlight=False, markup=False)


def _run(fn: Any) -> None:
    from kai_es.services.processes import fenced_error_types  # noqa: PLC0415

    try:
        anyio.run(fn)
    except KeyboardInterrupt:  # pragma: no cover - interactive stop
        sys.exit(130)
    except fenced_error_types():
        # the fenced producer leaves futures holding ProducerFenced that nobody awaits; at exit
        # asyncio would log each one: keep the stop to the one line friendly() prints
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        raise


time_scale_option = click.option(
    "--time-scale", default=1.0, type=float, show_default=True,
    help="Simulated seconds per real second (60: one real second is a simulated minute).")


@main.command()
@click.option("--log", "log_url", required=True, help="Event log (kafka://host:port/topic).")
@click.option("--scenario", "scenario_file", default=None, type=click.Path(dir_okay=False),
              help="Take the scheduler configuration from this scenario's spec.scheduler.")
@click.option("--period", default="1s", show_default=True, help="Real time between cycles.")
@click.option("--snapshot-every", default=50, show_default=True, type=int,
              help="Write a state snapshot every N cycles (0: no snapshots, always full fold).")
@time_scale_option
@click.option("--cycles", default=None, type=int, help="Stop after this many cycles (testing).")
@click.option("--verbose", "-v", is_flag=True, help="Log progress (INFO) to stderr.")
@packer_option
@friendly
def scheduler(log_url: str, scenario_file: str | None, period: str, snapshot_every: int,
              time_scale: float, cycles: int | None, verbose: bool, packer: str | None) -> None:
    """Run the scheduler service: fold the log (from a snapshot), then a cycle every PERIOD
    when there is work. transactional_id: kai-es-scheduler (override with ?transactional_id=)."""
    from kai_es.adapters.file_snapshots import FileSnapshotStore  # noqa: PLC0415
    from kai_es.services.processes import (  # noqa: PLC0415
        SCHEDULER_TXN_ID,
        FlowClock,
        is_kafka,
        scheduler_session,
        supervise,
    )

    _setup_logging(verbose)
    config = load_scenario(scenario_file).config if scenario_file else SchedulerConfig()
    warn_unimplemented(config)
    period_s = _seconds("--period", period)
    engine = packer_from_env(packer)
    if time_scale <= 0:
        raise UserError("--time-scale must be positive")
    if snapshot_every > 0 and config.state_digest_every != 1:
        err.print("warning: snapshots are taken only on cycles whose CycleCompleted carries a "
                  f"state digest (stateDigestEvery={config.state_digest_every})", highlight=False)

    async def body() -> None:
        clock = FlowClock(time_scale)

        async def session() -> None:
            events = _open_writer(log_url, SCHEDULER_TXN_ID)
            store: Any = None
            if snapshot_every > 0:
                if is_kafka(events):
                    from kai_es.adapters.kafka_snapshots import KafkaSnapshotStore  # noqa: PLC0415

                    store = KafkaSnapshotStore.for_log(events)
                elif not log_url.startswith("memory:"):
                    store = FileSnapshotStore.for_log(log_url)
            try:
                await scheduler_session(events, config, engine, clock, period_s=period_s,
                                        snapshots=store, snapshot_every=snapshot_every,
                                        on_ready=_ready, stop_after_cycles=cycles)
            finally:
                with anyio.CancelScope(shield=True):
                    if store is not None:
                        await store.close()
                    await events.close()

        await supervise("scheduler", session)

    _run(body)


@main.command()
@click.option("--log", "log_url", required=True, help="Event log (kafka://host:port/topic).")
@click.option("--scenario", "scenario_file", required=True, type=click.Path(dir_okay=False),
              help="The simulated cluster: nodes, queues, workloads (submit-after, run-for).")
@time_scale_option
@click.option("--poll", default="50ms", show_default=True, help="Real time between log polls.")
@click.option("--stats", "stats_file", default=None, type=click.Path(dir_okay=False),
              help="Append bind counters (JSON lines) to this file.")
@click.option("--verbose", "-v", is_flag=True, help="Log progress (INFO) to stderr.")
@friendly
def binder(log_url: str, scenario_file: str, time_scale: float, poll: str,
           stats_file: str | None, verbose: bool) -> None:
    """Run the binder with the simulated cluster and its informer (one process). On restart
    the simulated cluster is rebuilt from the log. transactional_id: kai-es-binder."""
    from kai_es.services.processes import (  # noqa: PLC0415
        BINDER_TXN_ID,
        FlowClock,
        StatsFile,
        binder_session,
        supervise,
    )

    _setup_logging(verbose)
    scenario = load_scenario(scenario_file)
    poll_s = _seconds("--poll", poll)
    if time_scale <= 0:
        raise UserError("--time-scale must be positive")
    stats = StatsFile(stats_file)

    async def body() -> None:
        clock = FlowClock(time_scale)

        async def session() -> None:
            events = _open_writer(log_url, BINDER_TXN_ID)
            try:
                await binder_session(events, scenario, clock, poll_s=poll_s, stats=stats,
                                     on_ready=_ready)
            finally:
                with anyio.CancelScope(shield=True):
                    await events.close()

        await supervise("binder", session)

    _run(body)
