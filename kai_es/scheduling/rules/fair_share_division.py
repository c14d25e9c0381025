"""Fair-share division: how each resource's capacity is divided among the queues
(`kai_es.scheduling.fairshare.divide`), per policy version.

- `ExactDivisionV1` (kai-es/v1): GPUs over quota divided exactly (in milli-GPU); no time-based
  fair share.
- `WholeGpuDivisionV2` (kai-es/v2, as KAI): GPUs over quota handed out in whole GPUs; no
  time-based fair share.
- `WholeGpuDivision` (kai-es/v3 on): whole GPUs, and time-based fair share when the config
  turns it on (`fairshare.timeBased`): the over-quota rounds weigh each queue by its decayed
  historical usage (`kai_es.scheduling.usage`).
- `ReplacementsCountedOnce` (kai-es/v6 on): `WholeGpuDivision`, and a job's pending pods that
  replace its Releasing ones are not asked for twice (`fairshare.pending_request`): during a
  reclaim the victim queue's request, and so its fair share, no longer swell with the victims'
  replacements while the victims are still leaving.
- `QuotaGrantedInFull` (kai-es/v10 on): `ReplacementsCountedOnce`, and quotas that add up to
  more than their parent's share (a cluster sold over its capacity) are each granted in full,
  min(quota, request), as KAI's `setDeservedResource` does; kai-es/v1 to v9 served them by queue
  priority and scaled them down within a priority. (Found by KAI's integration test "1 running
  job over quota ... cluster is in over capacity" in tests/test_kai_rounds.py: a queue within
  its quota could not reclaim from one over it.)

Contract: `shares(state, config, now_ns)` is a pure function of the folded state, the config
in force and the cycle's logical time; CPU and memory are always divided exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.fairshare import QueueShare, TimeBased, shares_for_state
from kai_es.scheduling.usage import queue_usage
from kai_es.state.model import ClusterState

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig


class FairShareDivision(Protocol):
    #: GPUs over quota are divided in units of this many milli-GPU (1: exactly)
    @property
    def gpu_unit(self) -> int: ...

    #: a job's pending replacements of its Releasing pods are not requested twice (kai-es/v6 on)
    @property
    def replacements_once(self) -> bool: ...

    #: quotas are granted in full even when they add up to more than there is (kai-es/v10 on)
    @property
    def quota_granted(self) -> bool: ...

    def time_based(self, state: ClusterState, config: SchedulerConfig | None, now_ns: int) -> TimeBased | None:
        """The historical usage weighing the over-quota rounds (None: not weighed)."""

    def shares(self, state: ClusterState, config: SchedulerConfig | None, now_ns: int
               ) -> dict[str, dict[str, QueueShare]]:
        """resource -> queue -> its share, as this division divides."""


class _Division:
    __slots__ = ()
    gpu_unit = 1
    replacements_once = False
    quota_granted = False

    def time_based(self, state: ClusterState, config: SchedulerConfig | None, now_ns: int) -> TimeBased | None:
        return None

    def shares(self, state: ClusterState, config: SchedulerConfig | None, now_ns: int
               ) -> dict[str, dict[str, QueueShare]]:
        return shares_for_state(state, self.gpu_unit, self.time_based(state, config, now_ns), self.replacements_once,
                                self.quota_granted)


class ExactDivisionV1(_Division):
    """kai-es/v1: GPUs divided exactly; no time-based fair share."""

    __slots__ = ()


class WholeGpuDivisionV2(_Division):
    """kai-es/v2: GPUs over quota in whole GPUs (KAI's); no time-based fair share."""

    __slots__ = ()
    gpu_unit = 1000


class WholeGpuDivision(_Division):
    """kai-es/v3 on: whole GPUs, weighed by historical usage when `fairshare.timeBased`."""

    __slots__ = ()
    gpu_unit = 1000

    def time_based(self, state: ClusterState, config: SchedulerConfig | None, now_ns: int) -> TimeBased | None:
        if config is None or not config.fairshare.time_based:
            return None
        return TimeBased(queue_usage(state, config, now_ns), config.fairshare.k)


class ReplacementsCountedOnce(WholeGpuDivision):
    """kai-es/v6 on: `WholeGpuDivision`, replacements of Releasing pods requested once."""

    __slots__ = ()
    replacements_once = True


class QuotaGrantedInFull(ReplacementsCountedOnce):
    """kai-es/v10 on: `ReplacementsCountedOnce`, quotas granted in full however short."""

    __slots__ = ()
    quota_granted = True
