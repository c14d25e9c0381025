"""The rules a policy version composes, one module per rule, named after it; each module holds
the rule's Protocol and its implementations, an old behaviour as an old, named class (`…V1`,
`…V2`, `…V3`, `…V4`: the last version that decides that way).

`Rules` is the bundle a Session carries and the actions consult; the registry
(`kai_es.scheduling.policy`) says which implementations each policy version composes. Nothing
outside the registry asks which version is in force.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kai_es.scheduling.rules.background_pods import BackgroundPods
    from kai_es.scheduling.rules.consolidation_nodes import ConsolidationNodes
    from kai_es.scheduling.rules.device_order import DeviceOrder
    from kai_es.scheduling.rules.elastic_surplus import ElasticSurplus
    from kai_es.scheduling.rules.fair_share_division import FairShareDivision
    from kai_es.scheduling.rules.gang_restoration import GangRestoration
    from kai_es.scheduling.rules.hopeless_batch import HopelessBatch
    from kai_es.scheduling.rules.leaving_pods import LeavingPods
    from kai_es.scheduling.rules.min_runtime import MinRuntime
    from kai_es.scheduling.rules.move_decisions import MoveDecisions
    from kai_es.scheduling.rules.move_holds import MoveHolds
    from kai_es.scheduling.rules.preemption_delay import PreemptionDelay
    from kai_es.scheduling.rules.preemptors import Preemptors
    from kai_es.scheduling.rules.queue_depth import QueueDepth
    from kai_es.scheduling.rules.queue_limits import QueueLimits
    from kai_es.scheduling.rules.queue_order import QueueOrder
    from kai_es.scheduling.rules.reclaim_victims import ReclaimVictims
    from kai_es.scheduling.rules.releasing_capacity import ReleasingCapacity
    from kai_es.scheduling.rules.replacement import Replacement
    from kai_es.scheduling.rules.replacement_order import ReplacementOrder
    from kai_es.scheduling.rules.scheduling_readiness import SchedulingReadiness
    from kai_es.scheduling.rules.search_backoff import SearchBackoff
    from kai_es.scheduling.rules.semi_preemptible import SemiPreemptible
    from kai_es.scheduling.rules.staleness import Staleness
    from kai_es.scheduling.rules.stuck_record import StuckRecord
    from kai_es.scheduling.rules.topology_placement import TopologyPlacement
    from kai_es.scheduling.rules.tried_order import TriedOrderRule
    from kai_es.scheduling.rules.victim_eligibility import VictimEligibility
    from kai_es.scheduling.rules.victim_order import VictimOrder
    from kai_es.scheduling.rules.victim_queue_order import VictimQueueOrder
    from kai_es.scheduling.rules.victim_search import VictimSearch
    from kai_es.scheduling.rules.wakeups import Wakeups


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """The rule objects of one policy version (see each module for the rule)."""

    #: which queue's candidate goes next (Session)
    queue_order: QueueOrder
    #: allocate, after a queue's head job missed
    hopeless_batch: HopelessBatch
    #: how capacity is divided into fair shares (Session, explain)
    fair_share_division: FairShareDivision
    #: the shared-GPU device order (the cycle's packer strategy)
    device_order: DeviceOrder
    #: allocate: running gangs below their minimum first
    gang_restoration: GangRestoration
    #: a leaving pod and required pod affinity (the cycle's eligibility)
    leaving_pods: LeavingPods
    #: topology-aware placement (the cycle's placer)
    topology_placement: TopologyPlacement
    #: reclaim and preempt: victims within their min-runtime keep their gang
    min_runtime: MinRuntime
    #: reclaim, preempt, consolidation: a preemptor within its preemption delay evicts nobody
    preemption_delay: PreemptionDelay
    #: reclaim, preempt, consolidation: which victims a search tries, where, and when it places
    victim_search: VictimSearch
    #: reclaim, preempt, consolidation: the units no action takes this cycle
    victim_eligibility: VictimEligibility
    #: reclaim and preempt: victims moved rather than evicted
    replacement: Replacement
    #: reclaim and preempt: which victims get their place back before the preemptor is placed
    replacement_order: ReplacementOrder
    #: stalegangeviction: which gangs are stale and the eviction's reason
    staleness: Staleness
    #: the scheduler's wake-ups for the time rules
    wakeups: Wakeups
    #: reclaim, preempt, consolidation: which pending pods they make room for, and what a job
    #: they could not help is told
    preemptors: Preemptors
    #: reclaim: who may reclaim, from which queues, which victims
    reclaim_victims: ReclaimVictims
    #: reclaim, preempt, consolidation: which of a job's pods are evicted first
    victim_order: VictimOrder
    #: how a move is announced
    move_decisions: MoveDecisions
    #: what pipelining may count on: the capacity of pods being released (the cycle's Plan)
    releasing_capacity: ReleasingCapacity
    #: whether a semi-preemptible job's minimum shape is non-preemptible (Session, victims)
    semi_preemptible: SemiPreemptible
    #: the room moves made, held for the moved pods' replacements (the cycle's Plan)
    move_holds: MoveHolds
    #: reclaim, preempt, consolidation: whether a job whose searches fail waits before the next
    search_backoff: SearchBackoff
    #: consolidation: which node a search frees first
    consolidation_nodes: ConsolidationNodes
    #: running background pods: their capacity free while the cycle plans (the cycle, around
    #: its actions)
    background_pods: BackgroundPods
    #: reclaim, preempt, consolidation: when a preemptor's queue limits are judged, and whether
    #: a victim put back must fit its own
    queue_limits: QueueLimits
    #: reclaim, preempt, consolidation: which of a victim job's pods go one at a time before its
    #: gang (and re-placement's count of what the job holds)
    elastic_surplus: ElasticSurplus
    #: reclaim, preempt: which queue gives the next victim job (the bounded search)
    victim_queue_order: VictimQueueOrder
    #: what the cycle records of the order allocate tried the waiting jobs in (the cycle)
    tried_order: TriedOrderRule
    #: which pods stuck releasing the cycle's record names (the cycle)
    stuck_record: StuckRecord
    #: allocate, reclaim, preempt, consolidation: how many of each queue's jobs they consider
    queue_depth: QueueDepth
    #: allocate, reclaim, preempt, consolidation: which jobs are ready to be scheduled (the Session's
    #: gang minimum)
    scheduling_readiness: SchedulingReadiness
