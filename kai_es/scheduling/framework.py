"""Scheduling framework values: reason codes and `ActionResult` (returned by every action).
Plugins and predicates return `Reason` records (or None: no objection), never log.

Contract: a reason has a stable `code` (machine-readable), a `message` a person can act on, and
`numbers` with the quantities behind it (ints). The scheduler turns the reasons of a pod left
Pending into one `PodUnschedulable` event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kai_es.events.payloads import Reason
from kai_es.scheduling.plan import Entry

# Reason codes (stable; part of the decision stream's contract)
QUEUE_NOT_FOUND = "QueueNotFound"
NO_QUEUE = "NoQueue"
PODGROUP_NOT_FOUND = "PodGroupNotFound"
GANG_INCOMPLETE = "GangIncomplete"
GANG_UNSATISFIED = "GangUnsatisfied"
NO_NODE_FITS = "NoNodeFits"
BIND_BACKOFF = "BindBackoff"
BIND_FAILED_PERMANENTLY = "BindFailedPermanently"
NO_NODES = "NoNodes"
QUEUE_NOT_LEAF = "QueueNotLeaf"
QUEUE_LOOP = "QueueLoop"
INVALID_REQUEST = "InvalidRequest"
QUEUE_LIMIT = "QueueLimit"
NON_PREEMPTIBLE_OVER_QUOTA = "NonPreemptibleOverQuota"
PREEMPTION_DELAY = "PreemptionDelay"
VICTIMS_CANNOT_MAKE_ROOM = "VictimsCannotMakeRoom"
#: kai-es/v13: the job is beyond its queue's `queueDepthPerAction.allocate` (`rules.queue_depth`)
BEYOND_QUEUE_DEPTH = "BeyondQueueDepth"
#: kai-es/v14: too few of the job's pods are alive and not gated (KAI's NotReady;
#: `rules.scheduling_readiness`)
NOT_READY = "NotReady"

#: packer rejection slot -> (numbers key, human phrase)
REJECTION_NAMES: tuple[tuple[str, str], ...] = (
    ("not_eligible", "excluded by node selector, affinity, taints or cordon"),
    ("too_many_pods", "at their pod limit"),
    ("insufficient_cpu", "insufficient CPU"),
    ("insufficient_memory", "insufficient memory"),
    ("insufficient_gpu", "too few idle GPUs"),
    ("insufficient_gpu_share", "no GPU with enough free share"),
    ("gpu_memory", "GPU memory unknown or too small"),
)


@dataclass(slots=True)
class ActionResult:
    """What an action returns: the placements it made (the cycle drops their pods' earlier
    reasons) and the pods it left waiting, with the reasons."""

    placed: list[Entry] = field(default_factory=list)
    unschedulable: dict[str, list[Reason]] = field(default_factory=dict)


def no_node_fits(rejections: tuple[int, ...], nodes: int, what: str,
                 extra: tuple[tuple[str, str, int], ...] = ()) -> Reason:
    """The reason for a task that fits no node, with per-cause node counts (memoised: equal
    inputs give the same immutable Reason). `rejections[0]` counts the nodes excluded by cordon,
    taints, node pool, selector and required node affinity; `extra` lists the later predicates'
    exclusions as (numbers key, phrase, nodes), reported after it."""
    key = (rejections, nodes, what, extra)
    found = _NO_FIT.get(key)
    if found is None:
        found = _no_node_fits(rejections, nodes, what, extra)
        if len(_NO_FIT) > 65536:
            _NO_FIT.clear()
        _NO_FIT[key] = found
    return found


_NO_FIT: dict[tuple[tuple[int, ...], int, str, tuple[tuple[str, str, int], ...]], Reason] = {}


def _no_node_fits(rejections: tuple[int, ...], nodes: int, what: str,
                  extra: tuple[tuple[str, str, int], ...]) -> Reason:
    parts = []
    numbers = {"nodes": nodes}
    causes = [(key, phrase, count) for (key, phrase), count in zip(REJECTION_NAMES, rejections)]
    causes[1:1] = list(extra)
    for key, phrase, count in causes:
        if count:
            parts.append(f"{count} {phrase}")
            numbers[key] = count
    detail = "; ".join(parts) if parts else (
        "the capacity that fits is held for pipelined pods waiting on it" if nodes else "no nodes")
    return Reason(code=NO_NODE_FITS, message=f"0/{nodes} nodes can run {what}: {detail}",
                  numbers=dict(sorted(numbers.items())))
