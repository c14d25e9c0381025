"""Ports that fail as the real ones do, on a `FaultPlan`'s rolls: the seams a deterministic
simulation run (`kai_es.app.dst`) puts between the real services and the memory log and the
simulated cluster.

- `FaultyLog`: one process instance's view of the shared log. Crashes before or after an
  append's records are visible, part-way through a read, at `end_position`; over the file log,
  a crash in the middle of an append's write (`torn_append`, through `TearingFileLog`: a prefix
  of the batch's bytes is left in the file); writer identities
  as Kafka's transactional ids give them (`claim_writer` fences every older instance of the
  role: its next append or `check_writer` raises `WriterFenced`); a binder append kept twice
  (`duplicate_outcomes`) or held while the other processes run (`delay_outcomes`, through the
  run's `interleave` hook).
- `FaultyActuator`: the apiserver behind `KubernetesActuator`, answering as that actuator's
  contract turns each answer into an outcome: a 409 on a bind it did not apply is a failure
  naming the conflict; 429 (priority and fairness), 500 and timeouts are retried up to
  `ATTEMPTS` tries and then a failure "gave up after …"; a timeout after the request took
  effect is followed by a 409 (bind: the pod is read back, on that node: done) or a 404
  (eviction: already gone); a PodDisruptionBudget's 429 is a retryable refusal. Also deletes
  the bind's node or the pod just before the call, and crashes before or after the effect. It
  counts the effects the cluster really applied, per pod uid.
- `LossyWatch`: the informer's watch; a lost change is followed, at the next pump, by a
  `Relist` of its kind (410 Gone).
- `MemorySnapshotStore`, `MemoryBlobStore`: durable stores that outlive process instances.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.snapshot_codec import decode_stored, encode_stored
from kai_es.events import Envelope, Record
from kai_es.ports import ActionOutcome, EventLog, ObjectChange, Relist, StoredSnapshot
from kai_es.sim.cluster import SimCluster
from kai_es.sim.faults import Crash, FaultPlan

#: tries `KubernetesActuator` makes before it gives up on a transient error (its default)
ATTEMPTS = 5


class WriterFenced(RuntimeError):
    """Another instance of this role claimed the log's writer identity (Kafka's FencedError)."""


class WriterEpochs:
    """The log's writer identities: role -> the epoch of its newest claim."""

    def __init__(self) -> None:
        self.epochs: Counter[str] = Counter()

    def claim(self, role: str) -> int:
        self.epochs[role] += 1
        return self.epochs[role]


class TearingFileLog(FileEventLog):
    """A `FileEventLog` whose append can die in the middle of its write: when `torn_by` names a
    role, the next append runs as the real one does (the lock, a crashed writer's leftover
    removed) but writes only a prefix of its bytes (drawn from `plan`, 1 to all but one) and
    raises `Crash` for that role, the lock freed as a dying process frees it."""

    def __init__(self, path: Path, plan: FaultPlan) -> None:
        super().__init__(path)
        self.plan = plan
        self.torn_by: str | None = None

    def _write(self, f: BinaryIO, blob: bytes) -> None:
        role, self.torn_by = self.torn_by, None
        if role is None:
            super()._write(f, blob)
            return
        cut = self.plan.between(1, len(blob) - 1)
        f.write(blob[:cut])
        f.flush()
        raise Crash(role, f"append torn after {cut} of {len(blob)} bytes")


class FaultyLog:
    """`EventLog` of one process instance (contract: module docstring)."""

    def __init__(self, inner: EventLog, plan: FaultPlan, role: str, writers: WriterEpochs, *,
                 interleave: Callable[[], Awaitable[None]] | None = None) -> None:
        self.inner, self.plan, self.role, self.writers = inner, plan, role, writers
        self.epoch = 0
        self.interleave = interleave
        #: appends refused because this instance was fenced
        self.fenced_appends = 0

    def _check(self) -> None:
        if self.epoch != self.writers.epochs[self.role]:
            raise WriterFenced(f"{self.role} instance of epoch {self.epoch} was fenced by epoch "
                               f"{self.writers.epochs[self.role]}")

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        self.plan.crash_point(self.role, "append.before")
        outcomes = self.role == "binder"
        if outcomes and self.interleave is not None and self.plan.roll("delay_outcomes"):
            await self.interleave()
        try:
            self._check()
        except WriterFenced:
            self.fenced_appends += 1
            raise
        if isinstance(self.inner, TearingFileLog) and events and self.plan.roll("torn_append", self.role):
            self.inner.torn_by = self.role
        positions = await self.inner.append(events)
        if outcomes and self.plan.roll("duplicate_outcomes"):
            await self.inner.append(events)
        self.plan.crash_point(self.role, "append.after")
        return positions

    async def read(self, from_position: int = 0, *, follow: bool = False) -> AsyncIterator[Record]:
        crash_after = self.plan.between(0, 8) if self.plan.roll("crash", f"{self.role}.read") else -1
        n = 0
        async for record in self.inner.read(from_position, follow=follow):
            if n == crash_after:
                raise Crash(self.role, f"read after {n} records")
            yield record
            n += 1

    async def end_position(self) -> int:
        self.plan.crash_point(self.role, "end_position")
        return await self.inner.end_position()

    async def claim_writer(self) -> None:
        self.epoch = self.writers.claim(self.role)

    async def check_writer(self) -> None:
        self._check()

    async def close(self) -> None:
        return None


