"""A ClusterSource wrapper that gives every pod a PodGroup, as KAI's podgrouper does. Wraps
`KubernetesSource` (or any source of raw Kubernetes JSON).

Contract:
- A kai-scheduler pod without `pod-group-name` (and not opted out, see
  kai_es/ingest/podgrouper.py) gets its PodGroup from its owner chain: the wrapper GETs the
  owners KAI's groupers read (ReplicaSet, Deployment, StatefulSet, Job, CronJob, PyTorchJob;
  cached by uid — at most `max_owners`, read again when a pod is ADDED and the copy is older than
  `owner_ttl_s`, so a new pod sees its owner as it is now, yet a Job creating 4,000 pods at once
  is read about once per `owner_ttl_s`) and emits the PodGroup (as a `PodGroup` ObjectChange)
  BEFORE the pod, which carries
  `pod-group-name` — so the log never shows a gang member in a group of one. The PodGroup is
  emitted again only when it changes; when its last pod is deleted it is emitted as DELETED.
  Unlike KAI, the PodGroup is not written to the API: it lives in kai-es's log.
- A `Relist` of PodGroups also lists the groups made here (a real PodGroup of the same name
  wins); a `Relist` of Pods re-groups every pod, and groups left without pods are DELETED.
- An owner that cannot be read (after `owner_attempts` tries) or a malformed owner marks the
  pod with `kai-es.io/grouping-error`: the informer rejects it with that message (an
  ObjectRejected in the log), it is not scheduled in a wrong group. A later change of the pod
  (or a relist) tries again.
"""

from __future__ import annotations

import collections

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.http import read_response as _read
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.translate import GROUPING_ERROR_ANNOTATION, IngestError
from kai_es.ports import ObjectChange, Relist

log = logging.getLogger(__name__)

Change = ObjectChange | Relist

#: kind -> GET of one owner by (api, namespace, name), raw response (`_preload_content=False`)
_READERS: dict[str, Callable[[client.ApiClient, str, str], Awaitable[Any]]] = {
    "ReplicaSet": lambda api, ns, name: client.AppsV1Api(api).read_namespaced_replica_set(
        name, ns, _preload_content=False, _request_timeout=30),
    "Deployment": lambda api, ns, name: client.AppsV1Api(api).read_namespaced_deployment(
        name, ns, _preload_content=False, _request_timeout=30),
    "StatefulSet": lambda api, ns, name: client.AppsV1Api(api).read_namespaced_stateful_set(
        name, ns, _preload_content=False, _request_timeout=30),
    "Job": lambda api, ns, name: client.BatchV1Api(api).read_namespaced_job(
        name, ns, _preload_content=False, _request_timeout=30),
    "CronJob": lambda api, ns, name: client.BatchV1Api(api).read_namespaced_cron_job(
        name, ns, _preload_content=False, _request_timeout=30),
    "PyTorchJob": lambda api, ns, name: client.CustomObjectsApi(api).get_namespaced_custom_object(
        "kubeflow.org", "v1", ns, "pytorchjobs", name, _preload_content=False, _request_timeout=30),
}
#: an owner chain longer than this is malformed (KAI follows owners without a bound)
MAX_OWNER_DEPTH = 8


class OwnerUnavailable(Exception):
    """An owner could not be read."""


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


