"""What every `kai-es` command shares: one-line user errors (exit 2), warnings, the consoles,
the packer option. Text from the user's files is never read as rich markup, and control
characters are escaped, so a name cannot forge lines or styles."""

from __future__ import annotations

import os
import re
import stat
import sys
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import anyio
import click
from rich.console import Console
from rich.markup import escape

from kai_es.adapters.file_log import CorruptLogError, FileEventLog
from kai_es.app import packer_from_env
from kai_es.events import DecodeError, Record, decode
from kai_es.ports import SetupError
from kai_es.scenario import ScenarioError
from kai_es.scheduling.config import ConfigError, SchedulerConfig
from kai_es.scheduling.packing import NativePackerUnavailable, Packer
from kai_es.scheduling.policy import policy_for

F = TypeVar("F", bound=Callable[..., Any])
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        text = " ".join(part.strip() for part in self.message.splitlines() if part.strip())
        err.print(f"[bold red]error:[/] {escape(one_line(text))}", highlight=False)


def require_plots(command: str) -> None:
    """Refuse, before any work, a command whose report has PNG plots where matplotlib is not
    installed (the `plots` extra; the container image leaves it out)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserError(f"kai-es {command} draws its report's plots with matplotlib, which is not "
                        "installed here (the container image leaves it out): pip install 'kai-es[plots]'")


def warn(message: str) -> None:
    """One warning line on stderr (never markup)."""
    err.print(f"[bold yellow]warning:[/] {escape(one_line(message))}", highlight=False)


def one_line(text: str) -> str:
    """`text` with control characters (newlines included) escaped: one line, nothing forged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    code = ord(c)
    if c in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c]
    if unicodedata.category(c).startswith("C") or unicodedata.category(c) in ("Zl", "Zp"):
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return c


def os_error_line(exc: OSError) -> str:
    """One line for an OSError: the file it was about and why."""
    what = exc.strerror or str(exc)
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    return f"{' -> '.join(str(n) for n in names)}: {what}" if names else what


def friendly(fn: F) -> F:
    """Turn expected failures into one-line messages (exit 2)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if isinstance(exc, _expected_errors()):
                raise UserError(str(exc)) from None
            if isinstance(exc, BrokenPipeError):
                _quiet_closed_stdout()
                sys.exit(0)  # the reader stopped reading (`| head`): a normal end
            if isinstance(exc, OSError):  # no permission, a full disk, a directory for a file, ...
                raise UserError(os_error_line(exc)) from None
            raise

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper  # type: ignore[return-value]


def working(what: str) -> AbstractContextManager[object]:
    """A transient spinner naming `what` on stderr while a step runs, when stderr is a terminal
    (a pipe or a file gets no spinner frames)."""
    return err.status(escape(what)) if err.is_terminal else nullcontext()


def _quiet_closed_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a closed pipe neither fails
    nor prints."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _expected_errors() -> tuple[type[Exception], ...]:
    """The errors a command reports in one line. The Kafka backend's are among them only once a
    command has loaded it (an error of a module never imported cannot have been raised), so a
    command on a file log does not import the Kafka client to be ready for them."""
    kafka = sys.modules.get("kai_es.adapters.kafka_log")
    backend = () if kafka is None else (kafka.FencedError, kafka.KafkaLogError)
    return (ScenarioError, ConfigError, CorruptLogError, DecodeError, SetupError, NativePackerUnavailable,
            *backend)


def choose_packer(kind: str | None) -> Packer:
    try:
        return packer_from_env(kind)
    except ValueError as exc:
        raise UserError(str(exc)) from None


packer_option = click.option("--packer", type=click.Choice(["native", "reference"]), default=None,
                             help="GPU packer engine (default: native C; env KAI_ES_PACKER).")


def warn_unimplemented(config: SchedulerConfig) -> None:
    """One warning line when the config lists actions that its policy version accepts but does
    not run (kai-es/v1 accepts the names of actions it never implemented; later versions refuse
    them when the config is parsed). Also used by `kai-es scheduler`."""
    runs = policy_for(config.policy_version).actions
    idle = [a for a in config.action_list if a not in runs]
    if idle:
        warn(f"the scheduler config lists actions that do not run: {', '.join(idle)} "
             f"(policy {config.policy_version} runs only {', '.join(sorted(runs))})")


def records(events: Any) -> Iterator[Record]:
    """Every record of a log opened by `kai_es.app.open_log`, in order (`records_from` 0)."""
    return records_from(events, 0)


def records_from(log: Any, position: int, *, threaded: bool = False) -> Iterator[Record]:
    """The records of `log` at `position` and after, streamed: a file log is scanned in place; a
    Kafka log is read to its end as of the call by a reader process (`adapters.kafka_frames`:
    memory does not grow with the log), a record that does not decode skipped and dead-lettered
    as `KafkaEventLog.read` does; a memory log is read whole. `threaded`: the caller runs other
    threads, which a forked reader must not inherit mid-work (a lock one holds stays held in
    the child): a Kafka log is then read whole in this process, as a memory log is."""
    if isinstance(log, FileEventLog):
        yield from log.scan(position)
        return
    from kai_es.adapters.kafka_log import KafkaEventLog  # noqa: PLC0415 - optional backend

    if isinstance(log, KafkaEventLog) and not threaded:
        yield from _kafka_records(log, position)
        return

    async def collect() -> list[Record]:
        try:
            return [r async for r in log.read(position)]
        finally:
            await log.close()

    yield from anyio.run(collect)


def _kafka_records(log: Any, position: int) -> Iterator[Record]:
    from kai_es.adapters.kafka_frames import Skipped, dead_letter_all, end_offset, kafka_frames  # noqa: PLC0415

    skipped: list[Skipped] = []
    try:
        for offset, value in kafka_frames(log, position, end_offset(log)):
            try:
                env = decode(value)
            except DecodeError as exc:
                skipped.append((offset, value, str(exc)))
                continue
            yield Record(offset, env)
    finally:
        if skipped:
            dead_letter_all(log, skipped)


#: what a Scenario name may be when it names files under out/
_OUT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def check_out_name(name: str) -> None:
    """Refuse a Scenario name that would put the default log or report outside out/."""
    if not _OUT_NAME.fullmatch(name) or ".." in name:
        raise UserError(f"the Scenario name {name!r} cannot name files under out/ (it would write "
                        "elsewhere): use letters, digits, '.', '-' and '_', or give --log and --report")


def holds_data(path: str) -> bool:
    """Whether `path` is an existing regular file with something in it."""
    try:
        info = os.stat(path)
    except OSError:
        return False  # missing, or opening it reports the problem
    return stat.S_ISREG(info.st_mode) and info.st_size > 0
