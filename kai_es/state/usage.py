"""Time-based fair share's raw material: what each queue held, and what the cluster offered, over
time, folded from the log in exact integers.

Contract:
- Kept only while `state.usage_resolution_ns` > 0 (a config of policy kai-es/v3 or later with
  `fairshare.timeBased: true`); otherwise nothing here runs and the state is as before.
- Time is cut into buckets of `usage_resolution_ns` (bucket b covers [b·R, (b+1)·R), epoch
  aligned). A queue's `usage[b]` is the exact integral over that bucket of the allocation of its
  own pods (milli-GPU·ns, milli-CPU·ns, byte·ns); `state.capacity_usage[b]` the same of the
  cluster's allocatable. Integrals are accrued lazily: a queue's allocation is constant since
  `usage_since_ns`, so `accrue_queue(state, q, t)` adds allocation × elapsed time, split at
  bucket boundaries, and moves `usage_since_ns` to t. The reducer accrues a queue just before its
  allocation changes, and the capacity just before a node changes.
- Buckets that ended more than a window ago are dropped when a newer accrual happens.
- Pure and deterministic: a function of the folded records only; integers only.
"""

from __future__ import annotations

from kai_es.state.model import ClusterState, QueueState

Integral = list[int]


def _spread(buckets: dict[int, Integral], amounts: tuple[int, int, int], start: int, end: int,
            resolution: int) -> None:
    """Add `amounts` × time over [start, end) to `buckets`, split at bucket boundaries."""
    if end <= start or not any(amounts):
        return
    t = start
    while t < end:
        b = t // resolution
        stop = min(end, (b + 1) * resolution)
        dt = stop - t
        cell = buckets.get(b)
        if cell is None:
            cell = buckets[b] = [0, 0, 0]
        cell[0] += amounts[0] * dt
        cell[1] += amounts[1] * dt
        cell[2] += amounts[2] * dt
        t = stop


def _prune(buckets: dict[int, Integral], now: int, resolution: int, window: int) -> None:
    """Drop the buckets that ended more than `window` before `now`."""
    oldest = (now - window) // resolution - 1
    if buckets and min(buckets) < oldest:
        for b in [b for b in buckets if b < oldest]:
            del buckets[b]


def capacity(state: ClusterState) -> tuple[int, int, int]:
    """The cluster's allocatable now: (milli-GPU, milli-CPU, bytes)."""
    gpu = cpu = mem = 0
    for name in state.node_names:
        spec = state.nodes[name].spec
        gpu += 1000 * spec.gpus
        cpu += spec.milli_cpu
        mem += spec.memory_bytes
    return gpu, cpu, mem


def accrue_queue(state: ClusterState, name: str, q: QueueState, now: int) -> None:
    """Bring `q.usage` up to `now` (its allocation unchanged since `q.usage_since_ns`)."""
    resolution = state.usage_resolution_ns
    if resolution <= 0 or now <= q.usage_since_ns:
        return
    if q.usage_since_ns > 0:
        _spread(q.usage, (q.allocated_milli_gpu, q.allocated_milli_cpu, q.allocated_memory_bytes),
                q.usage_since_ns, now, resolution)
        _prune(q.usage, now, resolution, state.usage_window_ns)
    q.usage_since_ns = now
    state.stale_queues.add(name)


def accrue_capacity(state: ClusterState, now: int) -> None:
    """Bring `state.capacity_usage` up to `now` (capacity unchanged since `capacity_since_ns`)."""
    resolution = state.usage_resolution_ns
    if resolution <= 0 or now <= state.capacity_since_ns:
        return
    if state.capacity_since_ns > 0:
        _spread(state.capacity_usage, capacity(state), state.capacity_since_ns, now, resolution)
        _prune(state.capacity_usage, now, resolution, state.usage_window_ns)
    state.capacity_since_ns = now


def start_all(state: ClusterState, now: int) -> None:
    """Usage starts being kept at `now` (for every queue not yet kept, and the capacity)."""
    for name in sorted(state.queues):
        q = state.queues[name]
        if q.usage_since_ns <= 0:
            q.usage_since_ns = now
            state.stale_queues.add(name)
    if state.capacity_since_ns <= 0:
        state.capacity_since_ns = now


def stop_all(state: ClusterState) -> None:
    """Usage is no longer kept: forget it."""
    for name in sorted(state.queues):
        q = state.queues[name]
        if q.usage or q.usage_since_ns:
            q.usage = {}
            q.usage_since_ns = 0
            state.stale_queues.add(name)
    state.capacity_usage = {}
    state.capacity_since_ns = 0
