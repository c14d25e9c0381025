"""The run summary's time integrals (`report.summarize`: GPU capacity and allocation over time)
equal a plain integration written here from the fold itself: before each record, the time since
the previous one times the capacity and the allocation the fold held then. (The summary adds the
time up only when a value changes; this checks it loses none.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_es.app import open_log
from kai_es.cli_common import records as log_records
from kai_es.report import summarize
from kai_es.state import ClusterState
from kai_es.state.reducer import apply

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", ["quickstart.events.jsonl", "consolidation.events.jsonl"])
def test_allocated_and_capacity_gpu_time_integrate_every_interval(name: str) -> None:
    records = list(log_records(open_log(str(GOLDEN / name), readonly=True)))
    state = ClusterState()
    capacity = allocated = 0
    last: int | None = None
    for record in records:
        t = record.envelope.logicaltime
        if last is not None and t > last:
            capacity += 1000 * sum(node.spec.gpus for node in state.nodes.values()) * (t - last)
            allocated += sum(q.allocated_milli_gpu for q in state.queues.values()) * (t - last)
        last = t if last is None else max(last, t)
        apply(state, record)
    summary = summarize(records)
    assert allocated > 0 and capacity > 0
    assert (summary.gpu_capacity_milli_ns, summary.gpu_allocated_milli_ns) == (capacity, allocated)
