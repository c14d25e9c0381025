"""Victim queue order: across the queues a search may take victims from, which queue gives the
next victim job (inside a queue, jobs go cheapest first: `victims.keyed_units`).

- `CheapestFirstV10` (kai-es/v1 to v10): no queue order; every candidate unit of every queue
  merges cheapest first by its key (lower job priority, newer job, uid), so the newest job of
  any queue goes first.
- `ReverseQueueOrder` (kai-es/v11 on), KAI's victims queue (`JobsOrderByQueues` built with
  `VictimQueue`, `actions/utils/job_order_by_queue.go`: queue nodes compared by the reverse of
  the session's queue order, `buildNodeOrderFn(reverseOrder)`): level by level down the queue
  tree, the sibling that KAI's queue order (`proportion/queue_order.GetQueueOrderResult`) would
  put *last* gives the next victim job, and all that job's units follow before the queues are
  compared again. Keys, compared as the queue order compares them and taken from the largest:
    1. over its fair share in every resource;
    2. over its deserved quota in some resource (no candidate job: KAI passes none);
    3. lower queue priority (KAI's `prioritizePrioritized` reversed: a queue of higher priority
       gives victims only after every lower one at the same level);
    4. uses a resource whose allocatable share is zero;
    5. larger dominant share of its allocatable share once the victims it gave in this search
       and its next victim job are taken off (KAI's `calculateDominantResourceShareWithJob`
       with `getVictimsForQueue`: popped jobs plus the next);
    6. larger dominant share as it is;
    7. a larger allocatable share (bigger in some resource, smaller in none);
    8. newer queue, then name (last).
  A parent queue is compared by its own accounting with the victims of its best leaf below, as
  KAI's `getBestJobFromNode`. The accounting is the Session's when the search starts (this
  search's evictions not counted: KAI compares on its session queues, the simulation rolled
  back).

Contract: pure; `merge` yields exactly the units of `streams`, each once, and each stream's units
in its own order; it reads the Session's accounting and writes nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.rules.queue_order import _drf, fair_share_order
from kai_es.state.quantities import ZERO, Vector, add, scale

if TYPE_CHECKING:
    from kai_es.scheduling.session import QueueNode, Session
    from kai_es.scheduling.victims import Unit
    from kai_es.state.model import Job

#: a stream of victim units of one (queue, priority) bucket, cheapest first, with their keys
Stream = tuple[str, Iterable[tuple[tuple[object, ...], "Unit"]]]


class VictimQueueOrder(Protocol):
    def merge(self, session: Session, streams: Sequence[Stream]) -> Iterator[Unit]:
        """The units of `streams` (each: its queue's name and its units cheapest first, keyed)
        in the order a search takes them."""


class CheapestFirstV10:
    __slots__ = ()

    def merge(self, session: Session, streams: Sequence[Stream]) -> Iterator[Unit]:
        for _, unit in heapq.merge(*(units for _, units in streams), key=itemgetter(0)):
            yield unit


class _Head:
    """A leaf queue's units (its buckets merged cheapest first), one looked ahead."""

    __slots__ = ("units", "next", "given")

    def __init__(self, units: Iterator[Unit]) -> None:
        self.units = units
        self.next: Unit | None = next(units, None)
        #: what the jobs this search took from the queue hold
        self.given: Vector = ZERO

    def advance(self) -> None:
        self.next = next(self.units, None)


def _held(session: Session, job: Job) -> Vector:
    """What `job`'s pods occupying a node (not evicted by the Plan) hold: KAI's victim
    `AllocatedVector`."""
    gpu = cpu = mem = 0
    for pod in session.occupying_on_plan(job):
        gpu += pod.milli_gpu
        cpu += pod.spec.requests.milli_cpu
        mem += pod.spec.requests.memory_bytes
    return (gpu, cpu, mem)


class ReverseQueueOrder:
    __slots__ = ()

    def merge(self, session: Session, streams: Sequence[Stream]) -> Iterator[Unit]:
        queues = session.queues
        by_queue: dict[str, list[Iterable[tuple[tuple[object, ...], Unit]]]] = {}
        for name, units in streams:
            by_queue.setdefault(name, []).append(units)
        # the accounting as the search starts (its own evictions move the Session's): each
        # node's keys but the one that counts its victims, once per search
        seen: dict[int, tuple[Vector, tuple[object, ...], tuple[object, ...]]] = {}
        children: dict[int, list[QueueNode]] = {}
        roots: list[QueueNode] = []
        for name in sorted(by_queue):
            below: QueueNode | None = None
            for node in queues[name].chain:
                fresh = id(node) not in seen
                if fresh:
                    allocated, fair, quota = node.allocated, node.fair, node.quota
                    zero, _, share = _drf(allocated, ZERO, node.allocatable, True)
                    seen[id(node)] = (
                        allocated,
                        (all(allocated[r] > fair[r] for r in (0, 1, 2)),
                         any(0 <= quota[r] < allocated[r] for r in (0, 1, 2)), -node.priority, zero),
                        (share, fair_share_order(node.allocatable), node.created_ns, node.name))
                    children[id(node)] = []
                    if node.parent is None:
                        roots.append(node)
                if below is not None and below not in children[id(node)]:
                    children[id(node)].append(below)
                if not fresh:
                    break
                below = node
        heads = {name: _Head(unit for _, unit in heapq.merge(*lists, key=itemgetter(0)))
                 for name, lists in by_queue.items()}
        held: dict[str, Vector] = {}

        def job_held(job: Job) -> Vector:
            found = held.get(job.key)
            if found is None:
                found = held[job.key] = _held(session, job)
            return found

        def key(node: QueueNode, victims: Vector) -> tuple[object, ...]:
            allocated, head, tail = seen[id(node)]
            with_victims = _drf(add(allocated, scale(victims, -1)), ZERO, node.allocatable, True)[1]
            return (*head, with_victims, *tail)

        #: per node, its entry while nothing below it changed: (its key, the leaf that gives
        #: its next victim, that leaf's victims) — only the path of the leaf that gave is
        #: recomputed after each job, not every queue at every step
        entries: dict[int, tuple[tuple[object, ...], str, Vector] | None] = {}

        def entry(node: QueueNode) -> tuple[tuple[object, ...], str, Vector] | None:
            if id(node) in entries:
                return entries[id(node)]
            head = heads.get(node.name)
            found: tuple[str, Vector] | None
            if head is not None:
                found = None if head.next is None else (node.name, add(head.given, job_held(head.next.job)))
            else:
                found = best(children[id(node)])
            out = None if found is None else (key(node, found[1]), found[0], found[1])
            entries[id(node)] = out
            return out

        def best(nodes: list[QueueNode]) -> tuple[str, Vector] | None:
            """The leaf that gives the next victim below `nodes` (siblings), and its victims."""
            chosen: tuple[tuple[object, ...], str, Vector] | None = None
            for node in nodes:
                found = entry(node)
                if found is not None and (chosen is None or chosen[0] < found[0]):
                    chosen = found
            return None if chosen is None else (chosen[1], chosen[2])

        while True:
            found = best(roots)
            if found is None:
                return
            head = heads[found[0]]
            unit = head.next
            assert unit is not None
            job = unit.job
            given = job_held(job)
            while unit is not None and unit.job is job:
                yield unit
                head.advance()
                unit = head.next
            for node in queues[found[0]].chain:
                entries.pop(id(node), None)
            head.given = add(head.given, given)
