"""What a command may write over: the one rule every file-writing command goes through.

Contract (`check_log_output`, `check_report_dir`): a command never overwrites
- one of its own inputs (the scenario, the recorded log, a patch or config file it reads), with
  or without `--force`, however the path is spelt (it is resolved, links followed);
- a file that is not a kai-es event log: a non-empty regular file whose first line is not a
  framed kai-es event is somebody else's data, refused with or without `--force`;
- an event log, unless the command is told to replace it (`replace=True`: `--force`, or the
  default path of a previous run of the same command);
- anything that is not a regular file (a directory, a pipe, a device) as a log.
A report directory is written only when it is missing, empty, or marked as a kai-es report
(`REPORT_MARKER`, written with the report); in any other directory the report's files must not
exist yet. Violations raise `OutputError` naming the path and the reason.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from kai_es.adapters.framing import HEAD, Reason, line_reason
from kai_es.events import DecodeError, decode

#: a file in every report directory kai-es writes, so a later run may replace its files
REPORT_MARKER: Final = ".kai-es-report"
#: how much of a file is read to tell whether it is a kai-es event log
_FIRST_LINE_LIMIT: Final = 1 << 20


class OutputError(ValueError):
    """A file or directory a command must not write; the message says which and why."""


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def is_event_log(path: str | os.PathLike[str]) -> bool:
    """Whether the regular file at `path` starts with a framed kai-es event (an empty file is
    one: the log of a run that wrote nothing yet)."""
    with open(path, "rb") as f:
        head = f.read(_FIRST_LINE_LIMIT)
    if not head:
        return True
    line = head.split(b"\n", 1)[0]
    if line_reason(line + b"\n") is not Reason.OK:  # the end of a batch, or a batch going on
        return False
    body = line[HEAD:]
    try:
        decode(body)
    except DecodeError:
        return False
    return True


def check_log_output(path: str, *, inputs: Iterable[str], replace: bool, option: str = "--log") -> None:
    """Refuse to write the event log `path` where the module contract forbids it."""
    for given in inputs:
        if _same_file(path, given):
            raise OutputError(f"{option} {path} is also this command's input {given}: refusing to overwrite it")
    try:
        info = os.stat(path)
    except OSError:
        return  # missing, or not reachable: creating the log reports why
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{option} {path} is not a regular file: refusing to write an event log there")
    if info.st_size == 0:
        return
    if not is_event_log(path):
        raise OutputError(f"{option} {path} holds {info.st_size} bytes that are not a kai-es event log: "
                          "refusing to overwrite a file kai-es did not write (choose another path)")
    if not replace:
        raise OutputError(f"{option} {path} already exists and holds {info.st_size} bytes: refusing to "
                          "overwrite an event log (pass --force to replace it, or choose another file)")


def check_report_dir(path: Path, files: Iterable[str], *, inputs: Iterable[str] = ()) -> None:
    """Refuse to write the report `files` into `path` where the module contract forbids it."""
    if path.exists() and not path.is_dir():
        raise OutputError(f"--report {path} is not a directory")
    names = list(files)
    for given in inputs:
        for name in names:
            if _same_file(path / name, given):
                raise OutputError(f"--report {path} would overwrite this command's input {given}")
    if not path.exists() or (path / REPORT_MARKER).exists():
        return
    taken = sorted(name for name in names if (path / name).exists())
    if taken:
        raise OutputError(f"--report {path} already holds {', '.join(taken)}, not written by kai-es "
                          f"(no {REPORT_MARKER} there): refusing to overwrite them (choose another directory)")


def mark_report_dir(path: Path) -> None:
    """Create `path` if needed and mark it as a kai-es report directory."""
    path.mkdir(parents=True, exist_ok=True)
    marker = path / REPORT_MARKER
    if not marker.exists():
        marker.write_text("written by kai-es: its report files here may be replaced by a later run\n")
