"""Stuck record: which of the pods stuck releasing (`rules.releasing_capacity`) a cycle's
CycleCompleted names in `stuck_releasing`. The capacity of every such pod is held either way;
this rule only bounds the record.

- `EveryStuckPodV12` (kai-es/v7 to v12): every one, by key. A node outage that leaves tens of
  thousands of pods terminating makes that one record larger than Kafka's default 1 MB limit.
- `StuckHead` (kai-es/v13 on): the first by key whose keys take at most `MAX_STUCK_BYTES` as
  JSON (about 4,000 pods of usual names), so the CycleCompleted — with its tried order
  (`rules.tried_order`, at most 512 KiB) — stays under 1 MB.

Contract: pure; `record(stuck)` is a head of `stuck` (sorted keys).
"""

from __future__ import annotations

from typing import Final, Protocol

from kai_es.events.record_size import keys_head

#: the most JSON bytes the pod keys of one cycle's `stuck_releasing` take (v13 on)
MAX_STUCK_BYTES: Final = 256 * 1024


class StuckRecord(Protocol):
    def record(self, stuck: list[str]) -> list[str]:
        """The stuck pods the CycleCompleted names."""


class EveryStuckPodV12:
    __slots__ = ()

    def record(self, stuck: list[str]) -> list[str]:
        return stuck


class StuckHead:
    __slots__ = ()

    def record(self, stuck: list[str]) -> list[str]:
        return keys_head(stuck, MAX_STUCK_BYTES)
