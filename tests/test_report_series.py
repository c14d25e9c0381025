"""A queue's allocation series from a summary's timeline split by queue once
(`report.timeline_by_queue`, what the what-if's plot does for every queue) is the series from the
whole timeline, for leaves and parents alike; and a summary survives pickling (a what-if's workers
hand theirs over) unchanged."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.report import JobOutcome, QueueSummary, Summary, queue_series, timeline_by_queue

QUEUES = {"dept-a": "", "team-a1": "dept-a", "team-a2": "dept-a", "team-b": ""}

timelines = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(sorted(QUEUES)), st.integers(0, 64_000)),
                     max_size=60).map(lambda steps: sorted(steps, key=lambda e: e[0]))


def _summary(timeline: list[tuple[int, str, int]]) -> Summary:
    s = Summary(timeline=timeline)
    s.queues = {name: QueueSummary(name, parent=parent) for name, parent in QUEUES.items()}
    return s


@settings(max_examples=300, deadline=None)
@given(timelines)
def test_the_split_timeline_gives_every_queues_series(timeline: list[tuple[int, str, int]]) -> None:
    summary = _summary(timeline)
    index = timeline_by_queue(summary)
    for queue in QUEUES:
        assert queue_series(summary, queue, index) == queue_series(summary, queue)


@settings(max_examples=100, deadline=None)
@given(timelines, st.dictionaries(st.text(min_size=1, max_size=8),
                                  st.tuples(st.sampled_from(sorted(QUEUES)), st.integers(0, 2**70),
                                            st.none() | st.integers(0, 2**70), st.integers(0, 10**6),
                                            st.integers(0, 10**6)), max_size=20))
def test_a_summary_survives_pickling(timeline: list[tuple[int, str, int]],
                                     jobs: dict[str, tuple[str, int, int | None, int, int]]) -> None:
    summary = _summary(timeline)
    summary.jobs = {k: JobOutcome(*v) for k, v in jobs.items()}
    summary.cycles, summary.pending_reasons = 7, {"NoNodeFits": 3}
    again = pickle.loads(pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL))
    assert again == summary
    assert list(again.jobs) == list(summary.jobs)
