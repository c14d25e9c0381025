"""The informer service: turns cluster object changes into observed events. It decides nothing.

Contract:
- A relist emits ResyncStarted, an observed event per object, then ResyncCompleted, per kind, so
  the reducer drops objects that vanished while we were not watching. That happens for every
  kind at start (`resync`) and for one kind whenever the source sends a `Relist` of it (its
  watch could not resume); the markers and the kind's objects are one atomic append, and every
  object of the kind is emitted (none is dropped as unchanged, or the reducer would drop it).
- A change whose translated payload equals the last one emitted for that subject (a node
  heartbeat, a status field we do not read) is dropped: it cannot matter to scheduling.
- An object that cannot be translated becomes an ObjectRejected event with the field path and
  reason: it is reported in the log, never dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest import translate as tr
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ports import Clock, ClusterSource, EventLog, IdFactory, ObjectChange, Relist

log = logging.getLogger(__name__)
SOURCE = "kai-es/informer"
KINDS = ("PriorityClass", "Queue", "Topology", "Namespace", "ConfigMap", "PersistentVolume",
         "PersistentVolumeClaim", "Node", "PodGroup", "Pod")


class InformerService:
    def __init__(self, events: EventLog, source: ClusterSource, clock: Clock, ids: IdFactory, *,
                 ours: str = SCHEDULER_NAME) -> None:
        self.events = events
        #: the scheduler name kai-es answers to (a Pod's translation depends on it)
        self.ours = ours
        self.source = source
        self.clock = clock
        self.ids = ids
        self._last: dict[str, p.Payload] = {}
        self.appended = 0
        self.dropped = 0
        self.rejected = 0

    def _envelope(self, payload: p.Payload, subject: str) -> Envelope:
        return make_envelope(payload, event_id=self.ids.new_id(), source=SOURCE, subject=subject,
                             logicaltime=self.clock.now_ns())

    def translate(self, change: ObjectChange) -> Envelope | None:
        """The event for one change, or None when it does not matter."""
        obj = change.obj
        try:
            if change.action == "DELETED":
                payload = tr.removal(obj)
                subject = tr.subject_of(payload)
                self._last.pop(subject, None)
                return self._envelope(payload, subject)
            payload = tr.translate(obj, ours=self.ours)
        except tr.IngestError as exc:
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            assert isinstance(meta, dict)
            self.rejected += 1
            log.warning("rejected %s %s/%s: %s", change.kind, meta.get("namespace", ""),
                        meta.get("name", ""), exc)
            rejected = p.ObjectRejected(kind=change.kind, namespace=str(meta.get("namespace", "") or ""),
                                        name=str(meta.get("name", "") or ""), path=exc.path,
                                        reason=exc.message)
            return self._envelope(rejected, f"rejected/{change.kind.lower()}/{rejected.name}")
        subject = tr.subject_of(payload)
        if self._last.get(subject) == payload:
            self.dropped += 1
            return None
        self._last[subject] = payload
        return self._envelope(payload, subject)

    def _relist(self, kind: str, changes: Sequence[ObjectChange]) -> list[Envelope]:
        """ResyncStarted(kind), an event per object (never dropped as unchanged), ResyncCompleted."""
        prefix = f"{kind.lower()}/"
        for subject in [s for s in self._last if s.startswith(prefix)]:
            del self._last[subject]
        out = [self._envelope(p.ResyncStarted(kind=kind), f"resync/{kind.lower()}")]  # type: ignore[arg-type]
        for change in changes:
            env = self.translate(change)
            if env is not None:
                out.append(env)
        out.append(self._envelope(p.ResyncCompleted(kind=kind), f"resync/{kind.lower()}"))  # type: ignore[arg-type]
        return out

    async def pump(self, changes: Sequence[ObjectChange | Relist]) -> int:
        """Append the events of a batch of changes (in order, one append); returns how many
        were appended."""
        batch: list[Envelope] = []
        for change in changes:
            if isinstance(change, Relist):
                batch += self._relist(change.kind, [ObjectChange(change.kind, "ADDED", obj)
                                                    for obj in change.objects])
            else:
                env = self.translate(change)
                if env is not None:
                    batch.append(env)
        if batch:
            await self.events.append(batch)
            self.appended += len(batch)
        return len(batch)

    async def resync(self) -> int:
        """Relist everything and append it bracketed by resync markers, per kind."""
        objects = await self.source.list_objects()
        self._last.clear()
        batch: list[Envelope] = []
        for kind in KINDS:
            batch += self._relist(kind, [c for c in objects if c.kind == kind])
        await self.events.append(batch)
        self.appended += len(batch)
        return len(batch)

    async def follow(self) -> None:
        """Append the source's changes as they come (after a `resync`), forever. The changes
        iterator is closed in this task when this returns or is cancelled (a source may run
        tasks inside it)."""
        changes = self.source.changes()
        try:
            async for batch in changes:
                await self.pump(batch)
        finally:
            aclose = getattr(changes, "aclose", None)
            if aclose is not None:
                await aclose()

    async def run(self) -> None:
        await self.resync()
        await self.follow()
