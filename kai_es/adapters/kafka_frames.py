"""A Kafka log's records as a plain iterator, read by a process of their own.

Why: a one-shot command (`kai-es replay`, `events`, `usage`, `whatif`) over a Kafka log used to
collect the whole log in memory before its first record was looked at (2.2 GB of resident memory
for 1,000,000 events: a long production history did not fit a machine), and the consumer's own
work (~2.7 µs a record in aiokafka) ran on the core that folds. Here a forked reader process
reads the topic (`KafkaEventLog.read_raw`: Fetch answers read directly, `kafka_fetch`, about a
quarter of the consumer's CPU a record) and hands each batch of undecoded (offset, value)
pairs over a pipe; the caller decodes them. The pipe holds at most the batch in flight, so the
reader runs at most one batch ahead of the caller (memory bounded by one Fetch answer's size,
`kafka_fetch.fetch_frames`' `max_bytes`, 8 MiB) while fetching in parallel with it.

Contract:
- `kafka_frames(log, start, end)` yields (offset, value) for every record at `start` <= offset <
  `end` (None: the last stable offset as of the call), in order; a value is the record's bytes,
  or None for a record without one. Nothing is decoded or dead-lettered here: the caller does it
  (`dead_letter_all`), as `read` would.
- A failure of the reader (the broker unreachable, the topic missing) is raised in the caller as
  `KafkaLogError` with the reader's message; a reader that dies without one raises it too.
- Closing the iterator early (a replay that found a divergence) stops the reader at once: no
  process outlives the iterator.
- The reader is forked (POSIX): it takes the log object, security settings included, as it is.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final, TypeVar

import anyio

from kai_es.adapters.kafka_log import KafkaEventLog, KafkaLogError

Frame = tuple[int, bytes | None]
T = TypeVar("T")
#: a record a caller skipped because it does not decode: its offset, its value, why
Skipped = tuple[int, bytes | None, str]
#: messages of the reader (kind, payload): a batch of frames, the end, or a failure's message
_BATCH: Final = "batch"
_END: Final = "end"
_ERROR: Final = "error"


def _pump(log: KafkaEventLog, start: int, end: int | None, conn: Any) -> None:
    """Read [start, end) of `log` and send it over `conn` batch by batch (pickled: cheaper for
    the caller than sending the values end to end and slicing them), then the end; a failure is
    sent as its message (the caller raises it)."""

    async def read() -> None:
        try:
            async for batch in log.read_raw(start, end):
                conn.send((_BATCH, batch))
        finally:
            await log.close()

    _own_stderr()
    try:
        try:
            anyio.run(read)
        except (BrokenPipeError, ConnectionResetError):
            return  # the caller closed the iterator early
        except Exception as exc:  # every other failure goes to the caller, who raises it
            conn.send((_ERROR, str(exc) if isinstance(exc, KafkaLogError) else f"{type(exc).__name__}: {exc}"))
            return
        conn.send((_END, None))
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        conn.close()


def _own_stderr() -> None:
    """Give the forked reader a stderr object of its own, and point the logging handlers that
    wrote to the inherited one at it: a thread of the caller (a spinner redrawing itself) may
    have held the inherited object's lock at the fork, and a lock copied held stays held here.
    (The logging module's own locks are re-made at a fork by Python itself.)"""
    inherited = sys.stderr
    try:
        own = open(2, "w", buffering=1, closefd=False, encoding=getattr(inherited, "encoding", None) or "utf-8",
                   errors="backslashreplace")
    except OSError:  # no stderr at all: nothing to write to, nothing to block on
        return
    sys.stderr = own
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is inherited:
            handler.stream = own  # (not setStream: it would flush the inherited object first)


def _closing(log: KafkaEventLog, step: Callable[[], Awaitable[T]]) -> T:
    """`step()` run to its end in an event loop of its own, `log`'s clients closed after (they
    belong to that loop; a reader forked later starts its own)."""

    async def run() -> T:
        try:
            return await step()
        finally:
            await log.close()

    return anyio.run(run)


def end_offset(log: KafkaEventLog) -> int:
    """`log`'s last stable offset now."""
    return _closing(log, log.end_position)


def dead_letter_all(log: KafkaEventLog, skipped: Sequence[Skipped]) -> None:
    """Each of `skipped` (a record a caller found undecodable: its offset, value and why)
    dead-lettered as `KafkaEventLog.read` does it (`KafkaEventLog.dead_letter`)."""

    async def send() -> None:
        for offset, value, reason in skipped:
            await log.dead_letter(offset, value, reason)

    _closing(log, send)


def _receive(receive: Connection, reader: BaseProcess, topic: str) -> tuple[str, Any]:
    """The reader's next message; a reader gone (exited, or killed while it was sending: the
    pipe ends inside a message) is a KafkaLogError naming its exit code."""
    try:
        message: tuple[str, Any] = receive.recv()
    except (EOFError, OSError):
        reader.join(5)
        raise KafkaLogError(f"the reader of Kafka topic {topic!r} ended without finishing "
                            f"(exit code {reader.exitcode})") from None
    return message


def kafka_frames(log: KafkaEventLog, start: int = 0, end: int | None = None) -> Generator[Frame, None, None]:
    """(offset, value) of every record of `log` in [start, end) (module contract)."""
    context = multiprocessing.get_context("fork")  # (the log and its settings go as they are)
    receive, send = context.Pipe(duplex=False)
    reader = context.Process(target=_pump, args=(log, start, end, send), daemon=True,
                             name=f"kai-es kafka reader {log.topic}")
    reader.start()
    send.close()  # (the reader's end: only the reader holds it now, so its exit is an EOF here)
    try:
        while True:
            kind, payload = _receive(receive, reader, log.topic)
            if kind == _BATCH:
                yield from payload
            elif kind == _END:
                return
            else:
                raise KafkaLogError(payload)
    finally:
        receive.close()
        if reader.is_alive():
            reader.kill()
        reader.join()


class KafkaRange:
    """`log` read by ranges (`replay_parallel.Frames`): each range by a reader of its own."""

    def __init__(self, log: KafkaEventLog) -> None:
        self.log = log

    def frames(self, start: int, end: int) -> Iterator[Frame]:
        return kafka_frames(self.log, start, end)

    def bodies_at(self, positions: Iterable[int]) -> dict[int, bytes | None]:
        """The value at each of `positions` that has a record, read in this process by one
        consumer (`KafkaEventLog.read_at`: a reader process per position cost ~60 ms each)."""
        return _closing(self.log, lambda: self.log.read_at(positions))
