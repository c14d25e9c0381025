"""`kai-es scheduler`, `kai-es informer`, `kai-es binder`: the long-running processes over one
shared log. Parsing and messages only: every process is built by `kai_es.app.processes`.

- `kai-es scheduler --log URL`: the scheduler.
- `kai-es informer --log URL [--kubeconfig F]`: list + watch a Kubernetes cluster into the log.
- `kai-es binder --log URL [--kubeconfig F]`: perform the log's decisions through the Kubernetes
  API; with `--scenario F` instead, the simulated cluster (simulated Kubernetes + its informer +
  the binder in one process), for running kai-es without a cluster.
Without `--kubeconfig`, the Kubernetes processes use $KUBECONFIG, else the in-cluster config.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import click

from kai_es.cli_common import UserError, choose_packer, err, friendly, packer_option, warn_unimplemented
from kai_es.events.timefmt import parse_duration
from kai_es.scenario import load_scenario
from kai_es.scheduling.config import SchedulerConfig

if TYPE_CHECKING:
    from kai_es.adapters.status_http import ProcessStatus
    from kai_es.app.processes import LeaderElection

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def _seconds(option: str, text: str) -> float:
    try:
        return parse_duration(text) / 1e9
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


def _ready(line: str) -> None:
    err.print(line, highlight=False, markup=False)


def _run(fn: Callable[[ProcessStatus | None], Awaitable[None]], process: str,
         http_address: str | None) -> None:
    """Run `fn` (handed the process's `ProcessStatus` when it serves HTTP) until it ends, or
    until SIGTERM or SIGINT: then `fn` is cancelled, so its cleanup runs (a transaction is
    aborted, logs are closed, a leader hands its Lease back), and the process exits 0 after
    one line saying so (Kubernetes stops a pod with SIGTERM)."""
    from kai_es.adapters.status_http import ProcessStatus, StatusServer  # noqa: PLC0415
    from kai_es.app.processes import alongside, fenced_error_types  # noqa: PLC0415

    server: StatusServer | None = None
    status: ProcessStatus | None = None
    if http_address is not None:
        status = ProcessStatus(process)
        server = StatusServer(status, http_address)
        err.print(f"{process}: serving /healthz, /readyz and /metrics on http://{server.address}",
                  highlight=False, markup=False)
    stopped_by: list[str] = []

    async def main() -> None:
        scope = anyio.CancelScope()

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    stopped_by.append(signal.Signals(signum).name)
                    scope.cancel()
                    return

        with scope:
            await alongside(fn(status), on_signal)

    try:
        anyio.run(main)
    except fenced_error_types():
        # the fenced producer leaves futures holding ProducerFenced that nobody awaits; at exit
        # asyncio would log each one: keep the stop to the one line friendly() prints
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        raise
    finally:
        if server is not None:
            server.close()
    if stopped_by:
        err.print(f"{process}: stopped by {stopped_by[0]}", highlight=False, markup=False)


def _time_scale(value: float) -> float:
    if value <= 0:
        raise UserError("--time-scale must be positive")
    return value


time_scale_option = click.option(
    "--time-scale", default=1.0, type=float, show_default=True,
    help="Simulated seconds per real second (60: one real second is a simulated minute).")
log_option = click.option("--log", "log_url", required=True,
                          help="Event log: a file path or kafka://host:port/topic.")
verbose_option = click.option("--verbose", "-v", is_flag=True, help="Log progress (INFO) to stderr.")
http_option = click.option(
    "--http-bind-address", "http_address", default=None, metavar="HOST:PORT",
    help="Serve /healthz (liveness), /readyz (readiness) and /metrics (Prometheus) on this "
         "address, e.g. :8080 (default: no HTTP server).")


def leader_options(fn: Callable[..., None]) -> Callable[..., None]:
    """The `--leader-elect*` options (active/standby replicas over a Kubernetes Lease)."""
    options = [
        click.option("--leader-elect", is_flag=True,
                     help="Stand by until this replica holds a Kubernetes Lease; run only while "
                          "holding it (for more than one replica)."),
        click.option("--leader-elect-lease", default=None, metavar="NAMESPACE/NAME",
                     help="The Lease (default: $POD_NAMESPACE, else the in-cluster namespace, "
                          "else default / kai-es-<command>)."),
        click.option("--leader-elect-identity", default=None,
                     help="This replica's name in the Lease (default: hostname + a random suffix)."),
        click.option("--leader-elect-lease-duration", default="15s", show_default=True,
                     help="A leader that has not renewed for this long is replaced."),
        click.option("--leader-elect-renew-deadline", default="10s", show_default=True,
                     help="A leader that cannot renew for this long stops."),
        click.option("--leader-elect-retry-period", default="2s", show_default=True,
                     help="How often standbys try and the leader renews."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _election(command: str, kubeconfig: str | None, enabled: bool, lease: str | None,
              identity: str | None, duration: str, deadline: str, retry: str,
              shard: str | None = None) -> LeaderElection | None:
    from kai_es.app.processes import LeaderElection  # noqa: PLC0415

    if not enabled:
        if lease or identity:
            raise UserError("--leader-elect-lease and --leader-elect-identity need --leader-elect")
        return None
    if lease:
        namespace, sep, name = lease.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise UserError(f"--leader-elect-lease {lease!r}: expected NAMESPACE/NAME")
    else:
        namespace, name = _own_namespace(), f"kai-es-{command}" + (f"-{shard}" if shard else "")
    from kai_es.adapters.kubernetes.leader import LeaseTimes  # noqa: PLC0415

    try:
        times = LeaseTimes(_seconds("--leader-elect-lease-duration", duration),
                           _seconds("--leader-elect-renew-deadline", deadline),
                           _seconds("--leader-elect-retry-period", retry))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return LeaderElection(namespace, name, identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
                          times, kubeconfig)


def _own_namespace() -> str:
    """$POD_NAMESPACE, else the in-cluster service account's namespace, else "default"."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or "default"
    except OSError:
        return "default"


shard_option = click.option(
    "--shard", default=None, metavar="NAME",
    help="Run for this scheduling shard (as the informer's --shard NAME=VALUE declares it): its "
         "log is the base --log for `default`, else the topic <topic>.NAME (file: <stem>.NAME"
         "<suffix>), written with its own Kafka transactional id; the default Lease is "
         "kai-es-<command>-NAME.")


def _shard_log(log_url: str, shard: str | None, writer: str) -> tuple[str, str]:
    """The log URL and writer id of a process of `shard` (None: unsharded)."""
    from kai_es.ingest.shards import ShardError, shard_log_url, shard_writer  # noqa: PLC0415

    if shard is None:
        return log_url, writer
    try:
        return shard_log_url(log_url, shard), shard_writer(writer, shard)
    except ShardError as exc:
        raise UserError(f"--shard: {exc}") from None


kubeconfig_option = click.option(
    "--kubeconfig", default=None, type=click.Path(dir_okay=False, exists=True),
    help="Kubeconfig of the cluster (default: $KUBECONFIG, else the in-cluster config).")


@click.command()
@log_option
@click.option("--scenario", "scenario_file", default=None, type=click.Path(dir_okay=False),
              help="Take the scheduler configuration from this scenario's spec.scheduler.")
@click.option("--period", default="1s", show_default=True, help="Real time between cycles.")
@click.option("--snapshot-every", default=50, show_default=True, type=click.IntRange(min=0),
              help="Write a state snapshot every N cycles (0: no snapshots, always full fold).")
@click.option("--checkpoints", default=8, show_default=True, type=click.IntRange(min=0),
              help="Keep up to N past snapshots beside the log (LOG.checkpoints/ for a file log, "
                   "the topic TOPIC.checkpoints for a Kafka one) for `kai-es replay` to start its "
                   "shares from (0: none).")
@time_scale_option
@click.option("--cycles", default=None, type=click.IntRange(min=1), help="Stop after this many cycles (testing).")
@http_option
@leader_options
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False, exists=True),
              help="With --leader-elect: the cluster holding the Lease (default: $KUBECONFIG, "
                   "else the in-cluster config).")
