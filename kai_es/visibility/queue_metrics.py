"""The per-queue numbers the scheduler exports as metrics, computed from the folded state: pure.

Contract:
- `queue_samples(state, config)` gives, per queue (name order) and resource (gpu, cpu, memory),
  the quota and limit of its spec (-1: unlimited), its fair share as the config's policy
  version divides it at the state's logical time (the division the cycles use, so the numbers
  equal `kai-es fairshare` and `explain` on the same cut), what it holds (allocated), asks for
  (requested: allocated + pending, capped by its limit; a parent sums its children) and holds
  in non-preemptible jobs. Quantities are kai-es's integers (milli-GPU, milli-CPU, bytes); a
  parent's allocation and non-preemptible allocation sum its children's.
- `pending_counts(state)` gives, per leaf queue, the pending pods and pending jobs kai-es
  schedules.
- `decision_counts(decisions)` counts a cycle's evictions by (action, the victim's queue) and the
  searches it reports failed by (action, reason code, the waiting pod's queue)
  (`ReclaimNotPossible`, `VictimsCannotMakeRoom`, ...; a verdict is announced only when it
  changes, so a search that keeps failing is counted once per change of reason).
- `parent_of(state, queue)`: the queue's parent ("" for a top queue or one the state lacks).
- `to_base_units(resource, amount)`: GPUs, CPU cores, bytes (Prometheus' base units).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.fairshare import RESOURCES
from kai_es.scheduling.framework import VICTIMS_CANNOT_MAKE_ROOM
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.rules.preemptors import REFUSED
from kai_es.state.keys import job_key_of_index
from kai_es.state.model import ClusterState

#: the reason codes of a victim search that failed -> the action that searched
SEARCH_FAILURES = {code: action for action, code in REFUSED.items()}


@dataclass(frozen=True, slots=True)
class QueueSample:
    queue: str
    parent: str
    resource: str
    quota: int
    limit: int
    fair_share: int
    allocated: int
    requested: int
    nonpreemptible: int


def queue_samples(state: ClusterState, config: SchedulerConfig) -> list[QueueSample]:
    """Every queue's numbers per resource (see module docstring)."""
    shares = policy_for(config.policy_version).rules.fair_share_division.shares(state, config, state.logicaltime)
    own_np = {name: (q.nonpreemptible_milli_gpu, q.nonpreemptible_milli_cpu, q.nonpreemptible_memory_bytes)
              for name, q in state.queues.items()}
    nonpreemptible = {name: [0, 0, 0] for name in state.queues}
    for name in sorted(state.queues):
        seen: set[str] = set()
        at = name
        while at in state.queues and at not in seen:  # itself and its ancestors (a loop ends it)
            seen.add(at)
            for r in range(3):
                nonpreemptible[at][r] += own_np[name][r]
            at = state.queues[at].spec.parent
    out: list[QueueSample] = []
    for name in sorted(state.queues):
        spec = state.queues[name].spec
        for r, resource in enumerate(RESOURCES):
            share = shares[resource].get(name)
            res = getattr(spec, resource)
            out.append(QueueSample(
                queue=name, parent=spec.parent, resource=resource, quota=res.quota, limit=res.limit,
                fair_share=share.fair_share if share is not None else 0,
                allocated=share.allocated if share is not None else 0,
                requested=share.request if share is not None else 0,
                nonpreemptible=nonpreemptible[name][r]))
    return out


def pending_counts(state: ClusterState) -> dict[str, tuple[int, int]]:
    """Leaf queue -> (pending pods, pending jobs), for every queue of the state."""
    out = {name: (0, 0) for name in sorted(state.queues)}
    for name in sorted(state.pending_jobs):
        pods = jobs = 0
        for index_key in state.pending_jobs[name]:
            job = state.jobs[job_key_of_index(index_key)]
            if job.pending:
                jobs += 1
                pods += len(job.pending)
        out[name] = (pods, jobs)
    return out


def decision_counts(decisions: Sequence[Envelope]
                    ) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str, str]]]:
    """(evictions by (action, queue), failed searches by (action, reason code, queue)) among
    `decisions`; a decision's queue is the one it names (the victim's, the waiting pod's)."""
    evictions: Counter[tuple[str, str]] = Counter()
    failures: Counter[tuple[str, str, str]] = Counter()
    for env in decisions:
        data = env.data
        if isinstance(data, p.EvictionDecided):
            evictions[(data.action, data.queue)] += 1
        elif isinstance(data, p.PodUnschedulable):
            for reason in data.reasons:
                action = SEARCH_FAILURES.get(reason.code)
                if action is None and reason.code == VICTIMS_CANNOT_MAKE_ROOM:
                    action = reason.message.split(":", 1)[0]  # (the action names itself first)
                if action is not None:
                    failures[(action, reason.code, data.queue)] += 1
    return evictions, failures


def parent_of(state: ClusterState, queue: str) -> str:
    """`queue`'s parent in the state ("": a top queue, or a queue the state does not hold)."""
    found = state.queues.get(queue)
    return found.spec.parent if found is not None else ""


def to_base_units(resource: str, amount: int) -> float:
    """`amount` (milli-GPU, milli-CPU or bytes) in GPUs, cores or bytes; -1 (unlimited) stays -1."""
    if amount < 0:
        return -1.0
    return amount / 1000 if resource in ("gpu", "cpu") else float(amount)
