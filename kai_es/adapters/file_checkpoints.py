"""Checkpoints of a file log: past scheduler snapshots kept beside the log, so that a replay can
start its later shares from them instead of folding the log from its beginning
(`kai_es.replay_parallel`).

``<log>.checkpoints/<position>.checkpoint`` holds the snapshot taken at the cycle cut
`position` (12 digits or more), in the stored form of every snapshot (`adapters.snapshot_codec`: a JSON
header line, then the compressed state), written to a temp file and renamed, so a crash leaves
whole files only. At most `keep` are kept, spread over the log: when a save makes one too many,
the checkpoint whose removal leaves the smallest gap between its neighbours goes (the log's
start counts as the first neighbour; the newest always stays). Only files named so are read or
removed; anything else in the folder is left alone.

Contract: a checkpoint is a hint, never the source of truth. Its header is read without its
body (`list_checkpoints`), and what a replay does with one is validated against the log there
(`replay_parallel`). A file whose header does not decode is skipped with the reason.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kai_es.adapters.snapshot_codec import SnapshotFormatError, decode_header, decode_stored
from kai_es.ports import StoredSnapshot

log = logging.getLogger(__name__)

#: checkpoints a scheduler keeps by default (each the size of one compressed snapshot)
DEFAULT_KEEP = 8
#: a checkpoint's file name: its position in (at least) 12 digits, so names sort as positions
#: up to 10**12 and a larger position (a long-lived Kafka offset) still reads back
_NAME = re.compile(r"^(\d{12,})\.checkpoint$")


def checkpoint_dir(log_path: str | os.PathLike[str]) -> Path:
    """The folder of `log_path`'s checkpoints."""
    return Path(f"{os.fspath(log_path)}.checkpoints")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint's header: its cut, its cycle's CycleCompleted position, cycle number and
    recorded digest, and its file."""

    position: int
    completed_position: int
    cycle: int
    digest: str
    path: Path

    @property
    def where(self) -> str:
        """Where it is, for messages."""
        return str(self.path)

    def load(self) -> StoredSnapshot:
        """The whole stored snapshot (raises OSError or SnapshotFormatError)."""
        return decode_stored(self.path.read_bytes())


def _own_files(folder: Path) -> list[tuple[int, Path]]:
    """(position, path) of the files named as checkpoints in `folder`, by position."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        m = _NAME.match(name)
        if m is not None:
            out.append((int(m.group(1)), folder / name))
    return sorted(out)


def list_checkpoints(log_path: str | os.PathLike[str]) -> list[Checkpoint]:
    """The readable checkpoints of `log_path`, by position (a file whose header does not decode,
    or names another position than its file name, is skipped with a warning)."""
    found = []
    for position, path in _own_files(checkpoint_dir(log_path)):
        try:
            with open(path, "rb") as f:
                header = decode_header(f.readline())
        except (OSError, SnapshotFormatError) as exc:
            log.warning("checkpoint %s skipped: %s", path, exc)
            continue
        if header.position != position:
            log.warning("checkpoint %s skipped: its header says position %d", path, header.position)
            continue
        found.append(Checkpoint(position, header.completedposition, header.cycle, header.digest, path))
    return found


def clear_checkpoints(log_path: str | os.PathLike[str]) -> int:
    """Remove the checkpoints of `log_path` (a log started afresh has none of its former self's),
    and their folder when nothing else is in it; returns how many were removed."""
    folder = checkpoint_dir(log_path)
    files = _own_files(folder)
    for _, path in files:
        path.unlink(missing_ok=True)
    if files:
        try:
            folder.rmdir()
        except OSError:  # something not ours is in it: left alone
            pass
    return len(files)


def thinned(positions: list[int], keep: int) -> list[int]:
    """The positions to remove so that at most `keep` of the sorted `positions` stay: one at a
    time, the one (never the newest) whose removal leaves the smallest gap between its
    neighbours, position 0 standing before the first (ties: the older)."""
    left = list(positions)
    gone = []
    while len(left) > max(1, keep):
        points = [0, *left]
        i = min(range(1, len(points) - 1), key=lambda k: (points[k + 1] - points[k - 1], k))
        gone.append(left.pop(i - 1))
    return gone


def save_checkpoint(log_path: str | os.PathLike[str], position: int, blob: bytes, keep: int = DEFAULT_KEEP,
                    *, same_as: Path | None = None) -> Path:
    """Write `blob`, the stored form (`encode_stored`) of the snapshot at cut `position`, as a
    checkpoint of `log_path` and thin the folder to `keep` (module docstring); returns its file.
    `same_as`: a file already holding exactly `blob` (the newest snapshot's), linked instead of
    written again when the file system allows (tens of MB at 20,000 nodes)."""
    folder = checkpoint_dir(log_path)
    folder.mkdir(exist_ok=True)
    path = folder / f"{position:012d}.checkpoint"
    tmp = folder / f".{position:012d}.checkpoint.tmp"
    tmp.unlink(missing_ok=True)
    try:
        if same_as is None:
            raise OSError("nothing to link")
        os.link(same_as, tmp)
    except OSError:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    files = dict(_own_files(folder))
    for position in thinned(sorted(files), keep):
        try:
            files[position].unlink()
        except FileNotFoundError:
            pass
    return path


__all__ = ["DEFAULT_KEEP", "Checkpoint", "checkpoint_dir", "clear_checkpoints", "list_checkpoints",
           "save_checkpoint", "thinned"]
