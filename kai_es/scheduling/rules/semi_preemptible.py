"""Semi-preemptible jobs: `kai.scheduler/preemptibility: semi-preemptible` (a pod's or owner's
label, or the PodGroup's `spec.preemptibility`), after KAI's semi-preemptible design
(docs/developer/designs/semi-preemptible in KAI's repository): a job non-preemptible up to its
minimum shape and preemptible above it.

- `SemiAsPreemptibleV7` (kai-es/v1 to v7): such a job is a preemptible job (KAI up to v0.17
  knows two modes; no log written by those versions has the value).
- `CoreKeptInQuota` (kai-es/v8 on): the job's *core* — the pods it needs to stay at its minimum
  shape — is non-preemptible: counted in its queues' non-preemptible allocation, placed only
  within their quotas, and no victim of reclaim, preempt or consolidation; the pods above it
  are preemptible extras, placed over quota like any preemptible pod (limits hold for all) and
  taken one at a time, in the version's victim order (`rules.victim_order`). A stale gang
  (below its minimum) is still evicted whole by stalegangeviction.

The minimum shape is the job's `minMember` and each leaf sub-group's own `minMember`: a pod
is an extra when the job keeps at least `minMember` occupying pods and its leaf sub-group at
least that sub-group's `minMember` without it (`surplus`). Whole sub-groups above a
`minSubGroup` are not extras here, unlike the design's tree-level elasticity: KAI's staleness
(`IsStale`, kai-es's `rules.staleness`) calls a gang with any leaf sub-group below its
`minMember` stale, so taking one whole would have the gang evicted as stale; they count in the
core. A job whose total pods equal its minimum is non-preemptible; one with `minMember: 0` and
no sub-group minima is preemptible.

Contract: pure; `surplus` returns pods of `ordered`, in that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kai_es.state.model import Job, PodState


class SemiPreemptible(Protocol):
    #: whether a semi-preemptible job's core is kept (False: it is a plain preemptible job)
    @property
    def keeps_core(self) -> bool: ...


class SemiAsPreemptibleV7:
    __slots__ = ()
    keeps_core = False


class CoreKeptInQuota:
    __slots__ = ()
    keeps_core = True


def surplus(job: Job, ordered: Sequence[PodState], occupying: Sequence[PodState]) -> list[PodState]:
    """The pods of `ordered` (pods of `job` a search may take, the first to go first) that the
    job can lose, taken in that order, and keep its minimum shape: at least `minMember` of
    `occupying` (its occupying pods, `ordered` among them) and, in each leaf sub-group, at least
    that sub-group's `minMember`. A pod that would break a leaf's minimum is skipped, and later
    pods are still considered."""
    total = len(occupying)
    groups = job.spec.subgroups if job.spec is not None else []
    parents = {sg.parent for sg in groups}
    leaf_min = {sg.name: sg.min_member for sg in groups if sg.name not in parents}
    counts: dict[str, int] = {}
    if leaf_min:
        for pod in occupying:
            counts[pod.spec.subgroup] = counts.get(pod.spec.subgroup, 0) + 1
    out: list[PodState] = []
    for pod in ordered:
        if total <= job.min_member:
            break
        group = pod.spec.subgroup
        need = leaf_min.get(group)
        if need is not None:
            if counts[group] <= need:
                continue
            counts[group] -= 1
        total -= 1
        out.append(pod)
    return out
