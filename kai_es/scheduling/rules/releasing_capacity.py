"""Releasing capacity: what a pipelined placement may count on — the capacity of the pods
being released (KAI's Releasing), once they are gone.

- `AllReleasingV6` (kai-es/v1 to v6): every Releasing pod's capacity, however long it has been
  leaving.
- `StuckReleasingHeld` (kai-es/v7 on, KAI's StuckInReleasing, v0.15): a Running pod whose
  `deletionTimestamp` lies more than the config's `stuckInReleasingThreshold` (default 2m) before
  the cycle's time is stuck releasing. Its capacity stays used: nothing is pipelined onto it,
  and the cycle names the pod (CycleCompleted `stuck_releasing`; `kai-es cycle` shows it as
  StuckInReleasing). A pod kai-es decided to evict is Releasing from that decision on, but
  stuck only once the apiserver's deletion time is observed and the threshold has passed since.
- `HeldIdleSkipped` (kai-es/v10 on): as `StuckReleasingHeld`; and a pod whose packer-picked node
  has idle capacity that fits but is held for pods pipelined there (their releasing capacity
  is not enough for them) is placed on the next node that fits, instead of waiting the cycle
  out with "the capacity that fits is held for pipelined pods" while other nodes have room
  (common once background pods make every node with one a pipelining target).

Contract: a pure function of the folded state, the config and the cycle's time; it changes
only the cycle's Plan, before any operation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from kai_es.events.timefmt import parse_duration
from kai_es.state.model import ClusterState

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig
    from kai_es.scheduling.plan import Plan


class ReleasingCapacity(Protocol):
    #: the cycle's Plan passes over idle capacity held for pipelined pods (`Plan.skips_held_idle`)
    skips_held_idle: bool

    def hold(self, state: ClusterState, plan: Plan, now_ns: int, config: SchedulerConfig) -> list[str]:
        """Hold in `plan` the capacity no pipelined placement may count on this cycle; the keys
        of the pods it belongs to, sorted."""


class AllReleasingV6:
    __slots__ = ()
    skips_held_idle = False

    def hold(self, state: ClusterState, plan: Plan, now_ns: int, config: SchedulerConfig) -> list[str]:
        return []


class StuckReleasingHeld:
    __slots__ = ()
    skips_held_idle = False

    def hold(self, state: ClusterState, plan: Plan, now_ns: int, config: SchedulerConfig) -> list[str]:
        stuck = stuck_releasing(state, now_ns, parse_duration(config.stuck_in_releasing_threshold))
        for key in stuck:
            plan.hold(key)
        return stuck


class HeldIdleSkipped(StuckReleasingHeld):
    __slots__ = ()
    skips_held_idle = True


def deleting_pods(state: ClusterState) -> Iterator[tuple[str, int]]:
    """(key, deletion time) of each Releasing Running pod whose deletion time is known (only
    nodes that hold a releasing pod are looked at; 0, from an older informer, is not known)."""
    pods = state.pods
    for node in state.nodes.values():
        if not node.releasing_pods:
            continue
        for key in node.pods:
            pod = pods[key]
            spec = pod.spec
            if pod.status == "Releasing" and spec.terminating and spec.phase == "Running" and spec.deletion_ns:
                yield key, spec.deletion_ns


def stuck_releasing(state: ClusterState, now_ns: int, threshold_ns: int) -> list[str]:
    """The Running pods being deleted since more than `threshold_ns` before `now_ns`, by key."""
    return sorted(key for key, deleted in deleting_pods(state) if now_ns - deleted > threshold_ns)