@shard_option
@verbose_option
@packer_option
@friendly
def scheduler(log_url: str, scenario_file: str | None, period: str, snapshot_every: int,
              checkpoints: int, time_scale: float, cycles: int | None, http_address: str | None, leader_elect: bool,
              leader_elect_lease: str | None, leader_elect_identity: str | None,
              leader_elect_lease_duration: str, leader_elect_renew_deadline: str,
              leader_elect_retry_period: str, kubeconfig: str | None, shard: str | None, verbose: bool,
              packer: str | None) -> None:
    """Run the scheduler: fold the log (from a snapshot), then a cycle every PERIOD when there
    is work. Kafka transactional_id: kai-es-scheduler (override with ?transactional_id=); with
    --shard NAME, its shard's log and kai-es-scheduler.NAME."""
    from kai_es.app.processes import SCHEDULER_TXN_ID, run_scheduler  # noqa: PLC0415

    _setup_logging(verbose)
    log_url, writer = _shard_log(log_url, shard, SCHEDULER_TXN_ID)
    config = load_scenario(scenario_file).config if scenario_file else SchedulerConfig()
    warn_unimplemented(config)
    period_s = _seconds("--period", period)
    engine = choose_packer(packer)
    scale = _time_scale(time_scale)
    if kubeconfig is not None and not leader_elect:
        raise UserError("the scheduler reads no cluster: --kubeconfig is for --leader-elect's Lease")
    election = _election("scheduler", kubeconfig, leader_elect, leader_elect_lease, leader_elect_identity,
                         leader_elect_lease_duration, leader_elect_renew_deadline,
                         leader_elect_retry_period, shard)
    if snapshot_every > 0 and config.state_digest_every != 1:
        err.print("warning: snapshots are taken only on cycles whose CycleCompleted carries a "
                  f"state digest (stateDigestEvery={config.state_digest_every})", highlight=False)

    async def body(status: ProcessStatus | None) -> None:
        await run_scheduler(log_url, config, engine, time_scale=scale, period_s=period_s,
                            snapshot_every=snapshot_every, checkpoints=checkpoints, cycles=cycles, on_ready=_ready,
                            status=status, election=election, writer=writer)

    _run(body, "scheduler", http_address)


