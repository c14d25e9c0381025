"""A sorted collection whose changes are kept aside and merged on the next read, for an index
that changes many times between two reads: a queue's pending jobs (`ClusterState.pending_jobs`).

Why not a SortedList, as before: the fold adds a queue's entry for nearly every pod that arrives
and removes it when the pod is bound, while the order is read only when a cycle, a report or a
digest asks -- once per hundreds of changes. A SortedList pays its Python-level bisects and
rebalancing on every change (2.2% of a replay, 4.3% of a fold, by py-spy); here a change is a
set or dict operation, and the first read after changes filters the removed entries out of the
kept order and sorts the added ones in (Timsort merges the kept run with them: O(n + k log k)).
Where the changes between two reads are a large share of the entries, the merge costs about
what the SortedList did: consolidation's node bounds (thousands of changes a cycle among 20,000
entries) counted the same instructions either way in the upkeep, and stay a SortedList.

Contract: the same observable sequence as a SortedList of the same entries -- iteration, `len`,
truth and indexing give the entries in ascending order; `add` an entry not held, `remove` one
held (the reducer keeps that true; `kai_es.state.invariants` checks the index against a
recomputation). Reading never changes what it holds; a read returns, or iterates, a list no
later change mutates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kai_es.state.keys import PendingJob


class SortedOnRead:
    """A sorted collection of distinct `PendingJob` entries (module docstring)."""

    __slots__ = ("_order", "_added", "_removed")

    def __init__(self, entries: Iterable[PendingJob] = ()) -> None:
        self._order: list[PendingJob] = sorted(entries)  # sorted as of the last read; may hold removed entries
        self._added: dict[PendingJob, None] = {}  # added since, not in _order (insertion-ordered)
        self._removed: set[PendingJob] = set()  # in _order, removed since

    def add(self, entry: PendingJob) -> None:
        removed = self._removed
        if entry in removed:
            removed.remove(entry)  # (still in the kept order)
        else:
            self._added[entry] = None

    def remove(self, entry: PendingJob) -> None:
        added = self._added
        if entry in added:
            del added[entry]
        else:
            self._removed.add(entry)

    def _settled(self) -> list[PendingJob]:
        """The entries in order, the changes merged in (a new list when there were any)."""
        added, removed = self._added, self._removed
        if added or removed:
            order = [e for e in self._order if e not in removed] if removed else self._order[:]
            if added:
                order += added
                order.sort()
                added.clear()
            removed.clear()
            self._order = order
        return self._order

    def __len__(self) -> int:
        return len(self._order) - len(self._removed) + len(self._added)

    def __bool__(self) -> bool:
        return bool(self._added) or len(self._order) > len(self._removed)

    def __iter__(self) -> Iterator[PendingJob]:
        return iter(self._settled())

    def __getitem__(self, index: int) -> PendingJob:
        return self._settled()[index]

    def __repr__(self) -> str:
        return f"SortedOnRead({self._settled()!r})"
