"""Idle GPUs that no pending pod can use, and why (pure over a folded state).

Contract:
- A node's free GPU capacity is per device: a device is *whole free* when nothing holds any of
  it; its free milli-GPU is 1000 minus what Binding, Running and Releasing pods hold there.
  Cordoned nodes count as idle but can take nothing.
- A pending kai-scheduler pod's *shape* is its GPU need on one node: `whole` devices, or a
  share of one device (milli-GPU; a `gpu-memory` request is converted against the node's GPU
  memory). It *fits by GPU* on a node that has that many whole free devices (or a device with
  that much free); CPU, memory and every other check are the scheduler's reasons, summarised
  from the pods' last `PodUnschedulable` events by the caller.
- *Stranded* GPUs are the idle milli-GPU on schedulable nodes where no pending GPU pod fits by
  GPU, plus every idle GPU on cordoned nodes, while at least one GPU pod is pending; with no GPU
  pod pending, idle GPUs are just idle (nothing is stranded).
- Everything is an integer; orders are by name or by size then name, never by dict order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kai_es.state.reducer import gpu_memory_milli
from kai_es.state.model import ClusterState, NodeState, PodState
from kai_es.state.reducer import job_key_of_index


@dataclass(frozen=True, slots=True)
class Shape:
    """What pending pods of one shape need on one node."""

    whole: int  # whole devices per pod (0: a share of one device)
    milli: int  # milli-GPU per device when `whole` is 0
    pods: int
    jobs: int
    #: the smallest and largest number of this shape's pods a job must place at once (its gang
    #: minimum still to place; 1 for a single pod or an elastic extra)
    min_gang: int
    max_gang: int
    #: pods of jobs whose at-once need fits the free GPUs (held back by something else)
    fitting: int
    #: how many pods of this shape the free GPUs could take at once (over all nodes)
    slots: int

    def need(self) -> str:
        return f"{self.whole} whole GPU{'s' if self.whole != 1 else ''}" if self.whole else f"{self.milli / 1000:g} GPU"


@dataclass(slots=True)
class Fragmentation:
    capacity_milli: int = 0
    idle_milli: int = 0
    stranded_milli: int = 0
    #: free whole devices -> how many schedulable nodes have exactly that many
    nodes_by_free: dict[int, int] = field(default_factory=dict)
    largest_free_whole: int = 0
    cordoned_idle_milli: int = 0
    pending_pods: int = 0
    pending_gpu_pods: int = 0
    #: pending GPU pods that fit by GPU on at least one node (held back by something else)
    fitting_gpu_pods: int = 0
    shapes: list[Shape] = field(default_factory=list)

    def cause(self) -> str:
        """One sentence naming why idle GPUs go unused (empty when nothing is stranded)."""
        if not self.stranded_milli:
            return ""
        gpu = f"{self.stranded_milli / 1000:g} of {self.idle_milli / 1000:g} idle GPUs"
        blocked = [s for s in self.shapes if s.fitting < s.pods]
        if not blocked:
            return (f"{gpu} sit on nodes where none of the {self.pending_gpu_pods} waiting GPU pods fits "
                    "(those that fit elsewhere wait for another reason)")
        parts = []
        for s in blocked:
            waiting = s.pods - s.fitting
            gang = (f" in gangs that must place {s.min_gang}" + (f"-{s.max_gang}" if s.max_gang != s.min_gang else "")
                    + " pods at once") if s.max_gang > 1 else ""
            where = "on one node" if s.whole else "on one device"
            parts.append(f"{waiting} pods need {s.need()} {where}{gang}, and the free GPUs fit only {s.slots} "
                         f"such pod{'s' if s.slots != 1 else ''}")
        free = ", ".join(f"{n} node{'s' if n != 1 else ''} with {k} free" for k, n in
                         sorted(self.nodes_by_free.items(), reverse=True) if k)
        return (f"fragmentation: {gpu} cannot be used by any waiting pod: {'; '.join(parts)} "
                f"(whole free GPUs by node: {free or 'none'})")


def _free(node: NodeState) -> tuple[int, list[int]]:
    """(whole free devices, free milli-GPU per device)."""
    free = [1000 - used for used in node.device_used[:node.spec.gpus]]
    free += [1000] * (node.spec.gpus - len(free))
    return sum(1 for f in free if f == 1000), free


def _need(pod: PodState, node: NodeState | None, hint_mib: int) -> tuple[int, int]:
    """(whole devices, milli of one device) the pod needs; (0, 0) for a CPU-only pod."""
    g = pod.spec.gpu
    if g.whole:
        return g.whole, 0
    if g.fraction_milli:
        return 0, g.fraction_milli
    if g.gpu_memory_mib:
        mib = node.spec.gpu_memory_mib if node is not None and node.spec.gpu_memory_mib else hint_mib
        return 0, gpu_memory_milli(g.gpu_memory_mib, mib)
    return 0, 0


def _fits(need: tuple[int, int], whole_free: int, free: list[int]) -> bool:
    whole, milli = need
    if whole:
        return whole_free >= whole
    return any(f >= milli for f in free)


def _slots(need: tuple[int, int], frees: list[tuple[NodeState, int, list[int]]]) -> int:
    """How many pods needing `need` the free devices could take at once."""
    whole, milli = need
    if whole:
        return sum(w // whole for _, w, _ in frees)
    return sum(f // milli for _, _, free in frees for f in free)


def pending_pods(state: ClusterState) -> list[PodState]:
    """Pending kai-scheduler pods in the scheduler's queue order index (queue name, then job)."""
    out = []
    for queue in sorted(state.pending_jobs):
        for index_key in state.pending_jobs[queue]:
            job = state.jobs[job_key_of_index(index_key)]
            out += [state.pods[entry.pod_key] for entry in job.pending]
    return out


