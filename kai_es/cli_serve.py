"""`kai-es serve LOG`: the read-only web view of a log (file or ``kafka://``), live. The view
itself is `kai_es.serve` (HTTP, following) over `kai_es.visibility` (pure pages); this module
parses the command line, opens the log and wires them. `kai_es.cli` registers `COMMANDS`."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import click

from kai_es.app import open_log
from kai_es.cli_common import UserError, console, friendly, records_from
from kai_es.events import Record
from kai_es.serve.bind import DEFAULT_BIND, serve_address
from kai_es.serve.follow import Follower
from kai_es.serve.http import Site, ViewServer, records_at, whatif_file
from kai_es.visibility.live import LiveView


#: default of --keep-timelines: about 120 MiB of timelines before finished jobs' are dropped
KEEP_TIMELINES = 100_000


@click.command(name="serve")
@click.argument("log_url")
@click.option("--bind", "bind", default=DEFAULT_BIND, show_default=True,
              help="HOST:PORT to listen on (port 0: any free one). Loopback only, unless --allow-remote.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --bind address that is not loopback (the pages show every name in the log).")
@click.option("--whatif", "whatif", default=None, type=click.Path(),
              help="A `kai-es whatif` report directory (or its whatif.json) for the what-if page.")
@click.option("--poll", "poll_ms", default=1000, type=click.IntRange(min=100), show_default=True,
              help="How often (ms) an open page asks whether the log has grown.")
@click.option("--keep-timelines", "keep_timelines", default=KEEP_TIMELINES, type=click.IntRange(min=1),
              show_default=True,
              help="Job timelines kept in memory (about 1.2 KB each); past it, finished jobs' are dropped "
                   "and their pages read from the log.")
@friendly
def serve(log_url: str, bind: str, allow_remote: bool, whatif: str | None, poll_ms: int, keep_timelines: int) -> None:
    """Serve a read-only web view of LOG (file path or kafka://), following it as it grows: the
    queue tree with fair share and allocation over time, pending jobs with their positions and
    reasons, each job's timeline, the decision stream, and a what-if comparison."""
    host, port = serve_address(bind, allow_remote)
    whatif_path = whatif_file(whatif) if whatif is not None else None
    log = open_log(log_url, readonly=True)

    def job_records() -> Iterator[Record]:
        return records_from(open_log(log_url, readonly=True), 0, threaded=True)

    view = LiveView(keep_timelines=keep_timelines)
    lock = threading.Lock()
    follower = Follower(log, view, lock)
    site = Site(view, lock, follower, source=log_url, job_records=job_records, whatif=whatif_path,
                poll_ms=poll_ms, records_at=records_at(log, lambda: open_log(log_url, readonly=True)))
    try:
        server = ViewServer(site, host, port)
    except OSError as exc:
        raise UserError(f"--bind {bind}: cannot listen there: {exc.strerror or exc}") from None
    follower.start()

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    console.print(f"serving {log_url} read-only on {server.url} (Ctrl-C stops)", highlight=False, markup=False)
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


#: the commands this module adds to `kai-es` (registered by kai_es.cli)
COMMANDS: tuple[click.Command, ...] = (serve,)
