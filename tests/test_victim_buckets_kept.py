"""Reclaim's victim buckets (`rules.reclaim_victims`, KAI's victim filter by queue) are kept by
the leaf, the request and every queue's allocation: after any evictions and rollbacks of the
Plan, a kept answer is the one a fresh judge gives."""

from __future__ import annotations

from itertools import chain

from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.scheduling.rules.reclaim_victims import QueuePriorityInQuota
from tests.test_consolidation_views import _preemptor, _session, evict_or_roll_back

REQUESTS = [(1000, 0, 0), (8000, 0, 0), (1000, 500, 1 << 30)]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=12))
def test_kept_victim_buckets_are_a_fresh_judges(seed: int, steps: list[tuple[bool, int]]) -> None:
    session = _session(seed)
    judge = QueuePriorityInQuota().judge(session)
    job = _preemptor(session)
    for _ in chain([None], evict_or_roll_back(session, job, steps)):  # (first: nothing done yet)
        for leaf in ("a", "b"):
            for request in REQUESTS:
                kept = judge.victim_buckets(session.queues[leaf], job, request)
                fresh = QueuePriorityInQuota().judge(session).victim_buckets(session.queues[leaf], job, request)
                assert kept == fresh, (leaf, request)
