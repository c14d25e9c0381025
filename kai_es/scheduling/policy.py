"""Policy versions: which actions a cycle runs and how its state digest is computed, by the
policy version it records.

A log records the policy version of every cycle (`policyversion` on its decisions, and in the
config in force); `kai-es replay` re-runs each cycle under that version. A released version is
never changed: new behaviour is a new version here, and every old log keeps replaying.

- `kai-es/v1`: allocate. Its configs may also list consolidation, reclaim, preempt and
  stalegangeviction, which it accepts and does not run (as the version that wrote the first
  logs did).
- `kai-es/v2`: allocate, reclaim, preempt; a config listing an action this version does not
  implement is rejected. Where v1 disagreed with KAI, v2 decides as KAI does: GPU fair share is divided in
  whole GPUs; `placementStrategy.gpu: spread` implies the gpuspread device order; queue order
  has KAI's three further tie-breaks (a queue that would use a resource in which its fair share
  is zero goes later; dominant share without the candidate job; a queue whose fair share is
  smaller in some resource and larger in none goes first).
  The `statedigest` on a v2 CycleCompleted is the incremental digest
  (`kai_es.state.incremental_digest`: a multiset sha256 over the snapshot's entities, kept by
  the reducer, O(changes) per cycle); v1 records the sha256 of the whole snapshot (O(state)
  per cycle).
- `kai-es/v3`: v2's actions and stalegangeviction; the time rules (`kai_es.scheduling.times`):
  a job within its queue's preempt/reclaim min-runtime is no victim (an elastic one may still
  lose surplus pods), a job within its preemption delay triggers no eviction, and a running gang
  below its minimum past its staleness grace period is evicted whole; time-based fair share
  when the config turns it on. Its states keep job times and usage (`kai_es.state.usage`).
  Allocate no longer fails a queue's hopeless head jobs in one batch (v1/v2 do, which can let
  another queue go first out of KAI's order): each is tried through the queue order.
  A config that lists no actions runs allocate, reclaim, preempt and stalegangeviction (KAI's
  order without consolidation, which came with v4). The victim search
  is bounded per node (only nodes where evicting every eligible victim could make room for the
  preemptor are searched; a preemptor with none is rejected at once, with the reason
  VictimsCannotMakeRoom), victims are judged against the accounting at the start of each
  preemptor's search, a failed search is not repeated for an identical preemptor (queue,
  priority, preemptibility, request, shapes and eligible nodes) on an unchanged Plan, and a job
  whose eviction the binder refused is no victim for a while (`kai_es.scheduling.victims`).

- `kai-es/v4`: v3's rules and consolidation (`kai_es.scheduling.actions.consolidation`): a
  pending preemptible job that fits nowhere may have running preemptible pods moved out of its
  way when each finds room elsewhere, at most `maxConsolidationPreemptees` jobs a cycle, off
  under a spread placement strategy. A config that lists no actions runs allocate,
  consolidation, reclaim, preempt and stalegangeviction (KAI's order). Further:
  - the victim search (of every action) counts capacity free already towards the preemptor's
    request: v3 evicts until the victims alone free all of it, and so misses a preemptor that
    needs a node's free capacity and one victim there; and it tries a placement only after an
    eviction that leaves a node able to take one of the preemptor's tasks (v3 could spend its
    64 tries on victims spread over many nodes);
  - a victim of reclaim or preempt that fits elsewhere on idle capacity is moved there instead
    of evicted (`preempting.move_victims`);
  - allocate places the pods that restore a running gang's minimum
    (`ClusterState.gangs_below_minimum`) before anything but nominated pods, so a gang whose
    pods were moved gets the room made for them; a job this cycle placed pods for is no victim
    in the same cycle;
  - a running gang is also stale while any leaf sub-group has fewer occupying pods than its own
    minMember (KAI's stale pod-sets), and so also one that allocate restores first;
  - a pod the Plan evicts or moves satisfies no required pod affinity of a pod placed after it,
    and a pod a placement of the cycle needs for its required affinity is no victim.

- `kai-es/v5`: v4's rules and topology-aware placement (`kai_es.scheduling.topology`): the pods
  of a PodGroup with a `topologyConstraint` (and of each sub-group with one) are placed in one
  domain of the required level, the preferred level tried first, tightest domain first; a job
  that fits in no such domain waits (TopologyUnsatisfied), one whose constraint does not match
  its Topology too (InvalidTopologyConstraint). Reclaim, preempt and consolidation search victims
  for a job with a required constraint within one domain at a time, and a moved pod of such a
  job stays in its domain.

Contract: `policy_for(version)` returns the Policy or raises `UnknownPolicy`; an action is a
function of the Session that returns its result (placements and reasons), pure; a policy's
`state_digest` is a pure function of the state's content and `snapshot_digest(snapshot(s)) ==
state_digest(s)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from kai_es.scheduling.actions.allocate import AllocateResult, Allocator
from kai_es.scheduling.actions.consolidation import Consolidation
from kai_es.scheduling.actions.preempt import Preempt
from kai_es.scheduling.actions.reclaim import Reclaim
from kai_es.scheduling.actions.stalegangeviction import StaleGangEviction
from kai_es.scheduling.session import Session
from kai_es.state.incremental_digest import incremental_digest, snapshot_digest
from kai_es.state.model import ClusterState
from kai_es.state.snapshot import Snapshot, snapshot_sha256
from kai_es.state.snapshot import digest as full_digest

Action = Callable[[Session], AllocateResult]

ACTION_NAMES: Final = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")


def allocate(session: Session) -> AllocateResult:
    return Allocator(session).run()


def consolidation(session: Session) -> AllocateResult:
    return Consolidation(session).run()


def reclaim(session: Session) -> AllocateResult:
    return Reclaim(session).run()


def preempt(session: Session) -> AllocateResult:
    return Preempt(session).run()


def stalegangeviction(session: Session) -> AllocateResult:
    return StaleGangEviction(session).run()


@dataclass(frozen=True, slots=True)
class Policy:
    version: str
    #: action name -> implementation
    actions: Mapping[str, Action]
    #: action names a config of this version may list (implemented ones, plus v1's legacy names)
    accepted: frozenset[str]
    #: GPU fair share is divided over quota in units of this many milli-GPU (1: exactly)
    gpu_share_unit: int = 1
    #: queue order with KAI's zero-fair-share, share-without-job and smaller-fair-share tie-breaks
    kai_queue_order: bool = False
    #: `placementStrategy.gpu: spread` also orders shared devices gpuspread
    spread_implies_gpuspread: bool = False
    #: the `statedigest` a CycleCompleted carries under this version
    state_digest: Callable[[ClusterState], str] = full_digest
    #: the same digest computed from a snapshot of the state
    snapshot_digest: Callable[[Snapshot], str] = snapshot_sha256
    #: the time rules: min-runtime protection, preemption delay (`kai_es.scheduling.times`),
    #: and time-based fair share when the config turns it on
    time_rules: bool = False
    #: allocate fails the hopeless single-pod jobs at a queue's head in one batch, without
    #: re-ordering the queues between them (v1, v2). Under KAI's queue order a queue's place
    #: depends on its head job, so the batch can let a queue go before one it would have
    #: followed with a hopeless job at its head: v3 tries them one by one, as KAI does.
    batch_hopeless: bool = True
    #: the actions a config that lists none runs, in order
    default_actions: tuple[str, ...] = ("allocate",)
    #: victim search bounded per node (`kai_es.scheduling.actions.preempting`): only nodes where
    #: evicting every eligible victim could make room are searched; none: rejected at once
    bounded_victims: bool = False
    #: the victim search counts capacity free already towards the preemptor's request (v4);
    #: before, it tried a placement only once the victims alone freed the whole request, so a
    #: preemptor needing free capacity plus victims on one node could find no victims at all
    search_counts_free: bool = False
    #: allocate places the pods that restore a running gang's minimum before other work (v4):
    #: consolidation moves only the pods of a gang in the way, and their replacements must get
    #: the room made for them before the stale-gang clock runs out
    restore_gangs_first: bool = False
    #: a job this cycle placed pods for is no victim in the same cycle, nor a pod a placement
    #: of this cycle needs for its required pod affinity (v4): before, reclaim could evict the
    #: running half of a gang whose other half allocate had just restored
    spare_growing_jobs: bool = False
    #: reclaim's and preempt's victims that fit elsewhere on idle capacity are moved there
    #: instead of evicted (v4): the issue's shared victim search ("one that fits elsewhere is
    #: moved; only the rest are evicted")
    victims_move: bool = False
    #: a pod the Plan evicts (or moves away) satisfies no required pod affinity of a pod placed
    #: after it in the cycle (v4); before, a preemptor could be placed next to a pod that was
    #: leaving for it
    evicted_pods_leave: bool = False
    #: the victim search tries a placement only after an eviction that leaves a node able to
    #: take one of the preemptor's tasks (v4); before, victims spread over many nodes could use
    #: up its 64 tries before any node was free enough (an 8-GPU pod against 100 nodes of
    #: single-GPU pods created round-robin was never placed)
    node_gated_tries: bool = False
    #: stale gangs judged per leaf sub-group too, as KAI's `IsStale`: a running job with a leaf
    #: sub-group below its own minMember is stale as well. The reducer keeps `stale_since_ns` by
    #: that rule under a config of such a version (`kai_es.state.reducer.TOP_LEVEL_STALE_POLICIES`
    #: lists the others; a test holds the two to agree), and the eviction names the sub-group
    subgroup_stale_gangs: bool = False
    #: topology-aware placement (v5, `kai_es.scheduling.topology`): a PodGroup's and its
    #: sub-groups' `topologyConstraint` keep their pods in one domain of the required level,
    #: preferring the preferred one; before, the constraint was read and ignored
    topology: bool = False


class UnknownPolicy(ValueError):
    """A policy version this build does not know."""


POLICIES: Final[dict[str, Policy]] = {
    "kai-es/v1": Policy("kai-es/v1", {"allocate": allocate}, frozenset(ACTION_NAMES)),
    "kai-es/v2": Policy("kai-es/v2", {"allocate": allocate, "reclaim": reclaim, "preempt": preempt},
                        frozenset({"allocate", "reclaim", "preempt"}), gpu_share_unit=1000,
                        kai_queue_order=True, spread_implies_gpuspread=True,
                        state_digest=incremental_digest, snapshot_digest=snapshot_digest),
}
# kai-es/v3: v2's rules, one line per further feature (several were added side by side)
POLICIES["kai-es/v3"] = Policy(
    "kai-es/v3",
    {
        "allocate": allocate,
        # no consolidation: it came with kai-es/v4
        "reclaim": reclaim,
        "preempt": preempt,
        "stalegangeviction": stalegangeviction,
    },
    frozenset({"allocate", "reclaim", "preempt", "stalegangeviction"}),
    # KAI's default order without consolidation (v4's); stalegangeviction looks only
    # at the reducer's index of gangs below their minimum (`ClusterState.gangs_below_minimum`)
    default_actions=("allocate", "reclaim", "preempt", "stalegangeviction"),
    gpu_share_unit=1000,
    kai_queue_order=True,
    spread_implies_gpuspread=True,
    state_digest=incremental_digest,
    snapshot_digest=snapshot_digest,
    time_rules=True,
    batch_hopeless=False,
    bounded_victims=True,
)
# kai-es/v4: v3's rules and consolidation, in KAI's order between allocate and reclaim
POLICIES["kai-es/v4"] = replace(
    POLICIES["kai-es/v3"],
    version="kai-es/v4",
    actions={**POLICIES["kai-es/v3"].actions, "consolidation": consolidation},
    accepted=frozenset(ACTION_NAMES),
    default_actions=("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"),
    search_counts_free=True,
    restore_gangs_first=True,
    spare_growing_jobs=True,
    subgroup_stale_gangs=True,
    victims_move=True,
    evicted_pods_leave=True,
    node_gated_tries=True,
)
# kai-es/v5: v4's rules and topology-aware placement
POLICIES["kai-es/v5"] = replace(POLICIES["kai-es/v4"], version="kai-es/v5", topology=True)
#: the version new configs get
CURRENT_POLICY: Final = "kai-es/v5"


def policy_for(version: str) -> Policy:
    found = POLICIES.get(version)
    if found is None:
        raise UnknownPolicy(f"unknown policy version {version!r} (this build knows "
                            f"{', '.join(sorted(POLICIES))})")
    return found


def state_digest(version: str, state: ClusterState) -> str:
    """The state digest of `state` as policy `version` computes it (raises `UnknownPolicy`)."""
    return policy_for(version).state_digest(state)
