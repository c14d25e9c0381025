"""Where a pending job stands in its queue and in the cluster: the order in which a cycle takes
the queue's jobs (`kai_es.scheduling.session.queued_job`: higher priority, below its gang
minimum before elastic extras, older, uid), and the order in which a cycle tried every queue's
jobs. Pure.

In-queue positions need no event of their own: they are a function of the folded state at a
cycle's cut, which replay rebuilds exactly, so the position a job had at any cycle is known for
any log, including logs written before this module existed.

The cluster-wide order is the one the last completed cycle used, where the log records it
(kai-es/v13 on: `ClusterState.tried_order`, folded from each CycleCompleted's `tried_order`):
each job at its first try — jobs with a pod pipelined to a node, gangs restored first, then KAI's
queue order as the cycle's placements moved it. It lists the jobs that cycle tried, those it
placed included, so a job's place says how many jobs that cycle tried before it. A log of an
older version has no recorded order: there the order is derived from the state, as the order a
cycle at `now_ns` would try the waiting jobs in if none of them were placed — jobs with a pod
pipelined to a node first (as allocate takes them), then, at each step, the queue the policy's
queue order puts first (fair share, allocation, the candidate's request: the Session's own
`pick`), then that queue's next job. A job placed ahead moves its queue back, so that order is
the worst case of a full cluster, which is when people ask. (Gangs restored ahead of the order
are left out of it.)

Contract: `queue_order(state, queue)` lists the job keys of the leaf queue's pending jobs that
have pods waiting, in order; `position(state, job_key)` is (1-based position, jobs in the queue)
or None for a job that is not waiting. `cluster_order(state, now_ns)` is the cluster-wide order
above (the recorded one when the state holds one); `cluster_ranks(state, now_ns)` the same as
job -> 0-based index, what every reader of a place asks (the recorded order's made once per
order, `tried_ranks`: None when the state holds none).
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


def tried_ranks(state: ClusterState) -> dict[str, int] | None:
    """The last cycle's recorded tried order as job -> 0-based index; None when the state holds
    none (a log before kai-es/v13). Kept in `state.caches` while the order is the same list."""
    if not state.tried_order_cycle:
        return None
    kept = state.caches.get("tried_ranks")
    if isinstance(kept, tuple) and kept[0] is state.tried_order:
        ranks: dict[str, int] = kept[1]
        return ranks
    ranks = ranked(state.tried_order)
    state.caches["tried_ranks"] = (state.tried_order, ranks)
    return ranks


def cluster_ranks(state: ClusterState, now_ns: int) -> dict[str, int]:
    """`cluster_order` as job -> 0-based index: the recorded order's kept ranks (`tried_ranks`),
    else the derived order's."""
    ranks = tried_ranks(state)
    return ranks if ranks is not None else ranked(would_try(state, now_ns))


def cluster_order(state: ClusterState, now_ns: int) -> list[str]:
    """Every job in the cluster-wide order (module docstring): the last cycle's recorded tried
    order when the state holds one, else the order a cycle at `now_ns` would try the waiting
    jobs in if none were placed."""
    if state.tried_order_cycle:
        return list(state.tried_order)
    return would_try(state, now_ns)


def would_try(state: ClusterState, now_ns: int) -> list[str]:
    """Every waiting job in the order a cycle at `now_ns` tries them if none is placed (module
    docstring)."""
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
        session.forget_order(leaf)
    return order