class PodGroupingSource:
    """ClusterSource over `inner` that groups pods (contract: module docstring)."""

    def __init__(self, inner: Any, api: client.ApiClient, *, owner_attempts: int = 3,
                 owner_ttl_s: float = 5.0, max_owners: int = 10_000,
                 retry_delay_s: float = 0.2) -> None:
        self.inner = inner
        self.api = api
        self.owner_attempts = owner_attempts
        self.retry_delay_s = retry_delay_s
        self.owner_ttl_s = owner_ttl_s
        self.max_owners = max_owners
        self._owners: dict[str, tuple[float, dict[str, Any]]] = {}  # uid -> (read at, owner)
        self._groups: dict[tuple[str, str], dict[str, Any]] = {}  # made here, last emitted
        self._members: dict[tuple[str, str], set[str]] = {}  # group -> pod names
        self._pod_group: dict[tuple[str, str], tuple[str, str]] = {}  # pod -> group
        self._real_groups: set[tuple[str, str]] = set()
        self._noted: set[str] = set()  # uids of bound pods whose device facts were checked
        #: owner reads (GETs, retries included) by the owner's namespace: the cache's effect
        self.owner_fetches: collections.Counter[str] = collections.Counter()

    # -- owners ----------------------------------------------------------------------------------

    async def _get_owner(self, ref: Mapping[str, str], namespace: str, fresh: bool) -> dict[str, Any]:
        uid = ref.get("uid", "")
        cached = self._owners.get(uid) if uid else None
        if cached is not None and (not fresh or time.monotonic() - cached[0] < self.owner_ttl_s):
            return cached[1]
        version = ref.get("apiVersion", "")
        reader = _READERS[ref["kind"]]
        last = ""
        for attempt in range(self.owner_attempts):
            self.owner_fetches[namespace] += 1
            try:
                status, doc = await _read(await reader(self.api, namespace, ref["name"]))
            except Exception as exc:  # noqa: BLE001 - connection errors: retried, then reported
                status, doc = 0, {"message": f"{type(exc).__name__}: {exc}"}
            if status == 200:
                if uid and (doc.get("metadata") or {}).get("uid") != uid:
                    raise OwnerUnavailable(f"{ref['kind']} {namespace}/{ref['name']} was re-created "
                                           f"(uid {(doc.get('metadata') or {}).get('uid')}, pod names {uid})")
                doc.setdefault("apiVersion", version)
                doc.setdefault("kind", ref["kind"])
                if uid:
                    self._owners.pop(uid, None)
                    self._owners[uid] = (time.monotonic(), doc)
                    if len(self._owners) > self.max_owners:  # the oldest read goes first
                        del self._owners[next(iter(self._owners))]
                return doc
            last = f"HTTP {status}: {doc.get('message', '')}" if status else str(doc.get("message"))
            if status in (403, 404) or attempt + 1 == self.owner_attempts:
                break
            await anyio.sleep(self.retry_delay_s * 2 ** attempt)
        raise OwnerUnavailable(f"cannot read {ref['kind']} {namespace}/{ref['name']}: {last}")

    async def _owner_chain(self, pod: Mapping[str, Any], fresh: bool) -> list[dict[str, Any]]:
        namespace = _key(pod)[0]
        chain: list[dict[str, Any]] = []
        ref = pg.first_owner(pod)
        while ref is not None:
            if len(chain) >= MAX_OWNER_DEPTH:
                raise IngestError("metadata.ownerReferences", f"owner chain deeper than {MAX_OWNER_DEPTH}")
            if not pg.is_fetched(ref):
                chain.append(pg.ref_object(ref, namespace))
                break
            owner = await self._get_owner(ref, namespace, fresh)
            chain.append(owner)
            ref = pg.first_owner(owner)
        return chain

    # -- shaping ---------------------------------------------------------------------------------

    async def _group(self, pod: dict[str, Any], fresh: bool) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(the pod's PodGroup or None, the pod to pass on)."""
        if not pg.needs_group(pod):
            return None, pod
        try:
            grouping = pg.group_pod(pod, await self._owner_chain(pod, fresh))
        except (IngestError, OwnerUnavailable) as exc:
            ns, name = _key(pod)
            log.warning("pod %s/%s: no PodGroup (%s); it is rejected until it can be grouped", ns, name, exc)
            meta = dict(pod.get("metadata") or {})
            annotations = meta.get("annotations")
            meta["annotations"] = {**(annotations if isinstance(annotations, Mapping) else {}),
                                   GROUPING_ERROR_ANNOTATION: str(exc)[:500]}
            return None, {**pod, "metadata": meta}
        if grouping is None:
            return None, pod
        return grouping.podgroup, grouping.pod

    def _leave(self, pod_key: tuple[str, str], out: list[Change]) -> None:
        group = self._pod_group.pop(pod_key, None)
        if group is None:
            return
        members = self._members.get(group)
        if members is not None:
            members.discard(pod_key[1])
            if not members:
                del self._members[group]
                obj = self._groups.pop(group, None)
                if obj is not None and group not in self._real_groups:
                    out.append(ObjectChange("PodGroup", "DELETED", obj))

    def _join(self, pod_key: tuple[str, str], group_obj: dict[str, Any] | None, out: list[Change]) -> None:
        group = _key(group_obj) if group_obj is not None else None
        if self._pod_group.get(pod_key) != group:
            self._leave(pod_key, out)
        if group_obj is None or group is None:
            return
        self._pod_group[pod_key] = group
        self._members.setdefault(group, set()).add(pod_key[1])
        if self._groups.get(group) != group_obj and group not in self._real_groups:
            action = "MODIFIED" if group in self._groups else "ADDED"
            self._groups[group] = group_obj
            out.append(ObjectChange("PodGroup", action, group_obj))  # type: ignore[arg-type]

    async def _shape_pod(self, change: ObjectChange, out: list[Change]) -> None:
        obj: dict[str, Any] = dict(change.obj)
        key = _key(obj)
        if change.action == "DELETED":
            out.append(change)
            self._leave(key, out)
            self._noted.discard(str((obj.get("metadata") or {}).get("uid", "")))
            return
        self._note_devices(obj)
        group_obj, pod = await self._group(obj, fresh=change.action == "ADDED")
        self._join(key, group_obj, out)
        out.append(ObjectChange("Pod", change.action, pod))

    def _note_devices(self, obj: Mapping[str, Any]) -> None:
        """Say (once per pod) when a bound pod's GPU devices are not facts (see
        kai_es.ingest.translate.unknown_devices for how it is then accounted)."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
        uid = str(meta.get("uid", ""))
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
        assert isinstance(annotations, Mapping)
        if not spec.get("nodeName") or uid in self._noted or tr.GPU_DEVICES_ANNOTATION in annotations:
            return
        if spec.get("schedulerName") == SCHEDULER_NAME and not (
                "gpu-fraction" in annotations or "gpu-memory" in annotations):
            return  # kai-es's own whole-GPU pods: the count is the fact
        self._noted.add(uid)
        try:  # the request as the pod states it (translate would count another's share as whole)
            raw = tr.pod({**obj, "spec": {**spec, "nodeName": ""}})
        except IngestError:
            return  # the informer rejects it, with the reason
        note = tr.unknown_devices(raw.scheduler_name, str(spec["nodeName"]), raw.gpu, raw.gpu_group, raw.gpu_devices)
        if note:
            log.info("pod %s/%s on %s: %s", raw.namespace, raw.name, spec["nodeName"], note)

    async def _shape(self, batch: Sequence[Change]) -> list[Change]:
        out: list[Change] = []
        for change in batch:
            if isinstance(change, Relist):
                if change.kind == "Pod":
                    pods: list[dict[str, object]] = []
                    seen: set[tuple[str, str]] = set()
                    for obj in change.objects:
                        group_obj, pod = await self._group(dict(obj), fresh=True)
                        self._join(_key(obj), group_obj, out)
                        seen.add(_key(obj))
                        pods.append(pod)
                    for gone in sorted(set(self._pod_group) - seen):
                        self._leave(gone, out)
                    out.append(Relist("Pod", tuple(pods)))
                elif change.kind == "PodGroup":
                    self._real_groups = {_key(o) for o in change.objects}
                    mine = [o for k, o in sorted(self._groups.items()) if k not in self._real_groups]
                    out.append(Relist("PodGroup", tuple(change.objects) + tuple(mine)))
                else:
                    out.append(change)
            elif change.kind == "Pod":
                await self._shape_pod(change, out)
            else:
                if change.kind == "PodGroup":
                    key = _key(change.obj)
                    if change.action == "DELETED":
                        self._real_groups.discard(key)
                    else:
                        self._real_groups.add(key)
                out.append(change)
        return out

    # -- ClusterSource ---------------------------------------------------------------------------

    async def list_objects(self) -> list[ObjectChange]:
        objects = await self.inner.list_objects()
        self._real_groups = {_key(c.obj) for c in objects if c.kind == "PodGroup"}
        shaped = await self._shape(list(objects))
        return [c for c in shaped if isinstance(c, ObjectChange)]

    async def changes(self) -> AsyncIterator[Sequence[Change]]:
        inner = self.inner.changes()
        try:
            async for batch in inner:
                shaped = await self._shape(batch)
                if shaped:
                    yield shaped
        finally:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()