class FaultyActuator:
    """`ClusterActuator` over a SimCluster (contract: module docstring)."""

    def __init__(self, cluster: SimCluster, plan: FaultPlan) -> None:
        self.cluster, self.plan = cluster, plan
        #: pod uid -> binds / evictions the cluster applied (not "already done")
        self.applied_binds: Counter[str] = Counter()
        self.applied_evictions: Counter[str] = Counter()

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Sequence[int], gpu_groups: Sequence[str]) -> ActionOutcome:
        plan = self.plan
        plan.crash_point("binder", "bind.before")
        if plan.roll("delete_node"):
            self.cluster.delete_node(node)
        if plan.roll("delete_pod"):
            self.cluster.delete_pod(f"{namespace}/{name}")
        if plan.roll("api_conflict"):
            return ActionOutcome(ok=False, message=f"HTTP 409: Operation cannot be fulfilled on pods/binding "
                                                   f"\"{name}\": the object has been modified")

        async def apply() -> ActionOutcome:
            result = await self.cluster.bind(namespace, name, uid, node, gpu_devices, gpu_groups)
            if result.ok and not result.already:
                self.applied_binds[uid] += 1
            return result

        outcome = await self._attempts(apply, after_timeout=lambda: self.cluster.bind(
            namespace, name, uid, node, gpu_devices, gpu_groups))
        plan.crash_point("binder", "bind.after")
        return outcome

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        plan = self.plan
        plan.crash_point("binder", "evict.before")
        if plan.roll("delete_pod"):
            self.cluster.delete_pod(f"{namespace}/{name}")
        if plan.roll("refuse_eviction"):
            return ActionOutcome(ok=False, retryable=True,
                                 message="HTTP 429: Cannot evict pod as it would violate the pod's disruption budget.")

        async def apply() -> ActionOutcome:
            result = await self.cluster.evict(namespace, name, uid)
            if result.ok and not result.already:
                self.applied_evictions[uid] += 1
            return result

        outcome = await self._attempts(apply, after_timeout=lambda: self.cluster.evict(namespace, name, uid))
        plan.crash_point("binder", "evict.after")
        return outcome

    async def _attempts(self, apply: Callable[[], Awaitable[ActionOutcome]], *,
                        after_timeout: Callable[[], Awaitable[ActionOutcome]]) -> ActionOutcome:
        """Up to ATTEMPTS tries of `apply` with transient faults rolled at each; a timeout after
        the request applied makes the next try find it done (`after_timeout`)."""
        plan = self.plan
        last = ""
        applied = False
        for _ in range(ATTEMPTS):
            if applied:
                return await after_timeout()
            if plan.roll("api_throttled"):
                last = "HTTP 429: Too many requests, please try again later."
                continue
            if plan.roll("api_error"):
                last = "HTTP 500: Internal error occurred: etcdserver: request timed out"
                continue
            if plan.roll("api_timeout"):
                last = "TimeoutError: "
                if plan.coin():
                    result = await apply()
                    applied = result.ok
                    if not result.ok:
                        return result
                continue
            return await apply()
        return ActionOutcome(ok=False, message=f"gave up after {ATTEMPTS} attempts: {last}")


class LossyWatch:
    """The informer's source of changes over a SimCluster (contract: module docstring)."""

    def __init__(self, cluster: SimCluster, plan: FaultPlan) -> None:
        self.cluster, self.plan = cluster, plan
        self._relist: list[str] = []

    def restart(self) -> None:
        """A new watch after a relist: what the old one had not delivered is covered by the list."""
        self.cluster.drain_changes()
        self._relist.clear()

    def pending(self) -> list[ObjectChange | Relist]:
        """The changes to pump now: first the relists a lost change asked for, then what the
        cluster changed, minus the changes this watch loses."""
        out: list[ObjectChange | Relist] = [Relist(kind, self.cluster.objects_of(kind)) for kind in self._relist]
        self._relist = []
        for change in self.cluster.drain_changes():
            if self.plan.roll("lose_watch", change.kind):
                if change.kind not in self._relist:
                    self._relist.append(change.kind)
                continue
            out.append(change)
        return out


class MemoryBlobStore:
    def __init__(self) -> None:
        self.blob: bytes | None = None

    async def save_blob(self, blob: bytes) -> None:
        self.blob = bytes(blob)

    async def load_blob(self) -> bytes | None:
        return self.blob

    async def close(self) -> None:
        return None


class MemorySnapshotStore(MemoryBlobStore):
    """`SnapshotStore` keeping the newest snapshot's encoded bytes (as the file store does)."""

    async def save(self, snap: StoredSnapshot) -> None:
        await self.save_blob(encode_stored(snap))

    async def load_latest(self) -> StoredSnapshot | None:
        return decode_stored(self.blob) if self.blob is not None else None
