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
- With shards (`kai_es.ingest.shards`), every shard has its own log and `Router` says where each
  event goes: each shard's log gets the relist markers of every kind and the objects routed to
  it. When an object moves between shards, the batch holding its removal from the old shard is
  appended before the one adding it to the new shard. A pod of ours that no shard serves becomes
  an ObjectRejected naming its node pool, in the shard of unlabelled objects (else the first).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest import translate as tr
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.pod_memo import PodMemo
from kai_es.ingest.shards import PARTITIONED, Route, Router, ShardMap
from kai_es.ports import Clock, ClusterSource, EventLog, IdFactory, ObjectChange, Relist

log = logging.getLogger(__name__)
SOURCE = "kai-es/informer"
KINDS = ("PriorityClass", "Queue", "Topology", "Namespace", "ConfigMap", "PersistentVolume",
         "PersistentVolumeClaim", "Node", "PodGroup", "Pod")


def _subject(payload: p.Payload) -> str:
    if isinstance(payload, p.ObjectRejected):
        return f"rejected/{payload.kind.lower()}/{payload.name}"
    return tr.subject_of(payload)


class InformerService:
    def __init__(self, events: EventLog | Mapping[str, EventLog], source: ClusterSource, clock: Clock,
                 ids: IdFactory, *, ours: str = SCHEDULER_NAME, shards: ShardMap | None = None,
                 memo_pods: bool = True) -> None:
        """`events`: the log, or with `shards` each shard's log by shard name; `memo_pods`: pods
        are translated through a `PodMemo` (the same payloads, less work per watch event)."""
        if (shards is None) != (not isinstance(events, Mapping)):
            raise TypeError("one log without shards, a log per shard with them")
        #: each shard's log by name (with shards)
        self.logs: dict[str, EventLog] = {}
        if isinstance(events, Mapping):
            assert shards is not None
            if sorted(events) != sorted(shards.names):
                raise ValueError(f"a log per shard: shards {shards.names}, logs {sorted(events)}")
            self.logs = dict(events)
            events = self.logs[shards.home.name]
        #: the log (with shards: the one rejections go to)
        self.events: EventLog = events
        self.router = Router(shards, ours) if shards is not None else None
        #: the scheduler name kai-es answers to (a Pod's translation depends on it)
        self.ours = ours
        self.source = source
        self.clock = clock
        self.ids = ids
        self._last: dict[str, p.Payload] = {}
        self._memo_pods = memo_pods
        self.pod_memo = PodMemo()
        self.appended = 0
        self.dropped = 0
        self.rejected = 0

    def _translate(self, obj: Mapping[str, object]) -> p.Payload:
        if self._memo_pods:
            return self.pod_memo.translate(obj, ours=self.ours)
        return tr.translate(obj, ours=self.ours)

    def _removal(self, obj: Mapping[str, object]) -> p.Payload:
        payload = tr.removal(obj)
        if isinstance(payload, p.PodRemoved):
            self.pod_memo.forget(payload.namespace, payload.name)
        return payload

    def _envelope(self, payload: p.Payload, subject: str) -> Envelope:
        return make_envelope(payload, event_id=self.ids.new_id(), source=SOURCE, subject=subject,
                             logicaltime=self.clock.now_ns())

    def translate(self, change: ObjectChange) -> Envelope | None:
        """The event for one change, or None when it does not matter."""
        obj = change.obj
        try:
            if change.action == "DELETED":
                payload = self._removal(obj)
                subject = tr.subject_of(payload)
                self._last.pop(subject, None)
                return self._envelope(payload, subject)
            payload = self._translate(obj)
        except tr.IngestError as exc:
            rejected = self._rejected(change, exc)
            return self._envelope(rejected, _subject(rejected))
        subject = tr.subject_of(payload)
        if self._last.get(subject) == payload:
            self.dropped += 1
            return None
        self._last[subject] = payload
        return self._envelope(payload, subject)

    def _rejected(self, change: ObjectChange, exc: tr.IngestError) -> p.ObjectRejected:
        """The ObjectRejected of a change that could not be translated (counted and logged)."""
        meta = change.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        namespace, name = str(meta.get("namespace", "") or ""), str(meta.get("name", "") or "")
        self.rejected += 1
        log.warning("rejected %s %s/%s: %s", change.kind, namespace, name, exc)
        return p.ObjectRejected(kind=change.kind, namespace=namespace, name=name, path=exc.path,
                                reason=exc.message)

    def _relist(self, kind: str, changes: Sequence[ObjectChange]) -> list[Envelope]:
        """ResyncStarted(kind), an event per object (never dropped as unchanged), ResyncCompleted."""
        prefix = f"{kind.lower()}/"
        for subject in [s for s in self._last if s.startswith(prefix)]:
            del self._last[subject]
        if kind == "Pod":
            self.pod_memo = PodMemo()  # (pods that vanished meanwhile leave it)
        out = [self._envelope(p.ResyncStarted(kind=kind), f"resync/{kind.lower()}")]  # type: ignore[arg-type]
        for change in changes:
            env = self.translate(change)
            if env is not None:
                out.append(env)
        out.append(self._envelope(p.ResyncCompleted(kind=kind), f"resync/{kind.lower()}"))  # type: ignore[arg-type]
        return out

    async def pump(self, changes: Sequence[ObjectChange | Relist]) -> int:
        """Append the events of a batch of changes (in order, one append; with shards, one per
        shard); returns how many were appended."""
        if self.router is not None:
            return await self._pump_shards(changes)
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
        if self.router is not None:
            return await self._pump_shards([Relist(kind, tuple(c.obj for c in objects if c.kind == kind))
                                            for kind in KINDS])
        self._last.clear()
        batch: list[Envelope] = []
        for kind in KINDS:
            batch += self._relist(kind, [c for c in objects if c.kind == kind])
        await self.events.append(batch)
        self.appended += len(batch)
        return len(batch)

    # -- shards ----------------------------------------------------------------------------------

    async def _pump_shards(self, changes: Sequence[ObjectChange | Relist]) -> int:
        router = self.router
        assert router is not None
        batches: dict[str, list[Envelope]] = {name: [] for name in router.shards.names}
        appended = 0

        async def flush(name: str) -> None:
            nonlocal appended
            if batches[name]:
                await self.logs[name].append(batches[name])
                appended += len(batches[name])
                batches[name] = []

        async def send(route: Route) -> None:
            for name, payload in route.sends:
                batches[name].append(self._envelope(payload, _subject(payload)))
            for name, payload in route.moves:
                batches[name].append(self._envelope(payload, _subject(payload)))
            for name in dict.fromkeys(name for name, _ in route.moves):
                await flush(name)  # the removals from the old shards are durable before the adds
            for name, payload in route.adds:
                batches[name].append(self._envelope(payload, _subject(payload)))
            if route.rejected is not None:
                pod = route.rejected.payload
                self.rejected += 1
                log.warning("rejected Pod %s/%s: %s", pod.namespace, pod.name, route.rejected.reason)
                rejected = p.ObjectRejected(kind="Pod", namespace=pod.namespace, name=pod.name,
                                            path=f"metadata.labels[{tr.NODE_POOL_LABEL}]",
                                            reason=route.rejected.reason)
                home = router.shards.home.name
                batches[home].append(self._envelope(rejected, _subject(rejected)))

        for change in changes:
            if isinstance(change, Relist):
                if change.kind == "Pod":
                    self.pod_memo = PodMemo()  # (pods that vanished meanwhile leave it)
                for name in router.shards.names:
                    batches[name].append(self._envelope(p.ResyncStarted(kind=change.kind),  # type: ignore[arg-type]
                                                        f"resync/{change.kind.lower()}"))
                seen: set[str] = set()
                for obj in change.objects:
                    route, subject = self._route(router, ObjectChange(change.kind, "ADDED", obj), relisting=True)
                    if subject:
                        seen.add(subject)
                    await send(route)
                kind = PARTITIONED.get(change.kind)
                if kind is not None:
                    router.prune(kind, seen)
                for name in router.shards.names:
                    batches[name].append(self._envelope(p.ResyncCompleted(kind=change.kind),  # type: ignore[arg-type]
                                                        f"resync/{change.kind.lower()}"))
            else:
                route, _ = self._route(router, change, relisting=False)
                await send(route)
        for name in router.shards.names:
            await flush(name)
        self.appended += appended
        return appended

    def _route(self, router: Router, change: ObjectChange, *, relisting: bool) -> tuple[Route, str]:
        """The route of one change and its subject ("" when it could not be translated: then
        the route is the ObjectRejected, to the object's shard)."""
        obj = change.obj
        try:
            if change.action == "DELETED":
                return router.route(self._removal(obj)), ""
            payload = self._translate(obj)
        except tr.IngestError as exc:
            rejected = self._rejected(change, exc)
            kind, ns = change.kind.lower(), rejected.namespace
            subject = f"{kind}/{ns}/{rejected.name}" if ns else f"{kind}/{rejected.name}"
            return Route(sends=[(router.shard_of_subject(subject), rejected)]), ""
        meta = obj.get("metadata")
        raw = meta.get("labels") if isinstance(meta, Mapping) else None
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        return router.route(payload, labels, relisting=relisting), tr.subject_of(payload)

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
