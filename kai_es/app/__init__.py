"""The composition root: the only package that chooses adapters and wires them to services.

`kai_es.app` (this module): log URLs to EventLog implementations, the packer, GC settings for
long folds. `kai_es.app.processes`: every long-running process (scheduler, informer, binder,
simulated cluster). `kai_es.app.simulation`: the discrete-event simulation driver. Services and
adapters import only `kai_es.ports` and the core, never each other (import-linter contracts in
pyproject.toml)."""

from __future__ import annotations

import gc
import stat
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kai_es.adapters.file_checkpoints import clear_checkpoints
from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.kafka_tenure import WriterTenure
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.collector import collector_paused
from kai_es.ports import EventLog, SetupError
from kai_es.scheduling.packing import Packer, load_packer

PACKER_ENV_VAR = "KAI_ES_PACKER"


class LogUrlError(SetupError):
    """A log location that cannot be opened; the message says why."""


def open_log(url: str, *, readonly: bool = False, fresh: bool = False,
             writer: str | None = None, tenure: WriterTenure | None = None) -> EventLog:
    """An EventLog for `url`: `kafka://host:port/topic`, `memory:`, or a file path.

    `fresh=True` starts an empty log (a file is truncated); `readonly=True` never writes;
    `writer` names the writing role (on Kafka its transactional id, unless the URL gives
    ``?transactional_id=``). `tenure`: what the role's earlier logs in this process held of
    the writer identity (Kafka: a claim that follows one of ours first checks that no other
    instance claimed the role since); the other logs have no shared identity to check.
    """
    if url.startswith("kafka://"):
        try:
            from kai_es.adapters.kafka_log import KafkaEventLog, parse_url  # noqa: PLC0415 - optional backend
        except ImportError as exc:
            raise LogUrlError(f"{url}: the Kafka log is not available in this build ({exc})") from None
        txn = None if readonly else (parse_url(url).transactional_id or writer)
        return KafkaEventLog.from_url(url, transactional_id=txn, create=False if readonly else None,
                                      tenure=tenure)
    if url == "memory:":
        return MemoryEventLog()
    path = Path(url)
    if fresh and not readonly:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        clear_checkpoints(path)  # (the former log's: they would only be checked and refused)
    if readonly and not path.exists():
        raise LogUrlError(f"{url}: no such log file")
    if path.exists() and not path.is_file():
        raise LogUrlError(f"{url}: {_not_a_file(path)}: an event log must be a regular file (kai-es indexes "
                          "and verifies it in place); save a stream to a file first (cat > events.jsonl)")
    return FileEventLog(path, readonly=readonly)


def _not_a_file(path: Path) -> str:
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    return "is not a regular file"


@contextmanager
def bulk_fold(*, keep: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector while folding many records (replay, reports, cold
    start). The folded state has no reference cycles worth scanning; collection resumes after,
    so nothing is leaked. Measured: +20% fold throughput on a 1,000,000-event log.

    `keep`: what was built is kept until the process ends (a one-shot command's workload and
    runs): it is moved out of the collector's reach (`gc.freeze`) before collection resumes,
    instead of being scanned once by the first collection after (every object allocated
    meanwhile is in the youngest generation: 1.2 s for a million-record what-if). Objects it
    drops are still freed by reference counting; only reference cycles made meanwhile stay."""
    with collector_paused(freeze=keep):
        yield


def packer_from_env(kind: str | None = None) -> Packer:
    """The packer named by `kind`, else by `KAI_ES_PACKER` (unset or empty: native). An
    unknown name is a ValueError; a missing native module raises, it never falls back."""
    choice = kind or os.environ.get(PACKER_ENV_VAR, "").strip() or "native"
    if choice not in ("native", "reference"):
        raise ValueError(f"{PACKER_ENV_VAR}={choice!r}: expected 'native' or 'reference'")
    return load_packer("reference" if choice == "reference" else "native")


def freeze_long_lived() -> None:
    """Move everything allocated so far (a long-running service's state, folded at start) out of
    the cyclic collector's reach: otherwise each of its full passes re-scans that state. Objects
    frozen here are still freed by reference counting when the state drops them (the state holds
    no reference cycles). Measured on a 10,000-pod state: folding one more pod event 30 us -> 10
    us. No collection first: the state was folded with the collector paused (`bulk_fold`), so
    every object of it is young and a collection would walk them all (5.5 s at 700,000 pods, to
    find nothing: none of the state is garbage, and a restored 140,000-pod state left 24 cyclic
    objects to collect); what cyclic garbage exists now (a few objects of the start) is frozen
    with the rest, once per process."""
    gc.freeze()
