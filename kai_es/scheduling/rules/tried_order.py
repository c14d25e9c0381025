"""Tried order: what a cycle records of the order its allocate tried the waiting jobs in, the
positions users read (`kai-es explain`, `kai-es serve`, the PodGroup's condition).

- `NotRecordedV12` (kai-es/v1 to v12): nothing. Positions are derived at a cut as the order a
  cycle would try the jobs in if none of them were placed (`visibility.positions.cluster_order`).
- `Recorded` (kai-es/v13 on): the CycleCompleted carries the order allocate actually tried the
  jobs in — each job at its first try: the jobs pipelined earlier, the gangs restored first,
  then KAI's queue order as the cycle's placements moved it; from kai-es/v14 on not a job that
  is not ready for scheduling, which KAI's job order never holds — as an edit of the order the cut
  held (`state.handlers.tried_order.edit`), or nothing when that order is unchanged. A full
  cluster where nothing moves records nothing; a cycle whose placements reorder the queues
  records the stretch that changed. Replay compares it with the decisions, byte for byte. The
  order recorded is the longest head of the tried order whose job keys take at most
  `MAX_ORDER_BYTES` as JSON (about 8,000 jobs of usual names): one event stays well under
  Kafka's default 1 MB record limit however long the backlog, and a job tried after that head
  has no cluster-wide place.

Contract: pure; `record` reads the state at the cut and the Session's tries (`Session.tried`).
"""

from __future__ import annotations

from typing import Final, Protocol

from kai_es.events.payloads import TriedOrder
from kai_es.events.record_size import keys_head
from kai_es.scheduling.session import Session
from kai_es.state.handlers.tried_order import edit


class TriedOrderRule(Protocol):
    def record(self, session: Session) -> TriedOrder | None:
        """What the cycle's CycleCompleted carries as `tried_order`."""


class NotRecordedV12:
    __slots__ = ()

    def record(self, session: Session) -> TriedOrder | None:
        return None


#: the most JSON bytes the job keys of one recorded order take (module docstring)
MAX_ORDER_BYTES: Final = 512 * 1024


def recorded_head(tried: list[str]) -> list[str]:
    """The longest head of `tried` whose keys, JSON-encoded, take at most MAX_ORDER_BYTES."""
    return keys_head(tried, MAX_ORDER_BYTES)


class Recorded:
    __slots__ = ()

    def record(self, session: Session) -> TriedOrder | None:
        state = session.state
        return edit(state.tried_order, recorded_head(list(session.tried)), state.tried_order_cycle)
