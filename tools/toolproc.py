"""What the test-service tools (tools/kafka/broker.py, tools/k8s/controlplane.py) share: free
ports, log tails, children that die with their parent, and SIGINT/SIGTERM as KeyboardInterrupt.
Standard library only: each tool puts tools/ on its path and imports this module, whether it runs
as a script or is loaded by path from the tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


def tail(path: Path, lines: int = 60, start: int = 0) -> str:
    """The last `lines` lines of a log file (of at most its last 256 KiB after `start`)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - 256 * 1024))
            data = f.read()
    except OSError as e:
        return f"<no log: {e}>"
    text = data.decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:]) if text else "<log is empty>"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pdeathsig_preexec(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive `sig` when the thread that started it dies
    (Linux PR_SET_PDEATHSIG), so a crashed or SIGKILLed test run does not leak servers holding
    ports. The signal fires when the *thread* that forked exits, so it is only armed when starting
    from the main thread (a server started from a worker thread would die with that thread).
    libc is looked up here, in the parent; the child only makes the call. None: not armed."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    number = int(sig)

    def preexec() -> None:
        prctl(1, number, 0, 0, 0)  # PR_SET_PDEATHSIG = 1

    return preexec


@contextlib.contextmanager
def stop_signals_as_keyboard_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt while inside (SIGINT too: a shell starting
    `tool.py run &` makes the job ignore SIGINT)."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
