"""`SortedOnRead` (a queue's pending jobs) against a SortedList of
the same entries: every read (iteration, indexing, len, truth) after any interleaving of adds,
removes and reads, from empty or from entries given at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from sortedcontainers import SortedList

from kai_es.state.keys import PendingJob
from kai_es.state.sorted_on_read import SortedOnRead

# entries as the reducer makes them: (-priority, created, uid, queue, job key); priorities and
# times up to the int64 range and beyond, and ties on every field but the last
ENTRIES = st.builds(lambda prio, created, uid, key: tuple.__new__(PendingJob, (-prio, created, uid, "q", key)),
                    st.sampled_from([0, 1, 100, 2**31 - 1, -(2**31), 2**63 - 1, 2**128]),
                    st.sampled_from([0, 1, 10**18, 2**63 - 1, 2**128]),
                    st.sampled_from(["", "a", "b", "uid-\u00e9"]),
                    st.text(min_size=1, max_size=4))
OPS = st.lists(st.tuples(st.sampled_from(["add", "remove", "read", "index"]), ENTRIES,
                         st.integers(-40, 40)), max_size=120)


def _reads_agree(index: SortedOnRead, model: SortedList, at: int) -> None:
    assert len(index) == len(model)
    assert bool(index) == bool(model)
    if -len(model) <= at < len(model):
        assert index[at] == model[at]
    assert list(index) == list(model)


@given(st.lists(ENTRIES, unique=True, max_size=20), OPS)
def test_every_read_is_the_sorted_lists(start: list[PendingJob], ops: list[tuple[str, PendingJob, int]]) -> None:
    index, model = SortedOnRead(start), SortedList(start)
    held: list[PendingJob] = list(start)
    for op, entry, at in ops:
        if op == "add" and entry not in model:
            index.add(entry)
            model.add(entry)
            held.append(entry)
        elif op == "remove" and held:
            gone = held.pop(at % len(held))  # (the reducer removes only what it added)
            index.remove(gone)
            model.remove(gone)
        elif op == "read":
            _reads_agree(index, model, at)
        elif op == "index" and len(model):
            assert index[at % len(model)] == model[at % len(model)]
        assert len(index) == len(model) and bool(index) == bool(model)
    _reads_agree(index, model, 0)


def test_removed_then_added_again_before_a_read_is_held_once() -> None:
    a, b = (tuple.__new__(PendingJob, (0, t, "u", "q", k)) for t, k in ((1, "a"), (2, "b")))
    index = SortedOnRead()
    index.add(b)
    index.add(a)
    assert list(index) == [a, b]
    index.remove(a)
    index.add(a)  # (a job that left and came back under the same key between two reads)
    index.remove(b)
    index.add(b)
    index.remove(b)
    assert list(index) == [a] and len(index) == 1


def test_a_read_list_is_not_changed_by_later_changes() -> None:
    entries = [tuple.__new__(PendingJob, (0, t, "u", "q", f"j{t}")) for t in range(5)]
    index = SortedOnRead()
    for e in entries[:3]:
        index.add(e)
    walk = iter(index)
    first = next(walk)
    index.add(entries[4])
    assert list(index) == [*entries[:3], entries[4]]  # a read between: the changes merged
    index.remove(entries[1])
    index.add(entries[3])
    assert [first, *walk] == entries[:3]  # the walk started before the changes sees none of them
    assert list(index) == [entries[0], entries[2], entries[3], entries[4]]
