"""Time-based fair share's U: each queue's decayed historical usage as a share of the cluster's
capacity, computed exactly from the usage the reducer folds from the log (`kai_es.state.usage`).

The rules (KAI's, over whole buckets of `fairshare.usageResolution` R):
- "Now" is the cycle's logical time t; the buckets counted are the last N = windowSize // R
  *completed* ones, [nb - N, nb) with nb = t // R (the bucket in progress is not counted yet:
  U lags by less than one R). A queue's allocation unchanged since it was last accrued counts
  up to nb·R as if accrued.
- Bucket b weighs w = 2^(-(nb - 1 - b)·R / halfLife) (the newest completed bucket weighs 1;
  halfLife 0: every bucket weighs 1). w is an integer in fixed point, 2^64 · w, computed by
  integer square roots only (`decay_weight`), rounded down at each step: deterministic on every
  machine.
- U(queue, resource) = Σ w·usage(queue) / Σ w·capacity, an exact Fraction (0 when the
  capacity sum is 0). A parent's usage is its own plus its descendants'.

Contract: pure (memoised by inputs), integers and Fractions only, deterministic.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import isqrt

from kai_es.events.timefmt import parse_duration
from typing import TYPE_CHECKING

from kai_es.scheduling.fairshare import Usage, parent_loops
from kai_es.state.model import ClusterState
from kai_es.state.usage import capacity

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig

#: fixed-point bits of the decay weights
BITS = 64
ONE = 1 << BITS


@lru_cache(maxsize=65536)
def decay_weight(num: int, den: int) -> int:
    """floor-wise 2^BITS · 2^(-num/den) for num >= 0, den > 0: the integer part shifts; each bit
    of the fraction's binary expansion multiplies by 2^(-1/2^i), itself obtained from 2^(-1/2)
    by repeated integer square roots (all rounded down)."""
    whole, rest = divmod(num, den)
    result = ONE
    factor = ONE >> 1  # 2^(-1/2^0) / 2 = 1/2, fixed point; the loop takes square roots of it
    for _ in range(BITS):
        if rest == 0:
            break
        factor = isqrt(factor << BITS)
        rest *= 2
        if rest >= den:
            rest -= den
            result = result * factor >> BITS
    return result >> whole if whole < 4 * BITS else 0


def _weights(state: ClusterState, config: SchedulerConfig, now_ns: int) -> tuple[int, int, list[int]]:
    """(first bucket, end bucket, weight of each bucket in [first, end))."""
    resolution = state.usage_resolution_ns
    count = max(1, state.usage_window_ns // resolution)
    end = now_ns // resolution
    first = end - count
    half_life = parse_duration(config.fairshare.half_life_period)
    if half_life <= 0:
        return first, end, [ONE] * count
    return first, end, [decay_weight((end - 1 - b) * resolution, half_life) for b in range(first, end)]


def _weighted(buckets: dict[int, list[int]], first: int, weights: list[int], amounts: tuple[int, int, int],
              since: int, until: int, resolution: int) -> list[int]:
    """Σ w·integral over [first, first + len(weights)) of `buckets` plus `amounts` held over
    [since, until) (not accrued yet), per resource."""
    out = [0, 0, 0]
    for b, cell in buckets.items():
        i = b - first
        if 0 <= i < len(weights):
            w = weights[i]
            out[0] += w * cell[0]
            out[1] += w * cell[1]
            out[2] += w * cell[2]
    if since > 0 and any(amounts):
        t = max(since, first * resolution)
        while t < until:
            b = t // resolution
            stop = min(until, (b + 1) * resolution)
            w = weights[b - first]
            for r in (0, 1, 2):
                out[r] += w * amounts[r] * (stop - t)
            t = stop
    return out


def queue_usage(state: ClusterState, config: SchedulerConfig, now_ns: int) -> dict[str, Usage]:
    """Every queue's usage share (see module docstring); {} when usage is not kept."""
    resolution = state.usage_resolution_ns
    if resolution <= 0:
        return {}
    first, end, weights = _weights(state, config, now_ns)
    key = ("usage", first, end, config.fairshare.half_life_period, state.capacity_since_ns,
           tuple((name, q.usage_since_ns, q.allocated_milli_gpu, q.allocated_milli_cpu, q.allocated_memory_bytes)
                 for name, q in sorted(state.queues.items())))
    cached = state.caches.get("usage")
    if isinstance(cached, tuple) and cached[0] == key:
        found: dict[str, Usage] = cached[1]
        return found
    until = end * resolution
    total = _weighted(state.capacity_usage, first, weights, capacity(state), state.capacity_since_ns, until,
                      resolution)
    own: dict[str, list[int]] = {}
    for name in sorted(state.queues):
        q = state.queues[name]
        own[name] = _weighted(q.usage, first, weights,
                              (q.allocated_milli_gpu, q.allocated_milli_cpu, q.allocated_memory_bytes),
                              q.usage_since_ns, until, resolution)
    loops = parent_loops({name: q.spec.parent for name, q in state.queues.items()})
    summed = {name: list(v) for name, v in own.items()}
    for name in sorted(own):
        if name in loops:
            continue
        parent = state.queues[name].spec.parent
        seen = {name}
        while parent in state.queues and parent not in seen:
            seen.add(parent)
            for r in (0, 1, 2):
                summed[parent][r] += own[name][r]
            parent = state.queues[parent].spec.parent
    out: dict[str, Usage] = {}
    for name in sorted(summed):
        u = summed[name]
        out[name] = (Fraction(u[0], total[0]) if total[0] else Fraction(0),
                     Fraction(u[1], total[1]) if total[1] else Fraction(0),
                     Fraction(u[2], total[2]) if total[2] else Fraction(0))
    state.caches["usage"] = (key, out)
    return out
