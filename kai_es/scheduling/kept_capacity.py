"""The cluster's free capacity once released (`victims.free_capacity`'s count), per node and
summed, as of the state, kept across cycles: consolidation asks for it before every search, and
summing 20,000 nodes each cycle cost more than the few hundred that changed.

Contract: `state_capacity(state)` equals `fresh_capacity(state)` (every node's
`victims.free_of_each` over the tables' `future` table, and their sum) at the cost of the nodes
whose usage changed since it was last asked (`tables.changed_since`), or of every node when the
tables were rebuilt. A cycle's Plan then differs only on the nodes it touched
(`consolidation_views.NodeViews.free_capacity` adds those). Derived data in `state.caches`:
never in a snapshot or digest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kai_es.scheduling.tables import follow, tables
from kai_es.scheduling.victims import free_of_each
from kai_es.state.model import ClusterState
from kai_es.state.quantities import Vector

#: where the capacity is kept in `state.caches`
CACHE_KEY = "scheduling.kept_capacity"


@dataclass(slots=True)
class StateCapacity:
    #: the tables' generation it is up to date with
    seen: int = -2
    #: how many times `tables.follow` handed it out
    asked: int = 0
    #: each node's free capacity once released (GPU milli, CPU milli, memory bytes), by index
    each: list[Vector] = field(default_factory=list)
    #: their sum
    total: Vector = (0, 0, 0)


def fresh_capacity(state: ClusterState) -> StateCapacity:
    """Every node's free capacity once released, from the state alone."""
    each = list(free_of_each(tables(state)[3], None))
    return StateCapacity(seen=-2, each=each, total=(sum(v[0] for v in each), sum(v[1] for v in each),
                                                    sum(v[2] for v in each)))


def state_capacity(state: ClusterState) -> StateCapacity:
    """The free capacity as of the state (module contract)."""
    return follow(state, CACHE_KEY, StateCapacity, lambda: fresh_capacity(state),
                  lambda kept, changed, rebuilt: fresh_capacity(state) if rebuilt else _update(state, kept, changed))


def _update(state: ClusterState, kept: StateCapacity, changed: list[int]) -> StateCapacity:
    gpu, cpu, mem = kept.total
    each = kept.each
    for n, (g1, c1, m1) in zip(changed, free_of_each(tables(state)[3], changed)):
        g0, c0, m0 = each[n]
        each[n] = (g1, c1, m1)
        gpu, cpu, mem = gpu - g0 + g1, cpu - c0 + c1, mem - m0 + m1
    kept.total = (gpu, cpu, mem)
    return kept
