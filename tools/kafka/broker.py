#!/usr/bin/env python3
"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) on 127.0.0.1.

Standard library only. Used two ways:

CLI::

    python3 tools/kafka/broker.py fetch                  # resolve the jars into the cache
    python3 tools/kafka/broker.py run --port 19092       # run until Ctrl-C / SIGTERM

Library (test fixtures)::

    from broker import KafkaBroker           # or load this file with importlib
    with KafkaBroker() as b:                  # fetches, formats a temp dir, starts, waits
        print(b.bootstrap)                    # "127.0.0.1:<free port>"
        b.restart()                           # same data dir and ports
        b.kill()                              # SIGKILL, for fault tests; start() again after

The jars come from Maven Central through ``mvn`` and ``tools/kafka/pom.xml`` and are cached in
``${KAI_ES_CACHE:-~/.cache/kai-es}/kafka/<kafka.version>/libs`` (outside the repo). A marker file
holding the pom's SHA-256 is written last, so an interrupted or outdated fetch is redone.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the helpers both tools share
from toolproc import free_port, pdeathsig_preexec, stop_signals_as_keyboard_interrupt, tail  # noqa: E402

TOOLS_DIR = Path(__file__).resolve().parent
POM = TOOLS_DIR / "pom.xml"
LOG4J2_CONFIG = TOOLS_DIR / "log4j2.properties"

#: Printed by kafka.server.KafkaRaftServer (INFO) once broker and controller are serving.
#: Full line in 4.1.x: "[KafkaRaftServer nodeId=1] Kafka Server started (kafka.server.KafkaRaftServer)".
READY_LINE = "Kafka Server started"
LOG_NAME = "broker.log"
MARKER_NAME = "COMPLETE"

DEFAULT_HEAP = "512m"
#: Measured on the 2-core dev machine: SerialGC + C1-only starts the JVM a little faster and
#: leaves the second core to the test process; the broker's throughput needs here are tiny.
DEFAULT_JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)


class BrokerError(RuntimeError):
    """Base class for this module's errors."""


class FetchError(BrokerError):
    """The broker's jars could not be resolved (no mvn, no network, bad pom...)."""


class BrokerStartError(BrokerError):
    """The broker did not become ready; the message ends with the tail of its log."""


# --------------------------------------------------------------------------------------------
# Jar resolution


def kafka_version() -> str:
    m = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", POM.read_text())
    if not m:
        raise FetchError(f"no <kafka.version> property in {POM}")
    return m.group(1)


