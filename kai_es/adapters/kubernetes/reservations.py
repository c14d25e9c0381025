"""The binder-side follower that deletes GPU reservation pods once their sharing pods left.

Contract: it watches the log the binder reads for shared-GPU pods (a BindingDecided with GPU
groups, a PodObserved with a `runai-gpu-group`) and for their leaving (PodRemoved, a
PodObserved Succeeded/Failed, PodEvicted, PodBindFailed); after each binder step it asks
`GpuSharing.release_unused` about the groups touched, which checks the cluster itself (a
group is released only when no Pending or Running pod carries it), so replaying the log is
harmless. The first flush, and then one flush every `sync_every_s`, syncs every reservation
pod (`sync_all`), so groups whose pods left while no binder ran (or before the point a resumed
binder reads from) are released too. Memory: one entry per shared-GPU pod present.
"""

from __future__ import annotations

import time

from kai_es.adapters.kubernetes.gpushare import GpuSharing
from kai_es.events import Record
from kai_es.events import payloads as p


class ReservationKeeper:
    """A binder Follower (see kai_es/services/binder.py); contract: module docstring."""

    def __init__(self, sharing: GpuSharing, *, sync_every_s: float = 60.0) -> None:
        self.sharing = sharing
        self.sync_every_s = sync_every_s
        self._synced_at = 0.0
        self._groups: dict[tuple[str, str], tuple[str, ...]] = {}
        self._touched: set[str] = set()
        self._synced = False
        self.released = 0  # reservation pods deleted

    def observe(self, record: Record) -> None:
        data = record.envelope.data
        if isinstance(data, p.BindingDecided):
            if data.gpu_groups:
                self._groups[(data.namespace, data.name)] = tuple(data.gpu_groups)
        elif isinstance(data, p.PodObserved):
            key = (data.namespace, data.name)
            if data.gpu_group and data.gpu_group not in self._groups.get(key, ()):
                self._groups[key] = self._groups.get(key, ()) + (data.gpu_group,)
            if data.phase in ("Succeeded", "Failed"):
                self._touched.update(self._groups.pop(key, ()))
        elif isinstance(data, p.PodRemoved):
            self._touched.update(self._groups.pop((data.namespace, data.name), ()))
        elif isinstance(data, (p.PodEvicted, p.PodBindFailed)):
            self._touched.update(self._groups.get((data.namespace, data.name), ()))

    async def flush(self) -> None:
        if not self._synced or time.monotonic() - self._synced_at >= self.sync_every_s:
            self.released += len(await self.sharing.sync_all())
            self._synced, self._synced_at = True, time.monotonic()
        if self._touched:
            groups, self._touched = self._touched, set()
            self.released += len(await self.sharing.release_unused(groups))
