"""Where a pending job stands in its queue: the order in which a cycle takes the queue's jobs
(`kai_es.scheduling.session.queued_job`: higher priority, below its gang minimum before elastic
extras, older, uid). Pure.

Positions need no event of their own: they are a function of the folded state at a cycle's cut,
which replay rebuilds exactly, so the position a job had at any cycle is known for any log,
including logs written before this module existed. The position is the queue's own order; which
queue goes next at each step of a cycle depends on the fair shares as they move within it (see
`explain`'s queue numbers).

Contract: `queue_order(state, queue)` lists the job keys of the leaf queue's pending jobs that
have pods waiting, in order; `position(state, job_key)` is (1-based position, jobs in the queue)
or None for a job that is not waiting.
"""

from __future__ import annotations

from kai_es.scheduling.session import queued_job
from kai_es.state.keys import job_key_of_index
from kai_es.state.model import ClusterState


def queue_order(state: ClusterState, queue: str) -> list[str]:
    """The waiting jobs of leaf queue `queue`, in the order a cycle takes them."""
    jobs = [state.jobs[job_key_of_index(index_key)] for index_key in state.pending_jobs.get(queue, ())]
    return [entry.job_key for entry in sorted(queued_job(job) for job in jobs if job.pending)]


def position(state: ClusterState, job_key: str) -> tuple[int, int] | None:
    """(position, of) of waiting job `job_key` in its queue; None when it is not waiting."""
    job = state.jobs.get(job_key)
    if job is None or not job.pending:
        return None
    order = queue_order(state, job.queue)
    return (order.index(job_key) + 1, len(order)) if job_key in order else None