@click.command()
@log_option
@kubeconfig_option
@click.option("--scenario", "scenario_file", default=None, type=click.Path(dir_okay=False),
              help="Take the no-code grouping rules from this scenario's spec.scheduler.grouping "
                   "(the scheduler's config file).")
@http_option
@leader_options
@click.option("--shard", "shard_specs", multiple=True, metavar="NAME=VALUE",
              help="A scheduling shard (repeat for each): it owns the nodes, queues and PodGroups "
                   "labelled kai.scheduler/node-pool=VALUE (empty VALUE: the unlabelled ones), "
                   "and its own log (the base --log for the shard named default, else "
                   "<topic>.NAME / <stem>.NAME<suffix>). Without --shard: one log, no partition.")
@verbose_option
@friendly
def informer(log_url: str, kubeconfig: str | None, scenario_file: str | None, http_address: str | None,
             leader_elect: bool, leader_elect_lease: str | None, leader_elect_identity: str | None,
             leader_elect_lease_duration: str, leader_elect_renew_deadline: str,
             leader_elect_retry_period: str, shard_specs: tuple[str, ...], verbose: bool) -> None:
    """Run the informer: list + watch Nodes, Pods, Queues, PodGroups, PriorityClasses (and
    the other kinds scheduling reads) and append every change that matters to the log; pods
    that name no PodGroup are grouped as KAI's podgrouper groups them (plus the config's
    no-code grouping rules). Kafka transactional_id: kai-es-informer (kai-es-informer.NAME for
    shard NAME's log)."""
    from kai_es.app.processes import run_informer  # noqa: PLC0415
    from kai_es.ingest.shards import ShardError, ShardMap, shard_log_url  # noqa: PLC0415

    _setup_logging(verbose)
    shards = None
    if shard_specs:
        try:
            shards = ShardMap.parse(shard_specs)
            for name in shards.names:
                shard_log_url(log_url, name)
        except ShardError as exc:
            raise UserError(str(exc)) from None
    config = load_scenario(scenario_file).config if scenario_file else None
    election = _election("informer", kubeconfig, leader_elect, leader_elect_lease, leader_elect_identity,
                         leader_elect_lease_duration, leader_elect_renew_deadline,
                         leader_elect_retry_period)

    async def body(status: ProcessStatus | None) -> None:
        await run_informer(log_url, kubeconfig, on_ready=_ready, status=status, election=election, config=config,
                           shards=shards)

    _run(body, "informer", http_address)


