"""A gang's minimum: which pending pods must be placed together, atomically, right now.

Rules:
- Without sub-groups: the job needs `minMember` pods bound or binding; the first missing ones
  in task order form the minimum.
- With sub-groups (PodGroup `spec.subGroups`, pods labelled `kai.scheduler/subgroup-name`): a
  leaf sub-group needs `minMember` of its pods; an inner sub-group needs `minSubGroup` of its
  children satisfied (all when unset) — children that need no new pod first, then in spec order;
  the PodGroup's own `minSubGroup` says how many top-level sub-groups must be (all when unset). The job's own `minMember` then tops the set up
  with further pending pods in task order.
An empty minimum means the job is at its minimum: further pods are elastic extras.
`surplus`: which of a job's occupying pods it can lose and keep its minimum shape (a
semi-preemptible job's extras, `rules.semi_preemptible`).

Contract: pure; the result lists pods in task order, or names why the minimum cannot exist.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from kai_es.events.payloads import Reason, SubGroup
from kai_es.scheduling import framework as fw
from kai_es.state.model import Job, PodState


class Minimum(msgspec.Struct, frozen=True, gc=False):
    """The pods to place together now (empty: at the minimum), or why none can be chosen.
    (A msgspec Struct, not a frozen dataclass: an allocate candidate makes one at every try,
    and a Struct is several times cheaper to construct. It holds no reference back to itself.)"""

    pods: tuple[PodState, ...]
    problem: Reason | None = None


def minimum(job: Job, pending: Sequence[PodState], occupying: Sequence[PodState]) -> Minimum:
    """The pods of `pending` (task order) that must be placed together now."""
    groups = job.spec.subgroups if job.spec is not None else []
    chosen: list[PodState] = []
    if groups:
        assert job.spec is not None
        picked = _subgroups(groups, pending, occupying, job.spec.min_subgroup)
        if isinstance(picked, Reason):
            return Minimum((), picked)
        chosen = picked
    need = job.min_member - len(occupying)
    if len(chosen) < need:
        extra = [pod for pod in pending if pod not in chosen]
        if len(chosen) + len(extra) < need:
            existing = len(occupying) + len(pending)
            return Minimum((), Reason(
                code=fw.GANG_INCOMPLETE, message=f"gang needs {job.min_member} pods but only {existing} exist",
                numbers={"min_member": job.min_member, "existing": existing}))
        chosen += extra[: need - len(chosen)]
    order = {pod.key: i for i, pod in enumerate(pending)}
    return Minimum(tuple(sorted(chosen, key=lambda pod: order[pod.key])))


def children_of(groups: Sequence[SubGroup]) -> dict[str, list[SubGroup]]:
    """Each sub-group's children by its name ("" for the PodGroup's top level), in spec order."""
    children: dict[str, list[SubGroup]] = {}
    for sg in groups:
        children.setdefault(sg.parent, []).append(sg)
    return children


def children_wanted(sg: SubGroup, kids: Sequence[SubGroup]) -> int:
    """How many of an inner sub-group's children it needs: its `minSubGroup`, all when unset."""
    return len(kids) if sg.min_subgroup is None else min(sg.min_subgroup, len(kids))


def _subgroups(groups: Sequence[SubGroup], pending: Sequence[PodState],
               occupying: Sequence[PodState], top_min_subgroup: int | None) -> list[PodState] | Reason:
    children = children_of(groups)

    def solve(sg: SubGroup) -> list[PodState] | Reason:
        kids = children.get(sg.name)
        if not kids:
            have = sum(1 for pod in occupying if pod.spec.subgroup == sg.name)
            mine = [pod for pod in pending if pod.spec.subgroup == sg.name]
            need = max(0, sg.min_member - have)
            if len(mine) < need:
                return Reason(code=fw.GANG_INCOMPLETE,
                              message=f"sub-group {sg.name} needs {sg.min_member} pods but only {have + len(mine)} exist",
                              numbers={"min_member": sg.min_member, "existing": have + len(mine)})
            return mine[:need]
        want = children_wanted(sg, kids)
        solved = [(kid, solve(kid)) for kid in kids]
        ok = [(kid, s) for kid, s in solved if not isinstance(s, Reason)]
        if len(ok) < want:
            failing = next(s for _, s in solved if isinstance(s, Reason))
            assert isinstance(failing, Reason)
            return Reason(code=fw.GANG_INCOMPLETE,
                          message=f"sub-group {sg.name} needs {want} satisfied sub-groups, only {len(ok)} can be: "
                                  f"{failing.message}",
                          numbers={"min_subgroup": want, "satisfiable": len(ok)})
        ok.sort(key=lambda pair: (len(pair[1]) > 0,))  # stable: spec order within each class
        out: list[PodState] = []
        for _, pods in ok[:want]:
            assert not isinstance(pods, Reason)
            out += pods
        return out

    root = SubGroup(name="", min_member=0, min_subgroup=top_min_subgroup)
    children.setdefault("", [])
    result = solve(root) if children[""] else []
    del solve  # (a recursive closure holds itself through its cell: emptied, it is freed now)
    return result


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
