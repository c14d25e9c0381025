"""The seams between the pure core and the outside world. One small Protocol per edge.

Implementations live in `kai_es.adapters` (memory, file, Kafka logs; simulated and real clocks
and clusters). `kai_es.app` is the only place that picks and wires them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from kai_es.events import Envelope, Record

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig
    from kai_es.state.model import ClusterState


class SetupError(ValueError):
    """A process cannot start as configured (a log URL, a cluster config, ...): the message says
    why. Supervisors never retry it; the command line reports it in one line (exit 2)."""


class EventLog(Protocol):
    """A totally ordered, append-only log of envelopes.

    Contract:
    - `append` writes all given envelopes atomically (all or none visible) in order and returns
      their positions, which are strictly increasing across calls (not necessarily dense).
    - `read(p)` yields every record with position >= p in order; with `follow=False` it stops at
      the end as of the call, with `follow=True` it waits for new records forever.
    - `end_position()` is a position greater than every readable record's position; reading from
      it yields only records appended later.
    """

    async def append(self, events: Sequence[Envelope]) -> list[int]: ...

    def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]: ...

    async def end_position(self) -> int: ...

    async def claim_writer(self) -> None:
        """Become this log's writer now, before reading: a log with writer identities (Kafka's
        transactional id) fences any older instance holding the same identity and settles
        whatever transaction of ours was in flight, so what we read next includes it. A no-op
        where the log has no writer identity. Raises when the log cannot be reached."""
        ...

    async def check_writer(self) -> None:
        """Raise the log's fencing error (Kafka: `FencedError`) when another instance took over
        this log's writer identity since `claim_writer`, writing nothing any reader sees: how a
        process that has nothing to append learns that it must stop. A no-op where the log has
        no writer identity. Raises when the log cannot be reached."""
        ...

    async def close(self) -> None: ...


class Clock(Protocol):
    """Wall time for the imperative shell. The core never sees it: it reads event logical time.

    `observe(t)`: the process read logical time `t` in the log; from now on `now_ns() >= t`
    (a clock never runs behind the log it writes to)."""

    def now_ns(self) -> int: ...

    def observe(self, logicaltime: int) -> None: ...

    async def sleep_until(self, ns: int) -> None: ...


class IdFactory(Protocol):
    """Fresh ids for observed events (derived events use uuid5 and need no factory)."""

    def new_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What the cluster said to a bind or evict. `ok` with `already=True` means the effect was
    already in place (a replayed decision), which counts as success. A failure with
    `retryable=True` may succeed later unchanged (e.g. an eviction a PodDisruptionBudget refuses
    for now); `retryable=False` is a permanent refusal."""

    ok: bool
    message: str = ""
    already: bool = False
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class ObjectChange:
    """One change of a cluster object as a watch reports it (raw Kubernetes JSON)."""

    kind: str
    action: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: dict[str, object]


@dataclass(frozen=True, slots=True)
class Relist:
    """Every object of one kind that exists now (raw Kubernetes JSON, each with `kind` and
    `apiVersion` set), sent when a watch could not resume (410 Gone): objects of `kind` that
    are not in `objects` are gone. Items of the changes stream after it are newer than it."""

    kind: str
    objects: tuple[dict[str, object], ...]


class ClusterActuator(Protocol):
    """Performs scheduler decisions on the cluster (Kubernetes API or the simulator)."""

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Sequence[int], gpu_groups: Sequence[str]) -> ActionOutcome: ...

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome: ...


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """A state snapshot taken at a cycle cut (see `kai_es.services.snapshotting`)."""

    position: int
    completed_position: int
    cycle: int
    logicaltime: int
    digest: str
    data: bytes  # canonical snapshot bytes (uncompressed)


class SnapshotStore(Protocol):
    """Keeps the newest snapshot. `load_latest` raises `ValueError` for stored bytes it cannot
    decode (never returns a half-read snapshot)."""

    async def save(self, snap: StoredSnapshot) -> None: ...

    async def load_latest(self) -> StoredSnapshot | None: ...

    async def close(self) -> None: ...


class BlobStore(Protocol):
    """Keeps the newest blob of one role (the binder's progress): `load_blob` returns what the
    last completed `save_blob` stored, or None when nothing was ever saved."""

    async def save_blob(self, blob: bytes) -> None: ...

    async def load_blob(self) -> bytes | None: ...

    async def close(self) -> None: ...


class ClusterSource(Protocol):
    """Object changes of the cluster, in the order the cluster made them (per object).

    `list_objects` returns the full current set (for a relist/resync); `changes` yields batches
    of changes after it, waiting for more when none are pending. A batch item is an
    `ObjectChange`, or a `Relist` of one kind when the source lost track of that kind (a source
    that never does simply never yields one).
    """

    async def list_objects(self) -> list[ObjectChange]: ...

    def changes(self) -> AsyncIterator[Sequence[ObjectChange | Relist]]: ...


__all__ = [
    "ActionOutcome",
    "BlobStore",
    "Clock",
    "ClusterActuator",
    "ClusterSource",
    "Envelope",
    "EventLog",
    "IdFactory",
    "ObjectChange",
    "Record",
    "Relist",
    "SetupError",
    "SnapshotStore",
    "StoredSnapshot",
]


class CycleObserver(Protocol):
    """Told of what the scheduler folds and decides (its metrics); sees, never changes."""

    def on_fold(self, record: Record, state: ClusterState) -> None:
        """`record` was just folded into `state`."""

    def on_action(self, name: str) -> None:
        """A cycle's action `name` starts ("": the last one ended)."""

    def on_cycle(self, state: ClusterState, config: SchedulerConfig, decisions: Sequence[Envelope]) -> None:
        """A cycle's decisions were appended and `state` folded past them."""

    def on_upkeep(self, seconds: float) -> None:
        """The upkeep before a cycle (`kai_es.scheduling.upkeep`) took `seconds` (monotonic)."""
