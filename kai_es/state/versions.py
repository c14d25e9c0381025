"""The policy versions' fold rules: what of a policy version the reducer must know to fold a log
written under it to exactly the state (and digest) it recorded. The registry
(`kai_es.scheduling.policy`) composes each version's `PolicyVersion` from the entry here (its
`fold`) and the scheduling rules; this is the one table of released version strings (the
reducer sits below the scheduler, so it is kept at the reducer's layer).

- `keeps_times`: the state keeps job times and usage (kai-es/v3 on; the config in force).
- `stale_subgroups`: a running gang is also stale while a leaf sub-group is below its own
  minMember (kai-es/v4 on; the config in force).
- `pipelined_nominates`: a PodPipelined decision reserves its node for the pod (kai-es/v2 on;
  the decision's own `policyversion`).
- `handover_stamps`: a gang that turns stale is stale since its PodGroup's
  `kai.scheduler/stale-podgroup-timestamp` when that is set (the time KAI, or kai-es, wrote
  when it found the gang stale), and a stale gang whose PodGroup states another second than
  the one kept is stale since that one (kai-es/v7 on; the config in force).
- `holds_moves`: a move (EvictionDecided with `to_node`) holds its room for the moved pod's
  replacement, which is nominated there when it arrives (`kai_es.state.handlers.move_holds`;
  kai-es/v8 on; the decision's own `policyversion`).
- `backs_off_searches`: a PodUnschedulable whose reason carries `retry_at_ns` (a failed victim
  search) keeps it and `search_failures` on the pod's job, until a pod of the job is placed
  (`kai_es.scheduling.rules.search_backoff`; kai-es/v8 on; the decision's own `policyversion`).
- `releases_failed_moves`: a PodEvictionFailed of a moved pod drops the holds of its moves (no
  replacement comes: the pod still runs where it was), so a move tried again holds its room
  once and its replacement claims that hold (`kai_es.state.handlers.move_holds.release_holds`;
  kai-es/v11 on; the config in force).
- `keeps_tried_order`: a CycleCompleted carries the order its allocate tried the waiting jobs in
  (`TriedOrder`, an edit of the last cycle's; none: unchanged), kept as
  `ClusterState.tried_order`; a cycle of an older version leaves no order (kai-es/v13 on; the
  decision's own `policyversion`).
- `bindings_hold`: a pod kai-es holds Running (bound by the binder's PodBound, or observed on a
  node) stays Running on an observation of the same pod without a node: Kubernetes never unsets
  a pod's `spec.nodeName`, so such an observation was read before the binding and reached the
  log after the binder's outcome (the informer and the binder append independently; a shared-GPU
  pod's GPU-group patch, written just before its Binding, is the usual one). Before, the pod went
  back to Pending, its room was free to others and it was decided again (kai-es/v13 on; the
  config in force).
- `honours_gates`: a pod with scheduling gates (`PodObserved.scheduling_gates`) is not pending
  for kai-es until they are removed (KAI's Gated status: never allocated, not in its queue's
  demand); it stays a member of its job (kai-es/v14 on; the config in force).
- `failed_binds_honour_deletion`: a pod whose bind failed goes back to the pending pods only if
  it is not terminating (deleted while its bind was in flight, which is usually why the bind
  failed), as every other way back to Pending does and as a state restored from a snapshot
  has it. Before, it was pending again and decided again after its back-off, and a checkpoint
  taken then restored to another state than the fold's (kai-es/v15 on; the config in force).
- `name_ordered_specs`: the state digest hashes a pod's spec with its fields in name order, the
  order `PodObserved` declares them in (cheaper to decode); before, in the order they were added
  (`kai_es.state.legacy_spec_form`), which every older log's digests hold (kai-es/v16 on; the
  config in force). No decision changes.

A version this build does not know folds as the newest (the scheduler rejects a config naming
one before it is applied); a log with no version at all (None) folds as the first logs did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final


@dataclass(frozen=True, slots=True)
class FoldRules:
    keeps_times: bool
    stale_subgroups: bool
    pipelined_nominates: bool
    handover_stamps: bool = False
    holds_moves: bool = False
    backs_off_searches: bool = False
    releases_failed_moves: bool = False
    keeps_tried_order: bool = False
    bindings_hold: bool = False
    honours_gates: bool = False
    failed_binds_honour_deletion: bool = False
    name_ordered_specs: bool = False


_FIRST: Final = FoldRules(keeps_times=False, stale_subgroups=False, pipelined_nominates=False)
_NOMINATING: Final = FoldRules(keeps_times=False, stale_subgroups=False, pipelined_nominates=True)
_TIMED: Final = FoldRules(keeps_times=True, stale_subgroups=False, pipelined_nominates=True)
_SUBGROUPS: Final = FoldRules(keeps_times=True, stale_subgroups=True, pipelined_nominates=True)
_HANDOVER: Final = FoldRules(keeps_times=True, stale_subgroups=True, pipelined_nominates=True,
                             handover_stamps=True)
_HOLDING: Final = FoldRules(keeps_times=True, stale_subgroups=True, pipelined_nominates=True,
                            handover_stamps=True, holds_moves=True, backs_off_searches=True)
_RELEASING: Final = FoldRules(keeps_times=True, stale_subgroups=True, pipelined_nominates=True,
                              handover_stamps=True, holds_moves=True, backs_off_searches=True,
                              releases_failed_moves=True)
_ORDERED: Final = FoldRules(keeps_times=True, stale_subgroups=True, pipelined_nominates=True,
                            handover_stamps=True, holds_moves=True, backs_off_searches=True,
                            releases_failed_moves=True, keeps_tried_order=True, bindings_hold=True)
_GATED: Final = FoldRules(keeps_times=True, stale_subgroups=True, pipelined_nominates=True,
                          handover_stamps=True, holds_moves=True, backs_off_searches=True,
                          releases_failed_moves=True, keeps_tried_order=True, bindings_hold=True,
                          honours_gates=True)
_DELETING: Final = replace(_GATED, failed_binds_honour_deletion=True)
_NAME_ORDERED: Final = replace(_DELETING, name_ordered_specs=True)

#: released policy version -> its fold rules (in release order)
FOLD_RULES: Final[Mapping[str, FoldRules]] = {
    "kai-es/v1": _FIRST,
    "kai-es/v2": _NOMINATING,
    "kai-es/v3": _TIMED,
    "kai-es/v4": _SUBGROUPS,
    "kai-es/v5": _SUBGROUPS,
    "kai-es/v6": _SUBGROUPS,
    "kai-es/v7": _HANDOVER,
    # semi-preemptible jobs change no fold (the reducer counts them preemptible, `Job.semi`);
    # a move's room is held for the moved pod's replacement
    "kai-es/v8": _HOLDING,
    # reclaim judges its final victims only: no fold changes
    "kai-es/v9": _HOLDING,
    # background pods are evicted on the cycle's Plan only: no fold changes
    "kai-es/v10": _HOLDING,
    # a failed move's holds are dropped (victims taken queue by queue change no fold)
    "kai-es/v11": _RELEASING,
    # victims re-placed in the allocation order with the preemptor: no fold changes
    "kai-es/v12": _RELEASING,
    # each cycle's tried order is kept (the positions shown); a bound pod stays bound
    "kai-es/v13": _ORDERED,
    # pods with scheduling gates wait for them (gang readiness as KAI's: no fold change)
    "kai-es/v14": _GATED,
    # a pod whose bind failed while it was being deleted is not pending again
    "kai-es/v15": _DELETING,
    # the digest hashes pod specs with their fields in name order (no decision changes)
    "kai-es/v16": _NAME_ORDERED,
}
#: what a log that names no version (None) or an empty one ("") folds by
_UNNAMED: Final[Mapping[object, FoldRules]] = {None: _FIRST, "": _NOMINATING}
_NEWEST: Final = _NAME_ORDERED


def fold_rules(version: object) -> FoldRules:
    """The fold rules of `version` (a config's `policyVersion` or a decision's
    `policyversion`; see module docstring for unknown and missing ones)."""
    found = _UNNAMED.get(version)
    if found is not None:
        return found
    return FOLD_RULES.get(version, _NEWEST) if isinstance(version, str) else _NEWEST
