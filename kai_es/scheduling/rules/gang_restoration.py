"""Gang restoration: whether allocate first places the pods that restore a running gang's
minimum (after nominated pods, before the queue order).

- `NoGangRestorationV3` (kai-es/v1 to v3): no; such pods wait their turn in the queue order.
- `RestoreGangsFirst` (kai-es/v4 on): running gangs below their minimum
  (`ClusterState.gangs_below_minimum`) go next, longest below first, with the pods that restore
  their minimum: their running pods are held for nothing meanwhile, and the stale-gang clock
  runs. This is what brings a gang whose pods consolidation moved back together on the room
  made for them, before new work can take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kai_es.scheduling.actions.allocate import Allocator


class GangRestoration(Protocol):
    def restore(self, allocator: Allocator) -> None:
        """Try, ahead of the queue order, the gangs this rule restores first."""


class NoGangRestorationV3:
    __slots__ = ()

    def restore(self, allocator: Allocator) -> None:
        return None


class RestoreGangsFirst:
    __slots__ = ()

    def restore(self, allocator: Allocator) -> None:
        state = allocator.state
        jobs = [state.jobs[k] for k in state.gangs_below_minimum]
        for job in sorted(jobs, key=lambda j: (j.stale_since_ns, j.key)):
            if job.pending:
                allocator.try_ahead(job)
