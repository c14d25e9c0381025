"""What a scheduler does with the state while it waits for its next cycle: the derived data a
cycle starts by bringing up to date, brought up to date before the cycle is due.

A cycle's first work is not deciding: it re-hashes the entities that changed since the last
digest, rewrites the node tables' rows of the nodes that changed, and brings consolidation's
kept node bounds and the kept free capacity up to date with them. At 20,000 nodes with a few
thousand changes a cycle that is about 40% of the cycle (`tools/bench/bench_steady_cycle.py`).
None of it depends on the cycle: done in the wait before it, the cycle decides as soon as it
starts, on what arrived after.

Contract: `keep_up(state, config)` brings up to date, with `state` as it is, the derived data
the next cycle under `config` would bring up to date first, and nothing else:
- the incremental digest's kept hashes (`incremental_digest.refresh_hashes`), when the next
  cycle computes a digest (`stateDigestEvery`) and the policy version's digest keeps them;
- the node tables (`tables.tables`);
- of the caches that follow the tables (consolidation's node bounds, `consolidation_bounds`;
  the kept free capacity, `kept_capacity`), those the last cycle brought up to date: one that
  no cycle asked for is not made here, and one the last cycle did not ask for (consolidation
  found nothing to search) is left for the cycle that asks, as without the upkeep.
Each of them equals what computing it afresh gives (their modules' contracts, checked in
verification mode), so whether, when and how often `keep_up` runs cannot change a decision or
a digest: a replay, which never runs it, decides byte for byte the same. It moves their cost
from the cycle to the wait before it; the CPU a cycle costs in all is unchanged. It changes
only that derived data and the marks of what changed since (the stale sets,
`victim_order_changed`), exactly as the cycle's own first steps would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from kai_es.scheduling import kept_capacity
from kai_es.scheduling.actions import consolidation_bounds
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.policy import policy_for
from kai_es.scheduling.tables import Follower, tables
from kai_es.state.incremental_digest import incremental_digest, refresh_hashes
from kai_es.state.model import ClusterState

#: a policy version's `state_digest` -> the upkeep of what it keeps (a digest computed from
#: scratch each time, kai-es/v1's, keeps nothing)
_DIGEST_UPKEEP: Final[dict[Callable[[ClusterState], str], Callable[[ClusterState], None]]] = {
    incremental_digest: refresh_hashes,
}

#: the caches that follow the tables: (their key in `state.caches`, bring it up to date)
_FOLLOWERS: Final[tuple[tuple[str, Callable[[ClusterState], Follower]], ...]] = (
    (consolidation_bounds.CACHE_KEY, consolidation_bounds.state_bounds),
    (kept_capacity.CACHE_KEY, kept_capacity.state_capacity),
)

#: `state.caches` key of each follower's `asked` as the last upkeep left it: when it still is,
#: no cycle asked for it since
_LEFT_AT = "scheduling.upkeep.left_at"


def keep_up(state: ClusterState, config: SchedulerConfig) -> None:
    """Bring the derived data the next cycle starts from up to date (module contract)."""
    every = config.state_digest_every
    if every and (state.cycle + 1) % every == 0:
        refresh = _DIGEST_UPKEEP.get(policy_for(config.policy_version).state_digest)
        if refresh is not None:
            refresh(state)
    tables(state)
    left_at = state.caches.get(_LEFT_AT)
    if not isinstance(left_at, dict):
        left_at = state.caches[_LEFT_AT] = {}
    for key, bring_up_to_date in _FOLLOWERS:
        kept = state.caches.get(key)
        if kept is None or getattr(kept, "asked", None) == left_at.get(key):
            continue  # no cycle made it, or the last one did not ask for it
        left_at[key] = bring_up_to_date(state).asked
