"""Policy versions: the one registry from a policy version to its value — the actions a cycle
runs, the rule objects they compose (`kai_es.scheduling.rules`), the state digest, and what the
reducer folds by (`kai_es.state.versions`) — by the policy version a cycle records.

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
- `kai-es/v3`: v2's actions and stalegangeviction; the time rules (`rules.min_runtime`,
  `rules.preemption_delay`, `rules.staleness`): a job within its queue's preempt/reclaim
  min-runtime is no victim (an elastic one may still lose surplus pods), a job within its preemption delay triggers no eviction, and a running gang
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
    of evicted (`rules.replacement.MoveVictims`);
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

- `kai-es/v6`: v5's rules where KAI decides the same, and KAI's decisions where the cluster is
  full:
  - every action works alone and in any order: reclaim, preempt and consolidation choose their
    own preemptors among all pending jobs (`rules.preemptors.PendingPods`; v5: only those an
    earlier allocate left waiting, so alone they decided nothing), and a job they tried and could
    not help is told why, naming the action and the rule; a config listing no actions, or an
    empty list, runs KAI's default order (recorded as the config's resolved `actions`);
  - reclaim judges victims as KAI's reclaim strategies and saturation bound
    (`rules.reclaim_victims.KaiReclaimStrategies`): each victim before it is taken, the scenario
    whole after re-placement;
  - after the preemptor is placed every victim is tried again, in job order: one that fits where
    it runs stays, one that fits elsewhere on idle capacity moves, only the rest are evicted
    (`rules.replacement.ReplaceVictims`);
  - an elastic job loses its pods in reverse task order (`rules.victim_order.ReverseTaskOrder`);
  - a job's pending replacements of its Releasing pods are not requested twice in fair share
    (`rules.fair_share_division.ReplacementsCountedOnce`), so shares hold still during reclaim;
  - a move is one decision with both nodes as fields (`rules.move_decisions.MoveAsDecision`:
    EvictionDecided's `to_node`, schema version 3).

- `kai-es/v7`: v6's rules, and the clocks KAI keeps on a PodGroup are read, so a gang handed
  over between KAI and kai-es keeps them (kai-es's status writer writes them back):
  - a gang turning stale is stale since the PodGroup's `kai.scheduler/stale-podgroup-timestamp`
    when set (the fold rule `handover_stamps`; `kai_es.state.handlers.jobs.track_stale`), so
    its staleness grace period does not start again;
  - the PodGroup's `kai.scheduler/last-eviction-timestamp` re-arms its preemption delay as a
    last eviction does (`rules.preemption_delay.HandoverPreemptionDelay`);
  - and, as KAI since v0.15, a Running pod being deleted for longer than
    `stuckInReleasingThreshold` (2m) is stuck releasing: nothing is pipelined onto its capacity,
    and the cycle names it (`rules.releasing_capacity.StuckReleasingHeld`).

- `kai-es/v8`: v7's rules, and semi-preemptible jobs (`kai.scheduler/preemptibility:
  semi-preemptible`, KAI's semi-preemptible design): the pods a job needs to stay at its
  minimum shape are non-preemptible — in its queues' non-preemptible allocation, placed within
  their quotas, no victim — and the pods above it preemptible extras
  (`rules.semi_preemptible.CoreKeptInQuota`; before, such a job is a preemptible one);
  - a victim job taken below its minimum comes back whole or not at all, and then its pods
    still running go with it (`rules.replacement.ReplaceWholeGangs`; v6 and v7 could put back
    a surplus pod alone and leave a fragment that runs until it is evicted as stale);
  - the room a consolidation move made is held for the moved pod's replacement (same owner,
    same requests) until it arrives, and it is nominated there (the fold rule `holds_moves`,
    `rules.move_holds.HoldMovedRoom`; before, the replacement competed for it with every
    pending pod);
  - `queuePriorityInQuotaReclaim: true` (off by default, as in KAI) lets reclaim also take
    in-quota resources of a strictly lower-priority queue while the reclaiming one stays within
    its deserved quota (`rules.reclaim_victims.QueuePriorityInQuota`);
  - a job whose victim searches keep failing waits before the next, 1 s doubling to 60 s (the
    fold rule `backs_off_searches`, `rules.search_backoff.FailedSearchesBackOff`; before, every
    cycle searched again for it).

- `kai-es/v9`: v8's rules, and reclaim's strategies (maintain fair share, guarantee deserved
  quota) and saturation bound judge the scenario's final victims, once the job is placed and
  the victims that fit again are re-placed, on the queues as they were when the search began —
  KAI's reclaim validator with allowConsolidatingReclaim, its default
  (`rules.reclaim_victims.FinalVictimsReclaim`; v6–v8 judged each victim as the search took it,
  so a victim that would have moved was refused when its queue was at its fair share, and a
  queue with quota could not reclaim room that only a move makes: KAI's
  consolidation_and_reclaim integration test);
  - consolidation tries, of the nodes with as much free GPU capacity, first the one holding the
    cheapest movable victim in the victim order (`rules.consolidation_nodes.CheapestVictimBreaksTies`;
    before, the first node observed: KAI's consolidation integration test moves the newer job).

- `kai-es/v10`: v9's rules, and KAI's background pods, quotas granted in full, placed pods
  keeping a gang, queue limits judged on the Plan, the elastic surplus per sub-group and the
  allocatable-share queue order (RULES_V10's comment).

- `kai-es/v11`: v10's rules, and
  - a victim search takes victim jobs queue by queue, from the queue KAI's queue order puts
    last — KAI's victims queue, the reverse of its queue order, in which queue priority decides
    before the dominant share (`rules.victim_queue_order.ReverseQueueOrder`; v10 merged every
    queue's jobs cheapest first, so the newest job of a higher-priority queue went before a
    lower-priority queue's: KAI's reclaim integration test "Reclaim trains according to
    priority");
  - a consolidation move whose eviction the cluster refused holds no room for its replacement
    (the fold rule `releases_failed_moves` drops its holds; before, the room stayed held for
    two minutes for a pod that still ran where it was, and the move, tried again once its
    victim's eviction back-off ended, could not use it, nor could its replacement use the room
    the second move held).

- `kai-es/v12`: v11's rules, and a reclaim or preempt search places the preemptor and its
  victims in one allocation order, as KAI's `TryToVirtuallyAllocatePreemptorAndGetVictims`:
  before each try to place the preemptor, the victim jobs KAI's jobs-by-queues order takes first
  get their place back first (`rules.replacement_order.InAllocationOrder`; v11 placed the
  preemptor first, so a queue reclaimed from a queue of higher priority the room that queue's
  victim takes back in KAI: KAI's reclaim integration tests "reclaim from less prioritized
  queue" and "queue0 is over quota, queue1 is under quota, yet we don't reclaim").

- `kai-es/v13`: v12's decisions, and each cycle's CycleCompleted records the order its allocate
  tried the waiting jobs in, as an edit of the last cycle's (nothing when unchanged;
  `rules.tried_order.Recorded`, folded by the fold rule `keeps_tried_order`): the positions
  users read are the order the cycle used, where v12 derived them as the order a cycle would
  try if none of the jobs were placed. One cycle's record stays under Kafka's default 1 MB: the
  tried order holds at most 512 KiB of job keys, `stuck_releasing` at most 256 KiB of pod keys
  (`rules.stuck_record.StuckHead`; the capacity of every stuck pod is held as before). And
  KAI's `queueDepthPerAction`: an action named there considers only the first N waiting jobs
  of each queue (`rules.queue_depth.FirstJobsOfEachQueue`; older versions refuse the setting).
  And a bound pod stays bound (the fold rule `bindings_hold`): an observation of it without a
  node that reaches the log after the binder's PodBound was read before the binding, where v12
  put the pod back to Pending and decided it again.

- `kai-es/v14`: v13's rules, and KAI's scheduling readiness: a pod with scheduling gates
  (`spec.schedulingGates`) waits for them to be removed — it is not pending for kai-es (the fold
  rule `honours_gates`: never placed, not in its queue's demand), as KAI's Gated status; and a
  job is scheduled only when each of its pod sets has enough alive pods that are not gated
  (`rules.scheduling_readiness.ReadyAsKai`, KAI's `FilterUnready`): a pod being released no
  longer counts towards a gang's members, so a gang whose member is being evicted waits for its
  replacement instead of placing the rest around it. A job that is not ready is told `NotReady`
  with KAI's numbers (its minimum, how many pods exist, how many are gated). v13 bound gated pods
  (the API server refuses it: the binder failed and backed off for ever) and counted them, and
  pods being released, as members.

- `kai-es/v15`: v14's rules, and a pod deleted while its bind was in flight is not pending again
  when the bind fails (the fold rule `failed_binds_honour_deletion`), as a terminating pod is
  not pending in every other way and as KAI reads it (`getTaskStatus`: a Pending pod with a
  deletionTimestamp is Releasing, whatever its BindRequest): v14 put it back, decided it again after its back-off, and a
  checkpoint taken then restored to another state than its fold's.

- `kai-es/v16`: v15's rules and decisions; its state digest hashes a pod's spec with its fields
  in name order (the fold rule `name_ordered_specs`), the order `PodObserved` now declares them
  in because decoding it so costs about 5% less of a fold. Older versions hash the order the
  fields were added in (`kai_es.state.legacy_spec_form`), so their logs keep their digests.

Each version is a value: its actions and its `Rules` (one object per rule, an old behaviour an
old, named class); no action asks which version is in force.

Contract: `policy_for(version)` returns the PolicyVersion or raises `UnknownPolicy`; an action
is a function of the Session that returns its result (placements and reasons), pure; a
version's `state_digest` is a pure function of the state's content and
`snapshot_digest(snapshot(s)) == state_digest(s)`; `POLICIES` has exactly the versions of
`kai_es.state.versions.FOLD_RULES`, and each version's staleness rule judges sub-groups exactly
when its fold rules do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal, cast

import msgspec

from kai_es.scheduling.actions.allocate import Allocator
from kai_es.scheduling.actions.consolidation import Consolidation
from kai_es.scheduling.actions.preempt import Preempt
from kai_es.scheduling.actions.reclaim import Reclaim
from kai_es.scheduling.actions.stalegangeviction import StaleGangEviction
from kai_es.scheduling.framework import ActionResult
from kai_es.scheduling.rules import Rules
from kai_es.scheduling.rules.background_pods import BackgroundPodsGiveWay, NoBackgroundPodsV9
from kai_es.scheduling.rules.device_order import DeviceOrderV1, SpreadImpliesGpuSpread
from kai_es.scheduling.rules.fair_share_division import (
    ExactDivisionV1,
    QuotaGrantedInFull,
    ReplacementsCountedOnce,
    WholeGpuDivision,
    WholeGpuDivisionV2,
)
from kai_es.scheduling.rules.gang_restoration import NoGangRestorationV3, RestoreGangsFirst
from kai_es.scheduling.rules.hopeless_batch import HopelessBatchV1, NoHopelessBatch
from kai_es.scheduling.rules.leaving_pods import EvictedPodsLeave, LeavingPodsStayV3
from kai_es.scheduling.rules.min_runtime import NoMinRuntimeV2, QueueMinRuntime
from kai_es.scheduling.rules.move_decisions import MoveAsDecision, MoveInReasonV5
from kai_es.scheduling.rules.move_holds import HoldMovedRoom, NoMoveHoldsV7
from kai_es.scheduling.rules.preemption_delay import (
    HandoverPreemptionDelay,
    NoPreemptionDelayV2,
    PodGroupPreemptionDelay,
)
from kai_es.scheduling.rules.releasing_capacity import AllReleasingV6, HeldIdleSkipped, StuckReleasingHeld
from kai_es.scheduling.rules.preemptors import AllocateLeftoversV5, PendingPods
from kai_es.scheduling.rules.elastic_surplus import SurplusAboveEachSubGroup, SurplusAboveMinMemberV9
from kai_es.scheduling.rules.queue_depth import FirstJobsOfEachQueue, NoQueueDepthV12
from kai_es.scheduling.rules.scheduling_readiness import MinimumDecidesV13, ReadyAsKai
from kai_es.scheduling.rules.queue_limits import LimitsBeforeSearchV9, LimitsOnThePlan
from kai_es.scheduling.rules.queue_order import AllocatableShareOrder, KaiQueueOrder, QueueOrderV1
from kai_es.scheduling.rules.consolidation_nodes import CheapestVictimBreaksTies, MostFreeFirstV8
from kai_es.scheduling.rules.reclaim_victims import (DominantShareReclaimV5, FinalVictimsReclaim, KaiReclaimStrategies,
                                                     QueuePriorityInQuota)
from kai_es.scheduling.rules.replacement import EvictVictimsV3, MoveVictims, ReplaceVictims, ReplaceWholeGangs
from kai_es.scheduling.rules.replacement_order import InAllocationOrder, PreemptorFirstV11
from kai_es.scheduling.rules.search_backoff import FailedSearchesBackOff, NoSearchBackoffV7
from kai_es.scheduling.rules.semi_preemptible import CoreKeptInQuota, SemiAsPreemptibleV7
from kai_es.scheduling.rules.staleness import PlacedPodsKeepTheGang, SubGroupStaleness, TopLevelStalenessV3
from kai_es.scheduling.rules.stuck_record import EveryStuckPodV12, StuckHead
from kai_es.scheduling.rules.topology_placement import TopologyAware, TopologyIgnoredV4
from kai_es.scheduling.rules.tried_order import NotRecordedV12, Recorded
from kai_es.scheduling.rules.victim_eligibility import ActionRuleOnlyV3, SpareGrowingJobs
from kai_es.scheduling.rules.victim_order import NewestFirstV5, ReverseTaskOrder
from kai_es.scheduling.rules.victim_queue_order import CheapestFirstV10, ReverseQueueOrder
from kai_es.scheduling.rules.victim_search import BoundedSearch, BoundedSearchV3, UnboundedSearchV2
from kai_es.scheduling.rules.wakeups import HandoverWakeups, HoldingWakeups, NoWakeupsV2, TimeRuleWakeups
from kai_es.scheduling.session import Session
from kai_es.state.incremental_digest import incremental_digest, snapshot_digest
from kai_es.state.model import ClusterState
from kai_es.state.snapshot import Snapshot, snapshot_sha256
from kai_es.state.snapshot import digest as full_digest
from kai_es.state.versions import FOLD_RULES, FoldRules

Action = Callable[[Session], ActionResult]

ActionName = Literal["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]
ACTION_NAMES: Final = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")


def allocate(session: Session) -> ActionResult:
    return Allocator(session).run()


def consolidation(session: Session) -> ActionResult:
    return Consolidation(session).run()


def reclaim(session: Session) -> ActionResult:
    return Reclaim(session).run()


def preempt(session: Session) -> ActionResult:
    return Preempt(session).run()


def stalegangeviction(session: Session) -> ActionResult:
    return StaleGangEviction(session).run()


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    version: str
    #: action name -> implementation
    actions: Mapping[str, Action]
    #: action names a config of this version may list (implemented ones, plus v1's legacy names)
    accepted: frozenset[str]
    #: the rule objects the actions compose
    rules: Rules
    #: what the reducer folds by under this version (`kai_es.state.versions`)
    fold: FoldRules
    #: the actions a config that lists none runs, in order
    default_actions: tuple[str, ...] = ("allocate",)
    #: an empty action list means the defaults too (kai-es/v6 on; before, it ran nothing)
    empty_is_default: bool = False
    #: the `statedigest` a CycleCompleted carries under this version
    state_digest: Callable[[ClusterState], str] = full_digest
    #: the same digest computed from a snapshot of the state
    snapshot_digest: Callable[[Snapshot], str] = snapshot_sha256


class UnknownPolicy(ValueError):
    """A policy version this build does not know."""


#: kai-es/v1's rules: the first logs' behaviour
RULES_V1: Final = Rules(
    queue_order=QueueOrderV1(),
    hopeless_batch=HopelessBatchV1(),
    fair_share_division=ExactDivisionV1(),
    device_order=DeviceOrderV1(),
    gang_restoration=NoGangRestorationV3(),
    leaving_pods=LeavingPodsStayV3(),
    topology_placement=TopologyIgnoredV4(),
    min_runtime=NoMinRuntimeV2(),
    preemption_delay=NoPreemptionDelayV2(),
    victim_search=UnboundedSearchV2(),
    victim_eligibility=ActionRuleOnlyV3(),
    replacement=EvictVictimsV3(),
    replacement_order=PreemptorFirstV11(),
    staleness=TopLevelStalenessV3(),
    wakeups=NoWakeupsV2(),
    preemptors=AllocateLeftoversV5(),
    reclaim_victims=DominantShareReclaimV5(),
    victim_order=NewestFirstV5(),
    move_decisions=MoveInReasonV5(),
    releasing_capacity=AllReleasingV6(),
    semi_preemptible=SemiAsPreemptibleV7(),
    move_holds=NoMoveHoldsV7(),
    search_backoff=NoSearchBackoffV7(),
    consolidation_nodes=MostFreeFirstV8(),
    background_pods=NoBackgroundPodsV9(),
    queue_limits=LimitsBeforeSearchV9(),
    elastic_surplus=SurplusAboveMinMemberV9(),
    victim_queue_order=CheapestFirstV10(),
    tried_order=NotRecordedV12(),
    stuck_record=EveryStuckPodV12(),
    queue_depth=NoQueueDepthV12(),
    scheduling_readiness=MinimumDecidesV13(),
)
#: kai-es/v2: where v1 disagreed with KAI, as KAI (queue order, whole-GPU division, device order)
RULES_V2: Final = replace(RULES_V1, queue_order=KaiQueueOrder(), fair_share_division=WholeGpuDivisionV2(),
                          device_order=SpreadImpliesGpuSpread())
#: kai-es/v3: the time rules, hopeless jobs tried one by one, the bounded victim search
RULES_V3: Final = replace(RULES_V2, hopeless_batch=NoHopelessBatch(), fair_share_division=WholeGpuDivision(),
                          min_runtime=QueueMinRuntime(), preemption_delay=PodGroupPreemptionDelay(),
                          victim_search=BoundedSearchV3(), wakeups=TimeRuleWakeups())
#: kai-es/v4: gangs restored first, victims spared, moved, searched with free capacity; leaving
#: pods leave; sub-group staleness
RULES_V4: Final = replace(RULES_V3, gang_restoration=RestoreGangsFirst(), leaving_pods=EvictedPodsLeave(),
                          victim_search=BoundedSearch(), victim_eligibility=SpareGrowingJobs(),
                          replacement=MoveVictims(), staleness=SubGroupStaleness())
#: kai-es/v5: topology-aware placement
RULES_V5: Final = replace(RULES_V4, topology_placement=TopologyAware())
#: kai-es/v6: KAI's decisions when the cluster is full
RULES_V6: Final = replace(RULES_V5, preemptors=PendingPods(), reclaim_victims=KaiReclaimStrategies(),
                          fair_share_division=ReplacementsCountedOnce(),
                          replacement=ReplaceVictims(), victim_order=ReverseTaskOrder(),
                          move_decisions=MoveAsDecision())
#: kai-es/v7: the clocks KAI keeps on a PodGroup
RULES_V7: Final = replace(RULES_V6, preemption_delay=HandoverPreemptionDelay(),
                          releasing_capacity=StuckReleasingHeld(), wakeups=HandoverWakeups())
#: kai-es/v8: semi-preemptible jobs
RULES_V8: Final = replace(RULES_V7, semi_preemptible=CoreKeptInQuota(), replacement=ReplaceWholeGangs(),
                          move_holds=HoldMovedRoom(), wakeups=HoldingWakeups(),
                          reclaim_victims=QueuePriorityInQuota(), search_backoff=FailedSearchesBackOff())
#: kai-es/v9: reclaim's strategies judge the final victims, after re-placement (KAI's validator);
#: consolidation frees, of nodes alike, the one of its cheapest victim
RULES_V9: Final = replace(RULES_V8, reclaim_victims=FinalVictimsReclaim(),
                          consolidation_nodes=CheapestVictimBreaksTies())
#: kai-es/v10: background pods (KAI's backgroundpods plugin): their capacity counts as free while
#: a cycle plans; only those whose place was taken are evicted. Idle capacity held for pipelined
#: pods is passed over, not waited on
#: Quotas that add up to more than there is are granted in full (KAI's fair-share division); a gang
#: this cycle's placements bring back to its minimum is not stale. A preemptor's queue limits are
#: judged on the Plan with its victims taken (KAI's capacity predicate), and bind re-placed victims.
#: A victim job's surplus is what keeps each sub-group's minimum, counting this cycle's placements.
#: Queues are ordered by their shares of what they may allocate (KAI's allocatable share)
RULES_V10: Final = replace(RULES_V9, background_pods=BackgroundPodsGiveWay(), releasing_capacity=HeldIdleSkipped(),
                           fair_share_division=QuotaGrantedInFull(), staleness=PlacedPodsKeepTheGang(),
                           queue_limits=LimitsOnThePlan(), elastic_surplus=SurplusAboveEachSubGroup(),
                           queue_order=AllocatableShareOrder())
#: kai-es/v11: a search takes victim jobs queue by queue in the reverse of the queue order (KAI's
#: victims queue): a lower-priority queue gives its victims before a higher-priority one. (And
#: its fold drops the holds of a move whose eviction failed: `releases_failed_moves`)
RULES_V11: Final = replace(RULES_V10, victim_queue_order=ReverseQueueOrder())
#: kai-es/v12: a search re-places the victims KAI's allocation order takes before the preemptor
#: first, and places the preemptor on what is left (KAI's TryToVirtuallyAllocatePreemptorAndGetVictims)
RULES_V12: Final = replace(RULES_V11, replacement_order=InAllocationOrder())
#: kai-es/v13: v12's decisions, and each cycle records the order its allocate tried the waiting
#: jobs in (the positions users read), as an edit of the last cycle's; a cycle's record stays
#: under 1 MB (its tried order and its pods stuck releasing each within a byte budget); KAI's
#: queueDepthPerAction
RULES_V13: Final = replace(RULES_V12, tried_order=Recorded(), stuck_record=StuckHead(),
                           queue_depth=FirstJobsOfEachQueue())
#: kai-es/v14: KAI's scheduling readiness (gated pods wait; a job needs enough alive pods that are
#: not gated: KAI's FilterUnready). (And its fold keeps gated pods out of the pending pods)
RULES_V14: Final = replace(RULES_V13, scheduling_readiness=ReadyAsKai())

_V3_ACTIONS: Final[Mapping[str, Action]] = {
    "allocate": allocate,
    # no consolidation: it came with kai-es/v4
    "reclaim": reclaim,
    "preempt": preempt,
    "stalegangeviction": stalegangeviction,
}
_V4_ACTIONS: Final[Mapping[str, Action]] = {**_V3_ACTIONS, "consolidation": consolidation}
#: KAI's order (consolidation between allocate and reclaim)
_KAI_ORDER: Final = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")

#: the one version table: policy version -> its value
POLICIES: Final[Mapping[str, PolicyVersion]] = {p.version: p for p in (
    PolicyVersion("kai-es/v1", {"allocate": allocate}, frozenset(ACTION_NAMES), RULES_V1, FOLD_RULES["kai-es/v1"]),
    PolicyVersion("kai-es/v2", {"allocate": allocate, "reclaim": reclaim, "preempt": preempt},
                  frozenset({"allocate", "reclaim", "preempt"}), RULES_V2, FOLD_RULES["kai-es/v2"],
                  state_digest=incremental_digest, snapshot_digest=snapshot_digest),
    # KAI's default order without consolidation (v4's); stalegangeviction looks only at the
    # reducer's index of gangs below their minimum (`ClusterState.gangs_below_minimum`)
    PolicyVersion("kai-es/v3", _V3_ACTIONS, frozenset(_V3_ACTIONS), RULES_V3, FOLD_RULES["kai-es/v3"],
                  default_actions=("allocate", "reclaim", "preempt", "stalegangeviction"),
                  state_digest=incremental_digest, snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v4", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V4, FOLD_RULES["kai-es/v4"],
                  default_actions=_KAI_ORDER, state_digest=incremental_digest, snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v5", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V5, FOLD_RULES["kai-es/v5"],
                  default_actions=_KAI_ORDER, state_digest=incremental_digest, snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v6", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V6, FOLD_RULES["kai-es/v6"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v7", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V7, FOLD_RULES["kai-es/v7"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v8", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V8, FOLD_RULES["kai-es/v8"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v9", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V9, FOLD_RULES["kai-es/v9"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v10", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V10, FOLD_RULES["kai-es/v10"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v11", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V11, FOLD_RULES["kai-es/v11"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v12", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V12, FOLD_RULES["kai-es/v12"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v13", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V13, FOLD_RULES["kai-es/v13"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    PolicyVersion("kai-es/v14", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V14, FOLD_RULES["kai-es/v14"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    # v14's rules; its fold keeps a pod whose bind failed while it was deleted out of the pending pods
    PolicyVersion("kai-es/v15", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V14, FOLD_RULES["kai-es/v15"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
    # v15's rules and decisions; its digest hashes pod specs with their fields in name order
    PolicyVersion("kai-es/v16", _V4_ACTIONS, frozenset(ACTION_NAMES), RULES_V14, FOLD_RULES["kai-es/v16"],
                  default_actions=_KAI_ORDER, empty_is_default=True, state_digest=incremental_digest,
                  snapshot_digest=snapshot_digest),
)}
#: the version new configs get
CURRENT_POLICY: Final = "kai-es/v16"


def policy_for(version: str) -> PolicyVersion:
    found = POLICIES.get(version)
    if found is None:
        raise UnknownPolicy(f"unknown policy version {version!r} (this build knows "
                            f"{', '.join(POLICIES)})")
    return found


def state_digest(version: str, state: ClusterState) -> str:
    """The state digest of `state` as policy `version` computes it (raises `UnknownPolicy`)."""
    return policy_for(version).state_digest(state)


def reclaims_by_queue_priority(version: str) -> bool:
    """Whether policy `version` (a known one; else False) honours `queuePriorityInQuotaReclaim`."""
    found = POLICIES.get(version)
    return found is not None and found.rules.reclaim_victims.honours_queue_priority


def honours_queue_depth(version: str) -> bool:
    """Whether policy `version` (a known one; else False) honours `queueDepthPerAction` (v13 on)."""
    found = POLICIES.get(version)
    return found is not None and found.rules.queue_depth.honours_depth


def has_background_pods(version: str) -> bool:
    """Whether policy `version` (a known one; else False) has background pods (kai-es/v10 on)."""
    found = POLICIES.get(version)
    return found is not None and not isinstance(found.rules.background_pods, NoBackgroundPodsV9)


def config_actions(version: str, actions: list[ActionName] | None) -> list[ActionName]:
    """A config's actions under policy `version`: `actions` as listed (the same list), or the
    version's defaults when it lists none (kai-es/v6 on: or an empty list). Raises msgspec.ValidationError naming the field: an
    unknown version (`$.policyVersion`), an action listed twice or one the version does not
    accept (`$.actions`)."""
    try:
        policy = policy_for(version)
    except UnknownPolicy as exc:
        raise msgspec.ValidationError(f"{exc} - at `$.policyVersion`") from None
    if actions is None or (not actions and policy.empty_is_default):
        return [cast(ActionName, name) for name in policy.default_actions]
    if len(set(actions)) != len(actions):
        raise msgspec.ValidationError("an action is listed twice - at `$.actions`")
    refused = [a for a in actions if a not in policy.accepted]
    if refused:
        raise msgspec.ValidationError(
            f"{', '.join(refused)} {'is' if len(refused) == 1 else 'are'} not implemented by policy "
            f"{version} (it runs: {', '.join(sorted(policy.actions))}) - at `$.actions`")
    return actions