@click.command()
@log_option
@kubeconfig_option
@click.option("--scenario", "scenario_file", default=None, type=click.Path(dir_okay=False),
              help="No Kubernetes: run the simulated cluster of this scenario (with its informer).")
@time_scale_option
@click.option("--poll", default="50ms", show_default=True, help="Real time between log polls.")
@click.option("--stats", "stats_file", default=None, type=click.Path(dir_okay=False),
              help="With --scenario: append bind counters (JSON lines) to this file.")
@click.option("--scheduled-events", is_flag=True,
              help="Also write a Scheduled Event per bound pod (one more API write per pod).")
@click.option("--reservation-image", default=None,
              help="Image of the GPU reservation pods (on a real GPU cluster: one that reports "
                   "its device index, as KAI's resource-reservation image does).")
@click.option("--device-index-wait", default=None,
              help="How long to wait for a reservation pod to report its device index (e.g. 30s; "
                   "default: publish kai-es's own device index at once).")
@http_option
@leader_options
@shard_option
@verbose_option
@friendly
def binder(log_url: str, kubeconfig: str | None, scenario_file: str | None, time_scale: float,
           poll: str, stats_file: str | None, scheduled_events: bool, reservation_image: str | None,
           device_index_wait: str | None, http_address: str | None, leader_elect: bool,
           leader_elect_lease: str | None, leader_elect_identity: str | None,
           leader_elect_lease_duration: str, leader_elect_renew_deadline: str,
           leader_elect_retry_period: str, shard: str | None, verbose: bool) -> None:
    """Run the binder: perform the log's bind and evict decisions through the Kubernetes API
    and append their outcomes (progress kept beside the log, so a restart resumes). With
    --scenario, the simulated cluster instead (rebuilt from the log on restart).
    Kafka transactional_id: kai-es-binder (kai-es-binder.NAME with --shard NAME, on its shard's log)."""
    from kai_es.app.processes import BINDER_TXN_ID, run_binder, run_sim_cluster  # noqa: PLC0415

    _setup_logging(verbose)
    if shard is not None and scenario_file is not None:
        raise UserError("--shard runs a Kubernetes binder for one shard: it excludes --scenario")
    log_url, writer = _shard_log(log_url, shard, BINDER_TXN_ID)
    poll_s = _seconds("--poll", poll)
    scale = _time_scale(time_scale)
    if scenario_file is not None and kubeconfig is not None:
        raise UserError("--scenario (a simulated cluster) and --kubeconfig (a real one) exclude each other")
    if scenario_file is None and stats_file is not None:
        raise UserError("--stats counts the simulated cluster's binds: it needs --scenario")
    if scenario_file is None and time_scale != 1.0:
        raise UserError("--time-scale applies to a simulated cluster: it needs --scenario")
    if scenario_file is not None and (scheduled_events or reservation_image or device_index_wait):
        raise UserError("--scheduled-events, --reservation-image and --device-index-wait apply to "
                        "Kubernetes: they exclude --scenario")
    wait_s = _seconds("--device-index-wait", device_index_wait) if device_index_wait else None
    if scenario_file is not None and leader_elect:
        raise UserError("--leader-elect elects among replicas on Kubernetes: it excludes --scenario")
    election = _election("binder", kubeconfig, leader_elect, leader_elect_lease, leader_elect_identity,
                         leader_elect_lease_duration, leader_elect_renew_deadline,
                         leader_elect_retry_period, shard)

    async def body(status: ProcessStatus | None) -> None:
        if scenario_file is not None:
            scenario = load_scenario(scenario_file)
            await run_sim_cluster(log_url, scenario, time_scale=scale, poll_s=poll_s,
                                  stats_path=stats_file, on_ready=_ready, status=status)
        else:
            await run_binder(log_url, kubeconfig, poll_s=poll_s, scheduled_events=scheduled_events,
                             reservation_image=reservation_image, wait_for_device_index_s=wait_s,
                             on_ready=_ready, status=status, election=election, writer=writer)

    _run(body, "binder", http_address)


COMMANDS = (scheduler, informer, binder)
