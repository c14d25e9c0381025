"""Preemptors: which pending pods consolidation, reclaim and preempt try to make room for, and
what a pod they could not help is told.

- `AllocateLeftoversV5` (kai-es/v1 to v5): the pods an earlier action of the cycle left waiting
  for capacity (their first reason NoNodeFits, GangUnsatisfied or TopologyUnsatisfied). Run
  alone, or before allocate, these actions find no preemptor and decide nothing; a job they
  tried and could not help keeps the reasons it had.
- `PendingPods` (kai-es/v6 on): every pending pod of a job in a leaf queue not placed earlier in
  the cycle, as each of KAI's actions builds its own list of pending jobs from the snapshot: each
  works alone and in any order. A job the action tried and could not help gets one reason
  naming the action and the rule that refused (`refuse`), besides what earlier actions said.

Contract: pure; `waiting` returns pod keys in sorted order; `refuse` writes only the Session's
`unschedulable`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.events.payloads import Reason
from kai_es.scheduling import framework as fw
from kai_es.scheduling.topology import TOPOLOGY_UNSATISFIED
from kai_es.state.keys import job_key_of_index

if TYPE_CHECKING:
    from kai_es.scheduling.session import Session
    from kai_es.state.model import Job

#: the reasons that say a pod waits for capacity (TopologyUnsatisfied: a single constrained pod,
#: kai-es/v5 on; a gang's reasons lead with GangUnsatisfied)
CAPACITY_REASONS = frozenset({fw.NO_NODE_FITS, fw.GANG_UNSATISFIED, TOPOLOGY_UNSATISFIED})

#: reason codes of a pod an action tried and could not help (kai-es/v6 on), by action
REFUSED = {"reclaim": "ReclaimNotPossible", "preempt": "PreemptNotPossible",
           "consolidation": "ConsolidationNotPossible"}


class Preemptors(Protocol):
    def waiting(self, session: Session) -> list[str]:
        """Keys of the pending pods the action may make room for, sorted."""

    def refuse(self, session: Session, action: str, job: Job, message: str,
               numbers: dict[str, int] | None = None) -> None:
        """`action` tried `job` and could not help it, because of `message` (which names the
        rule and its numbers)."""


class AllocateLeftoversV5:
    __slots__ = ()

    def waiting(self, session: Session) -> list[str]:
        found = session.unschedulable
        return [key for key in sorted(found) if found[key] and found[key][0].code in CAPACITY_REASONS]

    def refuse(self, session: Session, action: str, job: Job, message: str,
               numbers: dict[str, int] | None = None) -> None:
        return None


class PendingPods:
    __slots__ = ()

    def waiting(self, session: Session) -> list[str]:
        pending = session.leaf_pending_pods
        if pending is None:  # (once a cycle: the state does not change during one)
            state = session.state
            pending = []
            for name in sorted(state.pending_jobs):
                leaf = session.queues.get(name)
                if leaf is None or leaf.children:
                    continue
                for index_key in state.pending_jobs[name]:
                    for e in state.jobs[job_key_of_index(index_key)].pending:  # (no generator per job)
                        pending.append(e.pod_key)
            pending.sort()
            session.leaf_pending_pods = pending
        placed = session.placed_pods
        return [key for key in pending if key not in placed]

    def refuse(self, session: Session, action: str, job: Job, message: str,
               numbers: dict[str, int] | None = None) -> None:
        reason = Reason(code=REFUSED[action], message=f"{action}: {message}",
                        numbers=dict(sorted((numbers or {}).items())))
        waiting, placed = session.unschedulable, session.placed_pods
        for entry in job.pending:
            key = entry.pod_key
            if key in placed:
                continue
            reasons = waiting.get(key, [])
            if any(r.code == reason.code for r in reasons):
                continue  # one per action: a search per topology domain says it once
            waiting[key] = [*reasons, reason]  # a new list: reason lists may be shared