def analyse(state: ClusterState, *, shapes: bool = True) -> Fragmentation:
    """The fragmentation of `state` (module contract). `shapes=False` skips the per-shape
    breakdown (cheaper, for sampling every cycle)."""
    f = Fragmentation()
    nodes = [state.nodes[n] for n in state.node_names]
    hint = max((n.spec.gpu_memory_mib for n in nodes), default=0)
    frees = []
    for node in nodes:
        whole, free = _free(node)
        f.capacity_milli += 1000 * node.spec.gpus
        idle = sum(free)
        f.idle_milli += idle
        if node.spec.unschedulable:
            f.cordoned_idle_milli += idle
            continue
        frees.append((node, whole, free))
        if node.spec.gpus:
            f.nodes_by_free[whole] = f.nodes_by_free.get(whole, 0) + 1
        f.largest_free_whole = max(f.largest_free_whole, whole)
    pods = pending_pods(state)
    f.pending_pods = len(pods)
    by_job: dict[str, list[tuple[int, int]]] = {}
    for pod in pods:
        need = _need(pod, None, hint)
        if need != (0, 0):
            f.pending_gpu_pods += 1
            by_job.setdefault(pod.job_key, []).append(need)
    if not by_job:
        return f
    distinct = sorted({need for needs in by_job.values() for need in needs})
    slots = {need: _slots(need, frees) for need in distinct}
    placeable: set[tuple[int, int]] = set()
    groups: dict[tuple[int, int], list[int]] = {}  # shape -> [pods, jobs, min gang, max gang, fitting]
    for key in sorted(by_job):
        job = state.jobs[key]
        needs = by_job[key]
        at_once = needs[:max(1, min(len(needs), job.min_member - job.occupying))]
        if len(at_once) == 1:  # (one pod at once: the common case, without the counting)
            fits = slots[at_once[0]] >= 1
            if fits:
                placeable.add(at_once[0])
        else:
            counts: dict[tuple[int, int], int] = {}
            for need in at_once:
                counts[need] = counts.get(need, 0) + 1
            fits = all(slots[need] >= n for need, n in counts.items())
            if fits:
                placeable.update(counts)
        if fits:
            f.fitting_gpu_pods += len(needs)
        if not shapes:
            continue
        for need in sorted(set(needs)):
            g = groups.setdefault(need, [0, 0, len(at_once), len(at_once), 0])
            n = needs.count(need)
            g[0] += n
            g[1] += 1
            g[2], g[3] = min(g[2], len(at_once)), max(g[3], len(at_once))
            g[4] += n if fits else 0
    usable = {node.spec.name for node, whole, free in frees if any(_fits(need, whole, free) for need in placeable)}
    f.stranded_milli = f.cordoned_idle_milli + sum(sum(free) for node, _, free in frees
                                                   if node.spec.name not in usable)
    if shapes:
        f.shapes = [Shape(whole=w, milli=m, pods=g[0], jobs=g[1], min_gang=g[2], max_gang=g[3],
                          fitting=g[4], slots=slots[(w, m)])
                    for (w, m), g in sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))]
    return f
