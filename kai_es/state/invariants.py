"""Invariants of a folded state. `check(state)` returns violations as readable strings.

Contract: an empty list means the state is internally consistent: indexes equal a recomputation
from scratch, the incremental digest equals its recomputation from scratch (no change went
unmarked), no node or device is over-committed, occupying pods are on known nodes, and every
pending pod is indexed exactly once under its job and queue.
"""

from __future__ import annotations

from kai_es.state.incremental_digest import incremental_digest, snapshot_digest
from kai_es.state.model import OCCUPYING, ClusterState
from kai_es.state.snapshot import restore, snapshot


def check(state: ClusterState, *, strict: bool = True) -> list[str]:
    """Violations found in `state` (empty when it is consistent).

    `strict=False` accepts what only the cluster itself can cause (over-commitment by another
    scheduler, pods reported on nodes not observed yet) and checks internal consistency only.
    """
    out: list[str] = []
    snap = snapshot(state)
    again = snapshot(restore(snap))
    if again != snap:
        for a, b in zip(snap.nodes, again.nodes):
            if a != b:
                out.append(f"node {a.spec.name}: incremental usage {_usage(a)} != recomputed {_usage(b)}")
        for qa, qb in zip(snap.queues, again.queues):
            if qa != qb:
                out.append(f"queue {qa.spec.name}: incremental allocation differs from recomputed")
        for ja, jb in zip(snap.jobs, again.jobs):
            if ja != jb:
                out.append(f"job {ja.key}: incremental index differs from recomputed")
        if snap.pending_jobs != again.pending_jobs:
            out.append("pending job index differs from recomputed")
        if not out:
            out.append("snapshot differs from its restored copy")
    kept, recomputed = incremental_digest(state), snapshot_digest(snap)
    if kept != recomputed:
        out.append(f"incremental digest {kept} != recomputed {recomputed}: a change went unmarked")
    for name in state.node_names:
        n = state.nodes[name]
        if strict:
            if n.used_milli_cpu > n.spec.milli_cpu:
                out.append(f"node {name}: cpu over-committed {n.used_milli_cpu}>{n.spec.milli_cpu}")
            if n.used_memory_bytes > n.spec.memory_bytes:
                out.append(f"node {name}: memory over-committed")
            if n.used_pods > n.spec.max_pods:
                out.append(f"node {name}: pods over-committed {n.used_pods}>{n.spec.max_pods}")
            for i, used in enumerate(n.device_used):
                if used > 1000:
                    out.append(f"node {name}: gpu {i} over-committed {used}>1000 milli")
            for resource, used in sorted(n.used_scalar.items()):
                if used > n.spec.scalar_resources.get(resource, 0):
                    out.append(f"node {name}: {resource} over-committed {used}>"
                               f"{n.spec.scalar_resources.get(resource, 0)}")
        if min([n.used_milli_cpu, n.used_memory_bytes, n.used_pods, *n.device_used,
                *n.used_scalar.values(), 0]) < 0:
            out.append(f"node {name}: negative usage")
    for key in sorted(state.pods):
        pod = state.pods[key]
        if strict and pod.status in OCCUPYING and pod.node not in state.nodes:
            out.append(f"pod {key}: {pod.status} on unknown node {pod.node!r}")
        want = pod.status == "Pending" and not pod.spec.terminating and pod.spec.scheduler_name == state.scheduler_name
        if (pod.pending_key is not None) != want:
            out.append(f"pod {key}: pending index says {pod.pending_key is not None}, status {pod.status}")
        if pod.job_key not in state.jobs or key not in state.jobs[pod.job_key].members:
            out.append(f"pod {key}: not a member of its job {pod.job_key}")
    rebuilt = restore(snap)
    if rebuilt.pods_by_label != state.pods_by_label or rebuilt.affinity_pods != state.affinity_pods:
        out.append("pod label index differs from recomputed")
    if rebuilt.victim_jobs != state.victim_jobs:
        out.append("victim job index differs from recomputed")
    for key in sorted(state.jobs):
        if state.jobs[key].subgroup_occupying != rebuilt.jobs[key].subgroup_occupying:
            out.append(f"job {key}: occupying pods per sub-group differ from recomputed")
    if state.gangs_below_minimum != {k for k, j in state.jobs.items() if j.stale_since_ns} \
            or rebuilt.gangs_below_minimum != state.gangs_below_minimum:
        out.append("stale gang index differs from recomputed")
    if state.semi_jobs != {k for k, j in state.jobs.items() if j.semi} or rebuilt.semi_jobs != state.semi_jobs:
        out.append("semi-preemptible job index differs from recomputed")
    if state.nominated != {k for k, pod in state.pods.items() if pod.nominated_node} \
            or rebuilt.nominated != state.nominated:
        out.append("nominated pod index differs from recomputed")
    return out


def _usage(n: object) -> str:
    from kai_es.state.snapshot import NodeSnap

    assert isinstance(n, NodeSnap)
    return f"cpu={n.used_milli_cpu} mem={n.used_memory_bytes} pods={n.used_pods} gpu={n.device_used}"