def cache_root() -> Path:
    env = os.environ.get("KAI_ES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kai-es"


def version_dir() -> Path:
    return cache_root() / "kafka" / kafka_version()


def libs_dir() -> Path:
    return version_dir() / "libs"


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def is_fetched() -> bool:
    marker = version_dir() / MARKER_NAME
    try:
        return marker.read_text().strip() == _pom_digest() and (libs_dir()).is_dir()
    except OSError:
        return False


def fetch(*, quiet: bool = True) -> Path:
    """Resolve kafka_2.13 + logging backend into the cache; return the libs folder.

    Idempotent and cheap when the cache is complete. Safe against concurrent callers (flock).
    """
    if is_fetched():
        return libs_dir()
    vdir = version_dir()
    vdir.mkdir(parents=True, exist_ok=True)
    with open(vdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fetched():  # another process finished while we waited
            return libs_dir()
        mvn = shutil.which("mvn")
        if mvn is None:
            raise FetchError(
                "`mvn` not found on PATH; install Maven (Debian: apt-get install -y maven)"
            )
        (vdir / MARKER_NAME).unlink(missing_ok=True)
        staging = vdir / f"libs.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        log_path = vdir / "fetch.log"
        cmd = [
            mvn,
            "-B",
            "--no-transfer-progress",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=vdir)
        if rc != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise FetchError(
                f"mvn exited {rc} while resolving Kafka jars ({' '.join(cmd)}); "
                f"last lines of {log_path}:\n{tail(log_path, 40)}"
            )
        jars = sorted(p.name for p in staging.glob("*.jar"))
        if not any(j.startswith("kafka_2.13-") for j in jars):
            raise FetchError(f"mvn succeeded but no kafka_2.13 jar in {staging}: {jars}")
        shutil.rmtree(libs_dir(), ignore_errors=True)
        staging.rename(libs_dir())
        (vdir / MARKER_NAME).write_text(_pom_digest() + "\n")  # last: marks the cache complete
        if not quiet:
            print(
                f"fetched {len(jars)} jars in {time.monotonic() - t0:.1f}s", file=sys.stderr
            )
        return libs_dir()


# --------------------------------------------------------------------------------------------
# Helpers


def _can_connect(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _new_cluster_id() -> str:
    """A random KRaft cluster id (base64 of a UUID). One that starts with '-' would be read as
    an option by the storage tool's argument parser (1 run in 64 failed to start the broker)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerStartError(
            "`java` not found (need Java 17+); Debian: apt-get install -y openjdk-17-jre-headless"
        )
    return java


# --------------------------------------------------------------------------------------------
# The broker


class KafkaBroker:
    """One KRaft broker+controller process on 127.0.0.1.

    ``data_dir`` holds ``server.properties``, ``broker.log`` (JVM stdout+stderr, appended
    across restarts) and ``kraft/`` (Kafka's log dir). When no data_dir is given a temp dir is
    created and removed by :meth:`close` (the context manager's exit). Ports are picked
    automatically when not given and kept across :meth:`restart`.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        controller_port: int | None = None,
        heap: str = DEFAULT_HEAP,
        jvm_flags: tuple[str, ...] = DEFAULT_JVM_FLAGS,
        properties: Mapping[str, str | int] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        if data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="kai-es-kafka-"))
            self._owns_data_dir = True
        else:
            self.data_dir = Path(data_dir).resolve()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._owns_data_dir = False
        self.heap = heap
        self.jvm_flags = tuple(jvm_flags)
        self.extra_properties = dict(properties or {})
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self._log_start = 0
        self.last_start_seconds: float | None = None

    # -- paths / properties -------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def kafka_log_dir(self) -> Path:
        return self.data_dir / "kraft"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def server_properties(self) -> dict[str, str]:
        props: dict[str, str | int] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.kafka_log_dir),
            # One broker: every replication factor / min ISR must be 1, or idempotent and
            # transactional producers hang in InitProducerId.
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            # Fewer internal partitions: faster first FindCoordinator on 2 cores.
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.num.partitions": 1,
            "num.partitions": 1,
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": 0,
            "group.min.session.timeout.ms": 1000,
            # After kill() the restarted broker's registration is refused (duplicate broker
            # registration) until the dead incarnation's session expires: 9 s by default.
            "broker.session.timeout.ms": 3000,
            "broker.heartbeat.interval.ms": 500,
            # Timed-out transactions are aborted within ~1 s of their timeout (default 10 s).
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
        }
        props.update(self.extra_properties)
        return {k: str(v) for k, v in props.items()}

    def _write_config(self) -> None:
        lines = ["# written by tools/kafka/broker.py"]
        lines += [f"{k}={v}" for k, v in self.server_properties().items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def is_formatted(self) -> bool:
        return (self.kafka_log_dir / "meta.properties").exists()

    # -- lifecycle ------------------------------------------------------------------------------

    def _java_cmd(self, libs: Path, main: str, *args: str, heap: str | None = None) -> list[str]:
        cmd = [_java()]
        if heap:
            cmd += [f"-Xms{heap}", f"-Xmx{heap}"]
        cmd += list(self.jvm_flags)
        cmd += [
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]
        return cmd

    def _format(self, libs: Path) -> None:
        cmd = self._java_cmd(
            libs, "kafka.tools.StorageTool", "format",
            "-t", _new_cluster_id(), "-c", str(self.config_path),
        )  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        with open(self.log_path, "a") as f:
            f.write(f"--- storage format (exit {res.returncode})\n{res.stdout}{res.stderr}")
        if res.returncode != 0:
            raise BrokerStartError(
                f"kafka StorageTool format failed (exit {res.returncode}) for {self.data_dir}; "
                f"log tail:\n{tail(self.log_path)}"
            )

    def start(self, timeout_s: float = 120) -> "KafkaBroker":
        """Fetch if needed, format on first start, launch and wait until ready.

        Ready = the KafkaRaftServer "Kafka Server started" line appeared in this start's part
        of the log AND a TCP connect to the PLAINTEXT port succeeds. Raises BrokerStartError
        (with the log tail) if the JVM exits or the timeout passes; the JVM is killed then.
        """
        if self.is_running():
            raise BrokerStartError(f"broker already running (pid {self.pid})")
        deadline = time.monotonic() + timeout_s
        t0 = time.monotonic()
        try:
            libs = fetch()
        except FetchError as e:
            raise BrokerStartError(f"could not fetch Kafka jars: {e}") from e
        self._write_config()
        if not self.is_formatted():
            self._format(libs)
        cmd = self._java_cmd(libs, "kafka.Kafka", str(self.config_path), heap=self.heap)
        self._log_fh = open(self.log_path, "ab")
        self._log_fh.write(f"--- starting broker: {' '.join(cmd)}\n".encode())
        self._log_fh.flush()
        self._log_start = self._log_fh.tell()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            start_new_session=True,  # Ctrl-C in a terminal goes to us, we stop it cleanly
            preexec_fn=pdeathsig_preexec(signal.SIGTERM) if self.die_with_parent else None,
        )
        try:
            self._wait_ready(deadline, timeout_s)
        except BaseException:
            self._terminate(force=True)
            raise
        self.last_start_seconds = time.monotonic() - t0
        return self

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        assert self._proc is not None
        pos = self._log_start
        buf = ""
        saw_line = False
        while True:
            if not saw_line:
                with open(self.log_path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                buf = (buf + chunk.decode("utf-8", "replace"))[-4096:]
                saw_line = READY_LINE in buf
            if saw_line and _can_connect(self.port):
                return
            rc = self._proc.poll()
            if rc is not None:
                raise BrokerStartError(
                    f"Kafka broker exited with code {rc} during startup "
                    f"(port {self.port}, data dir {self.data_dir}); log tail:\n"
                    f"{tail(self.log_path, start=self._log_start)}"
                )
            if time.monotonic() > deadline:
                what = "no TCP connect" if saw_line else f"no {READY_LINE!r} line"
                raise BrokerStartError(
                    f"Kafka broker not ready after {timeout_s:.0f}s ({what}; port {self.port}, "
                    f"data dir {self.data_dir}); log tail:\n"
                    f"{tail(self.log_path, start=self._log_start)}"
                )
            time.sleep(0.05)

    def _terminate(self, *, force: bool, timeout_s: float = 30) -> int | None:
        proc, self._proc = self._proc, None
        rc = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL if force else signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
            else:
                rc = proc.returncode
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        return rc

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM (controlled shutdown), wait up to timeout_s, then SIGKILL. Idempotent."""
        return self._terminate(force=False, timeout_s=timeout_s)

    def kill(self) -> int | None:
        """SIGKILL the broker (an unclean crash); :meth:`start` recovers the same data dir."""
        return self._terminate(force=True)

    def restart(self, timeout_s: float = 120) -> "KafkaBroker":
        """stop() then start() on the same data dir and ports."""
        self.stop()
        return self.start(timeout_s=timeout_s)

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def close(self) -> None:
        """Stop the broker and remove the data dir if this object created it."""
        self.stop()
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "KafkaBroker":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        return f"KafkaBroker({self.bootstrap}, {state}, data_dir={str(self.data_dir)!r})"


# --------------------------------------------------------------------------------------------
# CLI


def _cmd_fetch(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        path = fetch(quiet=False)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"kafka {kafka_version()} ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    print(path)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    broker = KafkaBroker(
        args.port,
        data_dir=args.data_dir,
        controller_port=args.controller_port,
        heap=args.heap,
        die_with_parent=True,
    )
    with stop_signals_as_keyboard_interrupt():
        try:
            try:
                broker.start(timeout_s=args.timeout)
            except BrokerStartError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            print(
                f"kafka {kafka_version()} started in {broker.last_start_seconds:.1f}s "
                f"(pid {broker.pid}); data dir {broker.data_dir}; log {broker.log_path}",
                file=sys.stderr,
            )
            print(f"bootstrap={broker.bootstrap}", flush=True)
            while broker.is_running():
                time.sleep(0.5)
            print(f"error: broker exited; log tail:\n{broker.log_tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("stopping broker...", file=sys.stderr)
            rc = broker.stop()
            print(f"broker stopped (exit {rc})", file=sys.stderr)
            return 0
        finally:
            if args.data_dir is None and not args.keep:
                broker.close()
            else:
                broker.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="resolve the broker jars into the cache; print libs path")
    f.set_defaults(func=_cmd_fetch)
    r = sub.add_parser("run", help="format, start, print bootstrap=..., run until Ctrl-C")
    r.add_argument("--port", type=int, default=None, help="PLAINTEXT port (default: free)")
    r.add_argument("--controller-port", type=int, default=None, help="(default: free)")
    r.add_argument(
        "--data-dir",
        default=None,
        help="data dir (formatted if new, reused if already formatted); default: a temp dir "
        "removed on exit",
    )
    r.add_argument("--keep", action="store_true", help="keep the temp data dir on exit")
    r.add_argument("--heap", default=DEFAULT_HEAP)
    r.add_argument("--timeout", type=float, default=120.0, help="startup timeout, seconds")
    r.set_defaults(func=_cmd_run)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
