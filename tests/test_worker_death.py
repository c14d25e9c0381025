"""A worker process that dies is an error naming its exit code, wherever it died: between two
messages (the pipe ends) or while sending one (the pipe ends inside it, which multiprocessing
reports as an OSError, not an EOFError): a Kafka reader (`kai_es.adapters.kafka_frames`) and a
`kai-es whatif` worker (`kai_es.cli_whatif._Forked`)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import struct
from collections.abc import Callable

import pytest

from kai_es.adapters.kafka_frames import _receive
from kai_es.adapters.kafka_log import KafkaLogError


def _die_midway(fd: int) -> None:
    os.write(fd, struct.pack("!i", 1 << 20) + b"x" * 4096)  # a 1 MiB message's first 4 KiB
    os.kill(os.getpid(), signal.SIGKILL)


def _die_between(fd: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("dies", [_die_midway, _die_between])
def test_a_reader_killed_is_a_kafka_log_error_naming_its_exit_code(dies: Callable[[int], None]) -> None:
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    reader = context.Process(target=dies, args=(send.fileno(),), daemon=True)
    reader.start()
    send.close()
    try:
        with pytest.raises(KafkaLogError, match=r"topic 't' ended without finishing \(exit code -9\)"):
            _receive(receive, reader, "t")
    finally:
        receive.close()
        reader.join()


def test_a_whatif_worker_killed_while_sending_its_result_is_named_with_its_exit_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for `kai-es whatif`'s workers (`cli_whatif._Forked`): one killed while it sends
    its result (here: its send is made to stop after a part of the message, then the process is
    killed) is a RuntimeError naming the exit code, not multiprocessing's OSError."""
    from multiprocessing.connection import Connection

    from kai_es.cli_whatif import _Forked

    def send_part(self: Connection, obj: object) -> None:
        _die_midway(self.fileno())

    monkeypatch.setattr(Connection, "send", send_part)  # (the forked worker inherits it)
    worker = _Forked(lambda: b"result")
    try:
        with pytest.raises(RuntimeError, match=r"ended without a result \(exit code -9\)"):
            worker.result()
    finally:
        worker.stop()
