"""Scheduling readiness: whether a job is ready to be scheduled at all — KAI's `FilterUnready`,
applied to the jobs every action considers (allocate, consolidation, reclaim, preempt), which
passes a job only when `PodGroupInfo.IsReadyForScheduling`.

- `MinimumDecidesV13` (kai-es/v1 to v13): no check of its own; the gang minimum
  (`kai_es.scheduling.gang.minimum`) refuses a job whose minimum cannot exist (GangIncomplete),
  counting its pods that hold a place (Binding, Running and Releasing) and its pending ones.
  Scheduling gates are not read: a gated pod is pending like any other.
- `ReadyAsKai` (kai-es/v14 on): KAI's readiness. A pod set — a leaf sub-group, or the job
  without sub-groups, whose minimum is its `minMember` — is ready when its *alive* pods that are
  not gated number at least its minimum. Alive is KAI's status set: pending, gated, placed this
  cycle, binding, running (`pod_status.aliveStatuses`); a pod being released or evicted by this
  cycle's plan is not alive, and a gated pod (`spec.schedulingGates`, KAI's Gated status: the
  reducer keeps it out of the pending pods, fold rule `honours_gates`) is alive but not ready.
  An inner sub-group is ready when its ready children number its `minSubGroup` (all when unset);
  the job when its top-level ones do (the PodGroup's `minSubGroup`). A job that is not ready
  gets `NotReady`, naming each pod set short as KAI's NotReady event does — its minimum, how
  many of its pods exist (alive, gated included) and how many are gated — with the numbers of
  the first one.

Contract: pure; `problem` reads the session's state and plan, returns None for a ready job;
`ready(session, job)` is whether `problem` finds none for the job's pods on the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kai_es.events.payloads import Reason, SubGroup
from kai_es.scheduling import framework as fw
from kai_es.scheduling.gang import children_of, children_wanted
from kai_es.state.model import Job, PodState

if TYPE_CHECKING:
    from kai_es.scheduling.session import Session


class SchedulingReadiness(Protocol):
    def problem(self, session: Session, job: Job, occupying: Sequence[PodState]) -> Reason | None:
        """Why `job` is not ready to be scheduled, or None. `occupying`: its pods holding a
        place on the session's plan (`Session.occupying_on_plan` with the pods placed)."""

    def ready(self, session: Session, job: Job) -> bool:
        """Whether `job` is in the jobs an action considers (KAI's `FilterUnready`): a job that
        is not ready takes no place in a queue's depth (`rules.queue_depth`) and is not in the
        order the cycle tried (`rules.tried_order`), as KAI's job order never holds it."""


class MinimumDecidesV13:
    __slots__ = ()

    def problem(self, session: Session, job: Job, occupying: Sequence[PodState]) -> Reason | None:
        return None

    def ready(self, session: Session, job: Job) -> bool:
        return True


class ReadyAsKai:
    __slots__ = ()

    def ready(self, session: Session, job: Job) -> bool:
        return self.problem(session, job, session.occupying_on_plan(job, session.placed_pods)) is None

    def problem(self, session: Session, job: Job, occupying: Sequence[PodState]) -> Reason | None:
        pods = session.state.pods
        placed = session.placed_pods
        alive: dict[str, int] = {}  # sub-group ("" without sub-groups) -> alive pods not gated
        for pod in occupying:
            if pod.status != "Releasing" or pod.key in placed:
                name = pod.spec.subgroup
                alive[name] = alive.get(name, 0) + 1
        for entry in job.pending:
            if entry.pod_key not in placed:
                name = pods[entry.pod_key].spec.subgroup
                alive[name] = alive.get(name, 0) + 1
        groups = job.spec.subgroups if job.spec is not None else []
        if not groups:
            have = sum(alive.values())
            if have >= job.min_member:
                return None
            gated = sum(_gated(session, job).values())
            return _not_ready([("", job.min_member, have + gated, gated)])
        short: list[tuple[str, int, int]] = []  # (leaf sub-group, its minimum, alive)
        children = children_of(groups)

        def ready(sg: SubGroup) -> bool:
            kids = children.get(sg.name)
            if not kids:
                have = alive.get(sg.name, 0)
                if have < sg.min_member:
                    short.append((sg.name, sg.min_member, have))
                return have >= sg.min_member
            return sum([ready(kid) for kid in kids]) >= children_wanted(sg, kids)  # (every child judged)

        assert job.spec is not None
        satisfied = ready(SubGroup(name="", min_member=0, min_subgroup=job.spec.min_subgroup))
        del ready  # (a recursive closure holds itself through its cell: emptied, it is freed now)
        if satisfied:
            return None
        gated_in = _gated(session, job)
        return _not_ready([(name, need, have + gated_in.get(name, 0), gated_in.get(name, 0))
                           for name, need, have in short])


def _gated(session: Session, job: Job) -> dict[str, int]:
    """The job's gated pods of kai-es's scheduler per sub-group (only a job found short asks:
    the count is for its message)."""
    gated: dict[str, int] = {}
    ours = session.state.scheduler_name
    for key in job.members:
        pod = session.state.pods[key]
        if pod.spec.scheduling_gates and pod.status == "Pending" and pod.spec.scheduler_name == ours:
            gated[pod.spec.subgroup] = gated.get(pod.spec.subgroup, 0) + 1
    return gated


def _not_ready(short: list[tuple[str, int, int, int]]) -> Reason:
    """NotReady naming each pod set short: (sub-group or "", minimum, existing, gated)."""
    parts = [f"waiting for {need} pods{f' of sub-group {name}' if name else ''}, {exist} exist, {gated} gated"
             for name, need, exist, gated in short]
    _, need, exist, gated = short[0] if short else ("", 0, 0, 0)
    return Reason(code=fw.NOT_READY, message="not ready for scheduling: " + "; ".join(parts),
                  numbers={"min_member": need, "existing": exist, "gated": gated})
