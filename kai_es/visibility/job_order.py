"""KAI's `reflectjoborder` answer from kai-es's state: the order the last cycle tried the waiting
jobs in, as KAI's scheduler serves it on `/get-job-order` (its `reflectjoborder` plugin), so a
tool or agent written for KAI asks kai-es the same question the same way.

The shape is KAI's: `{"global_order": [{"id": "<namespace>/<name>", "priority": N}, ...],
"queue_order": {"<queue>": [...]}}` — every job the cycle tried, in order (index 0 first), then
the same entries grouped by queue (a job's place in its queue is its index there + 1). KAI
drains its job order at the cycle's start as if nothing were placed; kai-es gives the order the
cycle used (`ClusterState.tried_order`, recorded from policy kai-es/v13 on), which is the same
on a full cluster and exact when placements re-order the queues. Jobs beyond a queue's
`queueDepthPerAction.allocate` are in neither, as in KAI.

Contract: pure; `job_order(state)` is the document, or None when the state holds no recorded
order (a policy before kai-es/v13, or no cycle yet); `encoded(state)` its compact JSON bytes
(what the scheduler's and `serve`'s endpoints answer).
"""

from __future__ import annotations

from typing import Any

import msgspec

from kai_es.state.model import ClusterState


def job_order(state: ClusterState) -> dict[str, Any] | None:
    """KAI's `/get-job-order` document for the last cycle's tried order (module docstring)."""
    if not state.tried_order_cycle:
        return None
    jobs = state.jobs
    global_order: list[dict[str, Any]] = []
    queue_order: dict[str, list[dict[str, Any]]] = {}
    for key in state.tried_order:
        job = jobs.get(key)
        if job is None:
            continue  # gone since the cycle
        entry = {"id": key, "priority": job.priority}
        global_order.append(entry)
        queue_order.setdefault(job.queue, []).append(entry)
    return {"global_order": global_order, "queue_order": dict(sorted(queue_order.items()))}


def encoded(state: ClusterState) -> bytes | None:
    """`job_order(state)` as compact JSON bytes, or None."""
    doc = job_order(state)
    return None if doc is None else msgspec.json.encode(doc)
