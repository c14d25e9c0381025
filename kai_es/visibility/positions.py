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
or None for a job that is not waiting. `cluster_order(state, now_ns)` lists every waiting job
of every leaf queue in the order a cycle at `now_ns` over `state` would try them if none of
them were placed: jobs with a pod pipelined to a node first (as allocate takes them), then, at
each step, the queue the policy's queue order puts first (fair share, allocation, the
candidate's request: the Session's own `pick`), then that queue's next job. A job placed ahead
moves its queue back, so the order is the worst case of a full cluster, which is when people
ask. (Gangs restored ahead of the order and the same-shape shortcut of `rules.hopeless_batch`
are left out: they skip tries, not positions.)
"""

from __future__ import annotations

from kai_es.scheduling.actions.allocate import nominated_jobs
from kai_es.scheduling.config import config_or_default
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.plan import Plan
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.session import Session, queued_job
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


def ranked(order: list[str]) -> dict[str, int]:
    """job key -> its 0-based index in `order` (a cluster order looked up job by job)."""
    return {key: i for i, key in enumerate(order)}


def cluster_order(state: ClusterState, now_ns: int) -> list[str]:
    """Every waiting job in the order a cycle at `now_ns` tries them (module docstring)."""
    config = config_or_default(state.config)
    rules = policy_for(config.policy_version).rules
    session = Session(state, Plan(state, load_packer("reference"), strategy_of(config, state)), now_ns, rules,
                      config)
    ahead = [job for job in nominated_jobs(state) if job.queue in session.queues]
    order = [job.key for job in ahead]
    for job in ahead:
        session.done.update(e.pod_key for e in job.pending)
    while (pick := session.pick(session.roots)) is not None:
        leaf, job = pick[0], pick[1]
        order.append(job.key)
        session.done.update(e.pod_key for e in job.pending)
        for q in leaf.chain:
            session.order_cache.pop(q.name, None)
    return order
