"""The seams between the pure core and the outside world. One small Protocol per edge.

Implementations live in `kai_es.adapters` (memory, file, Kafka logs; simulated and real clocks
and clusters). `kai_es.app` is the only place that picks and wires them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kai_es.events import Envelope, Record


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

    async def close(self) -> None: ...


class Clock(Protocol):
    """Wall time for the imperative shell. The core never sees it: it reads event logical time."""

    def now_ns(self) -> int: ...

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
    "Clock",
    "ClusterActuator",
    "ClusterSource",
    "Envelope",
    "EventLog",
    "IdFactory",
    "ObjectChange",
    "Record",
    "Relist",
]
