"""A ClusterSource over the Kubernetes API: LIST then WATCH per kind, raw JSON dicts.

Contract:
- `list_objects()` LISTs every kind (paginated) and remembers each kind's list resourceVersion;
  `changes()` then WATCHes each kind from there (one task per kind under an anyio task group)
  with bookmarks, so nothing between the list and the watch is lost. `changes()` without a
  prior `list_objects()` (or kinds missing from `resume_from`) starts that kind with a LIST,
  sent as a `Relist`.
- A watch that ends (server timeout, connection error such as an apiserver restart) is resumed
  from the last resourceVersion seen (event or bookmark). When the server answers 410 Gone
  (that version is no longer in its watch cache) the kind is LISTed again and sent as one
  `Relist(kind, objects)`: only that kind is relisted.
- Other failures (5xx, 429, connection refused, 403/404 such as a CRD not installed yet) are
  retried with bounded exponential backoff and logged; the source never gives up on a kind.
  A LIST of an optional kind (`OPTIONAL_KINDS`) answered 404 (or 403: an older ClusterRole) is
  an empty list instead, and its watch retries until the kind is served (quietly) or allowed.
- Objects are the API's JSON as dicts, each with `kind` and `apiVersion` set (LIST items lack
  them), without what nothing in kai-es reads (`api_json`: `metadata.managedFields`, a
  ConfigMap's data). A change's kind is the source's name for it (`WorkloadPodGroup` for the Workload API's
  PodGroups, whose objects' kind is `PodGroup`). Nothing is decoded into kubernetes-asyncio's generated models (several times the CPU).
- Within one kind, items come in the order the API server sent them; kinds interleave.
- `changes()` yields what has arrived `coalesce_s` (5 ms) after the first item of a batch (at
  most `batch_max` items): the informer appends a batch at once, so a burst of changes costs
  one append (and one wake-up) instead of one per change; a change waits about `coalesce_s`.
- Pods in `hidden_pod_namespaces` (by default the GPU reservation namespace,
  `kai-resource-reservation`) are filtered out by the apiserver (a field selector on LIST and
  WATCH): a reservation pod holds a shared GPU that the pods sharing it already account for
  (see gpushare.py), so it must not count a second time.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes import api_json
from kai_es.ports import ObjectChange, Relist

log = logging.getLogger(__name__)

#: KAI's namespace for GPU reservation pods (kai_es/adapters/kubernetes/gpushare.py)
RESERVATION_NAMESPACE = "kai-resource-reservation"

#: The kinds kai-es schedules from: the volume and namespace kinds feed the placement
#: predicates (claims, local volumes' node affinity, ConfigMaps, namespace selectors of pod
#: affinity terms), Topology the topology constraints of PodGroups (an optional kind: see
#: `OPTIONAL_KINDS`)
ALL_KINDS = ("PriorityClass", "Queue", "Topology", "Namespace", "ConfigMap", "PersistentVolume",
             "PersistentVolumeClaim", "Node", "PodGroup", "Pod")
DEFAULT_KINDS = ALL_KINDS
#: Kinds whose CRD a cluster may lack (a KAI install without topology support): a LIST answered
#: 404 counts as an empty list (so the informer gets ready), and the kind's watch keeps retrying
#: until the CRD appears, when the watch (from no resourceVersion) sends every object as ADDED
#: The Workload API's PodGroup (scheduling.k8s.io/v1alpha2), apart from KAI's `PodGroup`
WORKLOAD_PODGROUP = "WorkloadPodGroup"
OPTIONAL_KINDS = frozenset({"Topology", WORKLOAD_PODGROUP})
#: What the informer lists and watches: ALL_KINDS and, before the pods, the Workload API's
#: PodGroups, which its podgrouper reads (kai_es/adapters/kubernetes/grouping.py)
INFORMER_KINDS = (*ALL_KINDS[:-1], WORKLOAD_PODGROUP, ALL_KINDS[-1])

Change = ObjectChange | Relist


@dataclass(frozen=True)
class KindApi:
    """How to LIST/WATCH one kind: an apiVersion and a function taking the list/watch keyword
    arguments of the generated API (watch, resource_version, ...)."""

    kind: str
    api_version: str
    call: Callable[[client.ApiClient, dict[str, Any]], Awaitable[Any]]


def _core(method: str) -> Callable[[client.ApiClient, dict[str, Any]], Awaitable[Any]]:
    return lambda api, kw: getattr(client.CoreV1Api(api), method)(**kw)


def _custom(group: str, version: str, plural: str) -> Callable[[client.ApiClient, dict[str, Any]], Awaitable[Any]]:
    return lambda api, kw: client.CustomObjectsApi(api).list_cluster_custom_object(
        group, version, plural, **kw)


KIND_APIS: dict[str, KindApi] = {
    "Node": KindApi("Node", "v1", _core("list_node")),
    "Pod": KindApi("Pod", "v1", _core("list_pod_for_all_namespaces")),
    "PriorityClass": KindApi(
        "PriorityClass", "scheduling.k8s.io/v1",
        lambda api, kw: client.SchedulingV1Api(api).list_priority_class(**kw)),
    "Queue": KindApi("Queue", "scheduling.run.ai/v2", _custom("scheduling.run.ai", "v2", "queues")),
    "PodGroup": KindApi("PodGroup", "scheduling.run.ai/v2alpha2",
                        _custom("scheduling.run.ai", "v2alpha2", "podgroups")),
    "Topology": KindApi("Topology", "kai.scheduler/v1alpha1",
                        _custom("kai.scheduler", "v1alpha1", "topologies")),
    # the Workload API's PodGroups (Kubernetes 1.36, GenericWorkload): read by the podgrouper
    # (grouping.py), never appended to the log; their objects' kind is "PodGroup"
    WORKLOAD_PODGROUP: KindApi("PodGroup", "scheduling.k8s.io/v1alpha2",
                               _custom("scheduling.k8s.io", "v1alpha2", "podgroups")),
    "Namespace": KindApi("Namespace", "v1", _core("list_namespace")),
    "ConfigMap": KindApi("ConfigMap", "v1", _core("list_config_map_for_all_namespaces")),
    "PersistentVolume": KindApi("PersistentVolume", "v1", _core("list_persistent_volume")),
    "PersistentVolumeClaim": KindApi("PersistentVolumeClaim", "v1",
                                     _core("list_persistent_volume_claim_for_all_namespaces")),
}


class Gone(Exception):
    """The server no longer has the resourceVersion we asked for (410): relist."""


class ApiCallError(Exception):
    """An API call answered with a status we retry (5xx, 429, 403, 404...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _status_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return str(doc.get("message") or doc)[:300]
    except ValueError:
        return body[:300].decode("utf-8", "replace")


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return str(rv) if rv else None


class Backoff:
    """Bounded exponential backoff with jitter: base, 2*base, ... up to cap."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 10.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next_delay(self) -> float:
        delay = min(self.cap_s, self.base_s * (2 ** self.attempt))
        self.attempt += 1
        return float(delay * (0.5 + random.random() / 2))

    def reset(self) -> None:
        self.attempt = 0


class KubernetesSource:
    """ClusterSource over one ApiClient (see the module docstring for the contract).

    `resume_from` (kind -> resourceVersion) starts those kinds' watches there without a LIST,
    as a restarted informer that kept its versions would; `resource_versions()` gives the
    versions a later source could resume from. `relists` counts LISTs sent as `Relist` per
    kind; `watch_errors` counts ended watches per kind.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        kinds: Sequence[str] = DEFAULT_KINDS,
        page_size: int = 500,
        watch_timeout_s: int = 300,
        backoff_cap_s: float = 10.0,
        batch_max: int = 1000,
        coalesce_s: float = 0.005,
        resume_from: Mapping[str, str] | None = None,
        hidden_pod_namespaces: Sequence[str] = (RESERVATION_NAMESPACE,),
    ) -> None:
        unknown = [k for k in kinds if k not in KIND_APIS]
        if unknown:
            raise ValueError(f"unsupported kinds {unknown}; supported: {sorted(KIND_APIS)}")
        self.api = api
        self.kinds = tuple(kinds)
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.backoff_cap_s = backoff_cap_s
        self.batch_max = batch_max
        self.coalesce_s = coalesce_s
        self._rv: dict[str, str] = dict(resume_from or {})
        #: a field selector the apiserver filters Pods with (LIST and WATCH alike)
        self.pod_field_selector = ",".join(f"metadata.namespace!={ns}" for ns in hidden_pod_namespaces)
        self.relists: dict[str, int] = {k: 0 for k in self.kinds}
        self.watch_errors: dict[str, int] = {k: 0 for k in self.kinds}

    def resource_versions(self) -> dict[str, str]:
        """The resourceVersion each kind's watch would resume from now."""
        return dict(self._rv)

    # -- LIST ------------------------------------------------------------------------------------

    async def _call(self, kind: str, kw: dict[str, Any], timeout: aiohttp.ClientTimeout) -> Any:
        """The raw aiohttp response of a list/watch call (status not checked)."""
        kw = dict(kw, _preload_content=False, _request_timeout=timeout)
        if kind == "Pod" and self.pod_field_selector:
            kw["field_selector"] = self.pod_field_selector
        return await KIND_APIS[kind].call(self.api, kw)

    async def list_kind(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` (paginated LIST) and the list's resourceVersion.

        Raises Gone if a continue token expired, ApiCallError on an error status, and lets
        aiohttp.ClientError / TimeoutError through."""
        spec = KIND_APIS[kind]
        objects: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            kw: dict[str, Any] = {"limit": self.page_size}
            if cont:
                kw["_continue"] = cont
            resp = await self._call(kind, kw, aiohttp.ClientTimeout(total=120, sock_connect=10))
            try:
                body = await resp.read()
            finally:
                resp.release()
            if resp.status == 410:
                raise Gone(_status_message(body))
            if resp.status != 200:
                raise ApiCallError(resp.status, f"LIST {kind}: {_status_message(body)}")
            doc = api_json.list_document(body)
            for item in doc.get("items") or ():
                item.setdefault("kind", spec.kind)
                item.setdefault("apiVersion", spec.api_version)
                objects.append(item)
            meta = doc.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return objects, str(meta.get("resourceVersion", ""))

    async def _list_retrying(self, kind: str) -> list[dict[str, Any]]:
        """list_kind until it succeeds (backoff between tries); records the list's version."""
        backoff = Backoff(cap_s=self.backoff_cap_s)
        while True:
            try:
                objects, rv = await self.list_kind(kind)
            except ApiCallError as exc:
                if exc.status in (403, 404) and kind in OPTIONAL_KINDS:
                    # 403: a ClusterRole from before the kind was read; the informer runs without it
                    log.log(logging.WARNING if exc.status == 403 else logging.INFO,
                            "LIST %s: %s (%s); watching for it", kind,
                            "forbidden" if exc.status == 403 else "not served", exc)
                    self._rv[kind] = ""
                    return []
                delay = backoff.next_delay()
                log.warning("LIST %s failed (%s: %s); retrying in %.1fs", kind,
                            type(exc).__name__, exc, delay)
                await anyio.sleep(delay)
                continue
            except Exception as exc:  # noqa: BLE001 - see _run_kind
                delay = backoff.next_delay()
                log.warning("LIST %s failed (%s: %s); retrying in %.1fs", kind,
                            type(exc).__name__, exc, delay)
                await anyio.sleep(delay)
                continue
            self._rv[kind] = rv
            return objects

    async def list_objects(self) -> list[ObjectChange]:
        out: list[ObjectChange] = []
        for kind in self.kinds:
            for obj in await self._list_retrying(kind):
                out.append(ObjectChange(kind, "ADDED", obj))
        return out

    # -- WATCH -----------------------------------------------------------------------------------

    async def _watch_once(self, kind: str, send: MemoryObjectSendStream[Change]) -> None:
        """One WATCH from the stored resourceVersion until the server ends it. Updates the
        stored version as events and bookmarks arrive. Raises Gone on 410."""
        kw = {"watch": True, "resource_version": self._rv[kind], "allow_watch_bookmarks": True,
              "timeout_seconds": self.watch_timeout_s}
        timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=self.watch_timeout_s + 30)
        resp = await self._call(kind, kw, timeout)
        ended = False
        try:
            if resp.status != 200:
                body = await resp.read()
                if resp.status == 410:
                    raise Gone(_status_message(body))
                raise ApiCallError(resp.status, f"WATCH {kind}: {_status_message(body)}")
            async for event in _json_lines(resp.content.iter_any()):
                etype = event.get("type")
                obj = event.get("object")
                if not isinstance(obj, dict):
                    raise ValueError(f"watch event without an object: {str(event)[:200]}")
                if etype == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise Gone(str(obj.get("message", "")))
                    raise ApiCallError(int(code or 500), f"WATCH {kind}: {obj.get('message')}")
                rv = _resource_version(obj)
                if etype == "BOOKMARK":
                    if rv:
                        self._rv[kind] = rv
                    continue
                if etype not in ("ADDED", "MODIFIED", "DELETED"):
                    raise ValueError(f"unknown watch event type {etype!r}")
                if rv:
                    self._rv[kind] = rv
                change = ObjectChange(kind, etype, obj)
                try:  # without send()'s checkpoint: a loop iteration per change cost more than the change
                    send.send_nowait(change)
                except anyio.WouldBlock:  # the buffer is full: wait for room
                    await send.send(change)
            ended = True
        finally:
            if not ended:
                _abort(resp)
            resp.release()

    async def _run_kind(self, kind: str, send: MemoryObjectSendStream[Change]) -> None:
        if kind not in self._rv:
            await self._relist(kind, send)
        backoff = Backoff(cap_s=self.backoff_cap_s)
        while True:
            try:
                started = time.monotonic()
                await self._watch_once(kind, send)
                if time.monotonic() - started >= 1.0:
                    backoff.reset()  # the server closed a healthy watch (its timeout): resume
                else:  # closed at once (a proxy?): do not spin
                    await anyio.sleep(backoff.next_delay())
                continue
            except Gone as exc:
                log.info("watch %s: resourceVersion %s gone (%s); relisting %s",
                         kind, self._rv.get(kind), exc, kind)
                self.watch_errors[kind] += 1
                await self._relist(kind, send)
                continue
            except Exception as exc:  # noqa: BLE001 - a watch task must never die (see below)
                # Expected: aiohttp.ClientError (connection cut, apiserver restart), TimeoutError,
                # ApiCallError, a malformed line. Anything else is logged with its traceback and
                # retried too: an exception escaping this task would cancel the consumer's task
                # from inside the changes() generator.
                self.watch_errors[kind] += 1
                delay = backoff.next_delay()
                expected = isinstance(exc, (aiohttp.ClientError, TimeoutError, ApiCallError,
                                            ValueError))
                absent = isinstance(exc, ApiCallError) and exc.status == 404 and kind in OPTIONAL_KINDS
                log.log(logging.DEBUG if absent else logging.WARNING if expected else logging.ERROR,
                        "watch %s ended (%s: %s); resuming from %s in %.2fs", kind,
                        type(exc).__name__, exc, self._rv.get(kind), delay,
                        exc_info=not expected)
                await anyio.sleep(delay)

    async def _relist(self, kind: str, send: MemoryObjectSendStream[Change]) -> None:
        objects = await self._list_retrying(kind)
        self.relists[kind] += 1
        await send.send(Relist(kind, tuple(objects)))

    async def changes(self) -> AsyncIterator[Sequence[Change]]:
        send, receive = anyio.create_memory_object_stream[Change](max_buffer_size=10_000)
        async with anyio.create_task_group() as tg:
            for kind in self.kinds:
                tg.start_soon(self._run_kind, kind, send)
            try:
                async with receive:
                    while True:
                        batch = [await receive.receive()]
                        _drain(receive, batch, self.batch_max)
                        if len(batch) < self.batch_max and self.coalesce_s > 0:
                            # a sleep, not a receive under a timeout: a receive cancelled just
                            # as an item reached it would lose the item
                            await anyio.sleep(self.coalesce_s)
                            _drain(receive, batch, self.batch_max)
                        yield batch
            finally:
                tg.cancel_scope.cancel()
                send.close()


def _drain(receive: MemoryObjectReceiveStream[Change], batch: list[Change], limit: int) -> None:
    """Add what `receive` holds now to `batch`, up to `limit` items in all."""
    while len(batch) < limit:
        try:
            batch.append(receive.receive_nowait())
        except anyio.WouldBlock:
            return


def _abort(resp: Any) -> None:
    """Drop a watch connection the server is still streaming on (we were cancelled, or failed
    mid-stream) at once. A plain release would start a TLS shutdown that nothing waits for,
    leaving the socket open after the client closes (aiohttp waits only for pooled and acquired
    connections)."""
    conn = getattr(resp, "connection", None)
    transport = getattr(conn, "transport", None) if conn is not None else None
    if transport is not None:
        transport.abort()


async def _json_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The watch events of a newline-delimited stream (`api_json.watch_event`), whatever the
    chunking (no line-length limit, unlike StreamReader.readline)."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        if b"\n" not in chunk:
            continue
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield api_json.watch_event(line)
    if buf.strip():
        yield api_json.watch_event(buf)


def objects_of(changes: Iterable[Change]) -> list[ObjectChange]:
    """Flatten a batch into ObjectChanges (a Relist's objects as ADDED), for callers that only
    want the objects."""
    out: list[ObjectChange] = []
    for c in changes:
        if isinstance(c, Relist):
            out += [ObjectChange(c.kind, "ADDED", o) for o in c.objects]
        else:
            out.append(c)
    return out
