"""`kai-es` sub-commands as real OS processes in tests: started in their own session, output to
files, killed with SIGKILL (the whole process group) when a test says so or ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Proc:
    """A `kai-es` sub-command as a process; output goes to files in `dir`."""

    name: str
    args: list[str]
    dir: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0
    history: list[int] = field(default_factory=list)

    @property
    def stderr_path(self) -> Path:
        return self.dir / f"{self.name}.stderr"

    def start(self) -> None:
        assert self.popen is None or self.popen.poll() is not None
        self.starts += 1
        with open(self.stderr_path, "ab") as errf, open(self.dir / f"{self.name}.stdout", "ab") as outf:
            errf.write(f"--- start #{self.starts} at {time.time():.3f}\n".encode())
            errf.flush()
            self.popen = subprocess.Popen([sys.executable, "-m", "kai_es", *self.args],
                                          stdout=outf, stderr=errf, cwd=ROOT,
                                          start_new_session=True)
        self.history.append(self.popen.pid)

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
            self.kills += 1

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def current_stderr(self) -> str:
        """What the CURRENT start wrote to stderr."""
        return self.stderr().rsplit(f"--- start #{self.starts} ", 1)[-1]

    def wait_ready(self, word: str, timeout: float = 60.0) -> None:
        """Wait for the `word ready` line of the CURRENT start."""
        self.wait_output(f"{word} ready", timeout)

    def wait_output(self, text: str, timeout: float = 60.0) -> None:
        """Wait until the CURRENT start has written `text` to stderr."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.current_stderr():
                return
            if not self.alive():
                raise AssertionError(f"{self.name} exited {self.popen and self.popen.returncode}:"
                                     f"\n{self.stderr()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{self.name} wrote no {text!r} after {timeout} s:\n{self.stderr()[-3000:]}")


class Follower:
    """`python -m kai_es ARGS` with its stdout piped, for commands that follow a log: killed
    after `timeout_s` (a follower that never stops fails its test, never hangs it), always
    reaped; after the block, `returncode` and `stderr` say how it ended."""

    def __init__(self, args: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> None:
        self._errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "kai_es", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=self._errors)
        self._watchdog = threading.Timer(timeout_s, self.proc.kill)
        self.returncode: int | None = None
        self.stderr = ""

    def __enter__(self) -> subprocess.Popen[bytes]:
        self._watchdog.start()
        return self.proc

    def __exit__(self, *exc: object) -> None:
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._errors.seek(0)
        self.stderr = self._errors.read().decode()
        self._errors.close()
        self.returncode = self.proc.returncode
