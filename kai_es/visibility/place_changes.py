"""A waiting job's place over one wait, kept as the changes of it: the cycle each new place took
effect in, not one entry per cycle, and at most `2 * KEPT` of them however long the wait. Pure.

A wait (`kai-es explain`'s `wait` entry, `explain._Run`) is a stretch of cycles with one verdict;
the job's place moves within it as jobs ahead of it are placed, leave or arrive. Each change says
where the job stood from that cycle on: its place in its queue (`positions.position`, taken at
the cycle's cut) and in the order that cycle tried the jobs in (kai-es/v13 on, read when the
cycle completed).

Contract:
- A place is read from a `Placed`: a cycle, its cut's log position and logical time, the job's
  queue, (n, of) in that queue — None when the job was not in its queue's order — and (n, of)
  in the cycle's tried order — None when the cycle recorded no order or the job was not in it.
  A tried-order place without a queue place is no place (as `explain` shows none then). A
  `Change` is a `Placed` as kept; explain's cut is another.
- `moved(before, after)` is whether `after` is another place than `before`: another queue, or
  another rank in the queue or in the tried order. The `of` counts alone do not move a job (jobs
  joining or leaving behind it leave it where it is); a change carries the counts of its cycle.
  It allocates nothing: it runs at every cycle of every waiting job `kai-es serve` keeps.
- `PlaceChanges(first)` is a wait's changes, `first` (its first cycle's place) first; `add(placed)`
  appends one keeping the first `KEPT` and the last `KEPT`: once there are `2 * KEPT`, the oldest
  of the last `KEPT` is dropped and counted in `elided` (so the elided ones lay between the first
  half of the list and the second). Iterating gives the `Change`s kept, in order. A wait keeps
  at most `2 * KEPT` changes whatever its length, each as 7 machine integers and a reference to
  its queue's name (64 bytes: `kai-es serve` keeps a timeline per job; Python integers instead
  for a wait with a number beyond 64 bits); the caller makes one only once the place has moved
  (a wait that stood still needs none: its first cut says where).
- `change_json(placed)` is a place as explain's JSON gives it (docs/explain.md).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

from kai_es.events.timefmt import rfc3339

#: how many changes of a wait are kept at its start, and how many at its end
KEPT = 16


class Placed(Protocol):
    """What a place is read from: a cycle (its cut's log position and logical time), the job's
    queue, (n, of) in it and (n, of) in the tried order. A `Change` is one; so is explain's cut."""

    @property
    def cycle(self) -> int: ...

    @property
    def position(self) -> int: ...

    @property
    def time_ns(self) -> int: ...

    @property
    def queue_name(self) -> str: ...

    @property
    def place(self) -> tuple[int, int] | None: ...

    @property
    def cluster(self) -> tuple[int, int] | None: ...


class Change(NamedTuple):
    """Where a waiting job stood from one cycle on (module docstring)."""

    cycle: int
    #: the log position and logical time (ns) of the cycle's cut (its CycleStarted)
    position: int
    time_ns: int
    queue_name: str
    #: (n, of) in its queue; None: not in its queue's order
    place: tuple[int, int] | None
    #: (n, of) in the order the cycle tried the jobs in; None: no such place recorded
    cluster: tuple[int, int] | None


def moved(before: Placed, after: Placed) -> bool:
    """Whether `after` is another place than `before` (module docstring: counts aside)."""
    if before.queue_name != after.queue_name:
        return True
    a, b = before.place, after.place
    if a is None or b is None:
        return a is not b
    if a[0] != b[0]:
        return True
    c, d = before.cluster, after.cluster
    if c is None or d is None:
        return c is not d
    return c[0] != d[0]


#: integers kept per change: cycle, position, time, then (n, of) in the queue and in the tried
#: order, 0 for none (places count from 1)
_WIDTH = 7


class PlaceChanges:
    """A wait's changes of place, bounded (module docstring)."""

    __slots__ = ("_ints", "_queues", "elided")

    def __init__(self, first: Placed) -> None:
        #: `_WIDTH` integers per change: machine integers, or Python's once one does not fit
        #: 64 bits (a log may hold times up to the year 9999, past 2262's 2**63 ns)
        self._ints: array[int] | list[int] = array("q")
        self._queues: list[str] = []
        #: changes dropped from the middle
        self.elided = 0
        self._append(first)

    def add(self, placed: Placed) -> None:
        """Append `placed` as a change, keeping the first and the last `KEPT` (module docstring)."""
        if len(self._queues) >= 2 * KEPT:
            del self._ints[KEPT * _WIDTH:(KEPT + 1) * _WIDTH]
            del self._queues[KEPT]
            self.elided += 1
        self._append(placed)

    def _append(self, c: Placed) -> None:
        place = c.place or (0, 0)
        cluster = (c.cluster or (0, 0)) if c.place is not None else (0, 0)
        values = (c.cycle, c.position, c.time_ns, place[0], place[1], cluster[0], cluster[1])
        ints = self._ints
        if isinstance(ints, array):
            try:
                ints.extend(array("q", values))  # (all or none: the array is made first)
            except OverflowError:
                self._ints = [*ints, *values]
        else:
            ints.extend(values)
        self._queues.append(c.queue_name)

    def __len__(self) -> int:
        return len(self._queues)

    def __iter__(self) -> Iterator[Change]:
        ints = self._ints
        for n, queue in enumerate(self._queues):
            cycle, position, time_ns, at, of, cluster_at, cluster_of = ints[n * _WIDTH:(n + 1) * _WIDTH]
            yield Change(cycle, position, time_ns, queue, (at, of) if at else None,
                         (cluster_at, cluster_of) if cluster_at else None)


def change_json(c: Placed) -> dict[str, Any]:
    """`{"cycle", "position", "logicaltime", "time", "queue", "place"}`, `place` shaped as a wait's
    `positionAtFirst` (`{"inQueue", "of"}` and, with a tried order, `"inCluster", "clusterOf"`;
    null when the job was not in its queue's order)."""
    place: dict[str, int] | None = None
    if c.place is not None:
        place = {"inQueue": c.place[0], "of": c.place[1]}
        if c.cluster is not None:
            place.update(inCluster=c.cluster[0], clusterOf=c.cluster[1])
    return {"cycle": c.cycle, "position": c.position, "logicaltime": c.time_ns, "time": rfc3339(c.time_ns),
            "queue": c.queue_name or None, "place": place}
