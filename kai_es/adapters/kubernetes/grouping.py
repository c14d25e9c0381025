"""A ClusterSource wrapper that gives every pod a PodGroup, as KAI's podgrouper does. Wraps
`KubernetesSource` (or any source of raw Kubernetes JSON).

Contract:
- A kai-scheduler pod without `pod-group-name` (and not opted out, see
  kai_es/ingest/podgrouper.py) gets its PodGroup from its owner chain: the wrapper GETs every
  owner whose kind the podgrouper's table knows (`podgrouper.fetched_kinds`: Kubernetes' own
  workloads, Kubeflow's, JobSet, LeaderWorkerSet, KubeRay's, Knative's, Argo's, Spark's, … and the
  config's no-code rules' kinds) and the objects a rule reads besides the chain
  (`podgrouper.related_refs`: a RayJob's RayCluster); cached — owners by uid, the others by name
  — at most `max_owners`, read again when a pod is ADDED and the copy is older than
  `owner_ttl_s`, so a new pod sees its owner as it is now, yet a Job creating 4,000 pods at once
  is read about once per `owner_ttl_s`. It emits the PodGroup (as a `PodGroup` ObjectChange)
  BEFORE the pod, which carries `pod-group-name` (and `kai.scheduler/subgroup-name`) — so the log
  never shows a gang member in a group of one. The PodGroup is emitted again only when it
  changes; when its last pod is deleted it is emitted as DELETED. Unlike KAI, the PodGroup is not
  written to the API: it lives in kai-es's log.
- An owner kind the apiserver does not serve (its CRD is not installed) ends the chain at its
  bare reference, without an error (logged once per kind); an owner the identity may not read
  (403) ends the chain at the last owner read, as KAI's podgrouper does.
- A `Relist` of PodGroups also lists the groups made here (a real PodGroup of the same name
  wins); a `Relist` of Pods re-groups every pod, and groups left without pods are DELETED.
- A pod naming a Workload API PodGroup (`spec.schedulingGroup.podGroupName`; Kubernetes 1.36,
  `scheduling.k8s.io/v1alpha2`) joins its gang (kai_es/ingest/groupers/workload_api.py). The
  PodGroups come from `inner`'s `WorkloadPodGroup` list and watch when it has that kind (they are
  not passed on), else each is read with a GET. A pod whose PodGroup does not exist yet is
  rejected with that reason and grouped as soon as the PodGroup appears (passed on again as
  MODIFIED), never scheduled as a group of its own.
- A pod's grouping is kept with everything the podgrouper read for it (`group_cache.py`): a
  change of the pod that leaves all of it as it was (its status, its binding when it has no
  owners) reuses the PodGroup instead of grouping it again; an owner read afresh with a new
  resourceVersion, a new label, a changed live-pod index regroup it. `cache_groups=False`
  groups every change (the same changes come out either way, `tests/test_group_cache.py`).
- An owner that cannot be read (after `owner_attempts` tries; a 404 for the object itself) or
  a malformed owner marks the pod with `kai-es.io/grouping-error`: the informer rejects it with
  that message (an ObjectRejected in the log), it is not scheduled in a wrong group. A later
  change of the pod (or a relist) tries again.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes import group_cache as gc
from kai_es.adapters.kubernetes.group_cache import GroupCache
from kai_es.adapters.kubernetes.http import read_response as _read
from kai_es.adapters.kubernetes.source import WORKLOAD_PODGROUP
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.ingest.groupers import INDEXED_LABELS
from kai_es.ingest.groupers import workload_api as wa
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.ingest.translate import GROUPING_ERROR_ANNOTATION, IngestError
from kai_es.ports import ObjectChange, Relist

log = logging.getLogger(__name__)

Change = ObjectChange | Relist

#: GET of one object: (apiVersion, kind, namespace, name) -> (HTTP status, JSON body)
Reader = Callable[[str, str, str, str], Awaitable[tuple[int, dict[str, Any]]]]
#: an owner chain longer than this is malformed (KAI follows owners without a bound)
MAX_OWNER_DEPTH = 8


class OwnerUnavailable(Exception):
    """An owner could not be read."""


class _NotFound(OwnerUnavailable):
    """The object does not exist (404)."""


class _Unserved(Exception):
    """The apiserver serves no such kind (its CRD is not installed)."""


class _Forbidden(Exception):
    """The identity may not read the kind."""


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata")
    if type(meta) is not dict and not isinstance(meta, Mapping):  # (a dict nearly always: fast)
        meta = {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def api_reader(api: client.ApiClient, rules: Mapping[tuple[str, str], pg.GroupingRule]) -> Reader:
    """A Reader over the apiserver: core Pods by CoreV1Api, every other kind by its REST path."""

    async def read(api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        group, _, version = api_version.rpartition("/")
        if not group:
            resp = await client.CoreV1Api(api).read_namespaced_pod(name, namespace, _preload_content=False,
                                                                   _request_timeout=30)
        else:
            resp = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                group, version, namespace, pg.plural_of(group, kind, rules), name,
                _preload_content=False, _request_timeout=30)
        return await _read(resp)

    return read


class _Pods:
    """The live pods by the labels `INDEXED_LABELS` names (a PodIndex for the podgrouper)."""

    def __init__(self, version: int = 0) -> None:
        self._by_label: dict[tuple[str, str, str], set[str]] = {}
        self._of: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        #: changes whenever what `has_pod` answers may have changed
        self.version = version

    def update(self, pod: Mapping[str, Any], gone: bool = False, key: tuple[str, str] | None = None) -> None:
        """Index `pod` as it is now (`key`: its `_key`, when the caller has it)."""
        key = _key(pod) if key is None else key
        old = self._of.pop(key, None)
        for entry in old or ():
            names = self._by_label.get(entry)
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._by_label[entry]
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
        assert isinstance(labels, Mapping)
        entries = [] if gone or meta.get("deletionTimestamp") is not None else \
            [(key[0], k, str(v)) for k, v in labels.items() if k in INDEXED_LABELS]
        for entry in entries:
            self._by_label.setdefault(entry, set()).add(key[1])
        if entries:
            self._of[key] = entries
        if (old or []) != entries:
            self.version += 1

    def has_pod(self, namespace: str, labels: Mapping[str, str]) -> bool:
        sets = [self._by_label.get((namespace, k, v), set()) for k, v in labels.items()]
        return bool(sets) and bool(set.intersection(*sets))


class PodGroupingSource:
    """ClusterSource over `inner` that groups pods (contract: module docstring). `rules`: the
    config's no-code grouping rules; `reader`: how objects are read (default: the apiserver)."""

    def __init__(self, inner: Any, api: client.ApiClient | None, *, owner_attempts: int = 3,
                 owner_ttl_s: float = 5.0, max_owners: int = 10_000,
                 retry_delay_s: float = 0.2, rules: Sequence[pg.GroupingRule] = (),
                 reader: Reader | None = None, ours: str = SCHEDULER_NAME, cache_groups: bool = True) -> None:
        self.inner = inner
        #: the scheduler name kai-es answers to: only its pods are grouped
        self.ours = ours
        self.api = api
        self.owner_attempts = owner_attempts
        self.retry_delay_s = retry_delay_s
        self.owner_ttl_s = owner_ttl_s
        self.max_owners = max_owners
        self.rules = pg.rules_by_kind(rules)
        self._fetched = pg.fetched_kinds(self.rules)
        self.reader = reader if reader is not None else api_reader(api, self.rules) if api is not None else None
        self._owners: dict[str, tuple[float, dict[str, Any]]] = {}  # uid (or kind/ns/name) -> (read at, object)
        self._groups: dict[tuple[str, str], dict[str, Any]] = {}  # made here, last emitted
        self._members: dict[tuple[str, str], set[str]] = {}  # group -> pod names
        self._pod_group: dict[tuple[str, str], tuple[str, str]] = {}  # pod -> group
        self._real_groups: set[tuple[str, str]] = set()
        self._noted: set[str] = set()  # uids of bound pods whose device facts were checked
        self._unserved: set[tuple[str, str]] = set()  # kinds said to be unserved (logged once)
        self._pods = _Pods()
        #: the podgrouper's last answer per pod and its inputs (None: every change regrouped)
        self.group_cache: GroupCache | None = GroupCache() if cache_groups else None
        #: the Workload API's PodGroups by (namespace, name), when `inner` watches them
        #: (WORKLOAD_PODGROUP); else each is read with a GET, like an owner
        self._watch_k8s_groups = WORKLOAD_PODGROUP in tuple(getattr(inner, "kinds", ()))
        self._k8s_groups: dict[tuple[str, str], dict[str, Any]] = {}
        #: pods waiting for the Workload API PodGroup they name: pod -> (its group's key, the pod)
        self._waiting: dict[tuple[str, str], tuple[tuple[str, str], dict[str, Any]]] = {}
        #: owner reads (GETs, retries included) by the owner's namespace: the cache's effect
        self.owner_fetches: collections.Counter[str] = collections.Counter()

    # -- owners ----------------------------------------------------------------------------------

    async def _get(self, cache_key: str, api_version: str, kind: str, namespace: str, name: str,
                   uid: str, fresh: bool) -> dict[str, Any]:
        cached = self._owners.get(cache_key)
        if cached is not None and (not fresh or time.monotonic() - cached[0] < self.owner_ttl_s):
            return cached[1]
        if self.reader is None:
            raise OwnerUnavailable(f"cannot read {kind} {namespace}/{name}: no API client")
        last = ""
        for attempt in range(self.owner_attempts):
            self.owner_fetches[namespace] += 1
            try:
                status, doc = await self.reader(api_version, kind, namespace, name)
            except Exception as exc:  # noqa: BLE001 - connection errors: retried, then reported
                status, doc = 0, {"message": f"{type(exc).__name__}: {exc}"}
            if status == 200:
                got = (doc.get("metadata") or {}).get("uid")
                if uid and got != uid:
                    raise OwnerUnavailable(f"{kind} {namespace}/{name} was re-created (uid {got}, pod names {uid})")
                doc.setdefault("apiVersion", api_version)
                doc.setdefault("kind", kind)
                self._owners.pop(cache_key, None)
                self._owners[cache_key] = (time.monotonic(), doc)
                if len(self._owners) > self.max_owners:  # the oldest read goes first
                    del self._owners[next(iter(self._owners))]
                return doc
            if status == 404 and (doc.get("details") or {}).get("name") != name:
                raise _Unserved(f"{api_version} {kind}: {doc.get('message', '')}"[:300])
            if status == 403:
                raise _Forbidden(f"{kind} {namespace}/{name}: {doc.get('message', '')}"[:300])
            last = f"HTTP {status}: {doc.get('message', '')}" if status else str(doc.get("message"))
            if status == 404:
                raise _NotFound(f"cannot read {kind} {namespace}/{name}: {last}")
            if attempt + 1 == self.owner_attempts:
                break
            await anyio.sleep(self.retry_delay_s * 2 ** attempt)
        raise OwnerUnavailable(f"cannot read {kind} {namespace}/{name}: {last}")

    async def _owner_chain(self, pod: Mapping[str, Any], fresh: bool) -> list[dict[str, Any]]:
        namespace = _key(pod)[0]
        chain: list[dict[str, Any]] = []
        ref = pg.first_owner(pod)
        while ref is not None:
            if len(chain) >= MAX_OWNER_DEPTH:
                raise IngestError("metadata.ownerReferences", f"owner chain deeper than {MAX_OWNER_DEPTH}")
            kind = (pg.api_group(ref["apiVersion"]), ref["kind"])
            if kind not in self._fetched or kind in self._unserved:
                chain.append(pg.ref_object(ref, namespace))
                break
            try:
                owner = await self._get(ref.get("uid") or f"{ref['kind']}/{namespace}/{ref['name']}",
                                        ref["apiVersion"], ref["kind"], namespace, ref["name"],
                                        ref.get("uid", ""), fresh)
            except _Unserved as exc:
                self._unserved.add(kind)
                log.warning("%s: not served by the apiserver (its CRD is not installed?): its pods are "
                            "grouped by the owner reference alone", exc)
                chain.append(pg.ref_object(ref, namespace))
                break
            except _Forbidden as exc:
                log.warning("may not read %s: the chain ends at the owner below it, as KAI's podgrouper does", exc)
                break
            chain.append(owner)
            ref = pg.first_owner(owner, is_pod=False)
        return chain

    async def _related(self, chain: Sequence[Mapping[str, Any]], namespace: str,
                       fresh: bool) -> dict[tuple[str, str], dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for api_version, kind, name in pg.related_refs(chain):
            try:
                out[(kind, name)] = await self._get(f"{api_version}/{kind}/{namespace}/{name}", api_version,
                                                    kind, namespace, name, "", fresh)
            except (_Unserved, _Forbidden) as exc:
                raise OwnerUnavailable(str(exc)) from None
        return out

    async def _k8s_group(self, namespace: str, name: str, fresh: bool) -> dict[str, Any] | None:
        """The Workload API PodGroup `namespace/name`, None while it does not exist: from the
        watched copies, else read (a 404, or an apiserver that does not serve the API: None)."""
        if self._watch_k8s_groups:
            return self._k8s_groups.get((namespace, name))
        try:
            return await self._get(f"{wa.RELATED_KIND}/{namespace}/{name}", wa.API_VERSION, wa.KIND, namespace,
                                   name, "", fresh)
        except (_Unserved, _NotFound):
            return None

    async def _k8s_group_changed(self, change: Change, out: list[Change]) -> None:
        """Keep the Workload API's PodGroups; a pod waiting for one that now exists is grouped
        (and passed on again, as MODIFIED). The PodGroups themselves are not passed on."""
        if isinstance(change, Relist):
            self._k8s_groups = {_key(o): dict(o) for o in change.objects}
        elif change.action == "DELETED":
            self._k8s_groups.pop(_key(change.obj), None)
        else:
            self._k8s_groups[_key(change.obj)] = dict(change.obj)
        for pod_key, (group, pod) in sorted(self._waiting.items()):
            if group in self._k8s_groups:
                await self._shape_pod(ObjectChange("Pod", "MODIFIED", pod), out)

    # -- shaping ---------------------------------------------------------------------------------

    async def _group(self, pod: dict[str, Any], fresh: bool) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(the pod's PodGroup or None, the pod to pass on)."""
        if not pg.needs_group(pod, ours=self.ours):
            return None, pod
        key = _key(pod)
        self._waiting.pop(key, None)
        try:
            chain = await self._owner_chain(pod, fresh)
            related = await self._related(chain, key[0], fresh)
            wanted = wa.wanted(pod, chain)
            if wanted is not None:
                k8s_group = await self._k8s_group(key[0], wanted, fresh)
                if k8s_group is None:
                    self._waiting[key] = ((key[0], wanted), pod)
                else:
                    related[(wa.RELATED_KIND, wanted)] = k8s_group
            cache = self.group_cache
            inputs = gc.inputs(pod, chain, related, self._pods.version) if cache is not None else None
            if cache is not None and inputs is not None:
                answer = cache.get(key, inputs)
                if answer is not gc.MISS:
                    if answer.podgroup is None:
                        return None, pod
                    return answer.podgroup, pg.annotate(pod, answer.podgroup["metadata"]["name"], answer.subgroup)
            grouping = pg.group_pod(pod, chain, related=related, pods=self._pods, rules=self.rules, ours=self.ours)
            if cache is not None and inputs is not None:
                cache.put(key, inputs, gc.Answer(grouping.podgroup, grouping.subgroup) if grouping is not None
                          else gc.Answer(None))
        except (IngestError, OwnerUnavailable) as exc:
            ns, name = key
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
            self._pods.update(obj, gone=True, key=key)
            self._waiting.pop(key, None)
            self._leave(key, out)
            if self.group_cache is not None:
                self.group_cache.drop(key)
            self._noted.discard(str((obj.get("metadata") or {}).get("uid", "")))
            return
        self._note_devices(obj)
        self._pods.update(obj, key=key)
        group_obj, pod = await self._group(obj, fresh=change.action == "ADDED")
        self._join(key, group_obj, out)
        out.append(ObjectChange("Pod", change.action, pod))

    def _note_devices(self, obj: Mapping[str, Any]) -> None:
        """Say (once per pod) when a bound pod's GPU devices are not facts (see
        kai_es.ingest.translate.unknown_devices for how it is then accounted)."""
        spec = obj.get("spec")
        if type(spec) is not dict and not isinstance(spec, Mapping):
            return  # not bound (nor a pod the translation accepts)
        if not spec.get("nodeName"):
            return
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        uid = str(meta.get("uid", ""))
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
        assert isinstance(annotations, Mapping)
        if uid in self._noted or tr.GPU_DEVICES_ANNOTATION in annotations:
            return
        if spec.get("schedulerName") == self.ours and not (
                "gpu-fraction" in annotations or "gpu-memory" in annotations):
            return  # kai-es's own whole-GPU pods: the count is the fact
        self._noted.add(uid)
        try:  # the request as the pod states it (translate would count another's share as whole)
            raw = tr.pod({**obj, "spec": {**spec, "nodeName": ""}}, ours=self.ours)
        except IngestError:
            return  # the informer rejects it, with the reason
        note = tr.unknown_devices(raw.scheduler_name, str(spec["nodeName"]), raw.gpu, raw.gpu_group, raw.gpu_devices,
                                  ours=self.ours)
        if note:
            log.info("pod %s/%s on %s: %s", raw.namespace, raw.name, spec["nodeName"], note)

    async def _shape(self, batch: Sequence[Change]) -> list[Change]:
        out: list[Change] = []
        for change in batch:
            if change.kind == WORKLOAD_PODGROUP:
                await self._k8s_group_changed(change, out)
            elif isinstance(change, Relist):
                if change.kind == "Pod":
                    pods: list[dict[str, object]] = []
                    seen: set[tuple[str, str]] = set()
                    self._pods = _Pods(self._pods.version + 1)
                    for obj in change.objects:
                        self._pods.update(obj)
                    for obj in change.objects:
                        group_obj, pod = await self._group(dict(obj), fresh=True)
                        self._join(_key(obj), group_obj, out)
                        seen.add(_key(obj))
                        pods.append(pod)
                    for gone in sorted(set(self._pod_group) - seen):
                        self._leave(gone, out)
                    if self.group_cache is not None:
                        self.group_cache.keep_only(seen)
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
        for c in objects:  # every pod is known before any is grouped (an MPIJob's launcher)
            if c.kind == "Pod":
                self._pods.update(c.obj)
        # and every Workload API PodGroup (never passed on)
        self._k8s_groups = {_key(c.obj): dict(c.obj) for c in objects if c.kind == WORKLOAD_PODGROUP}
        shaped = await self._shape([c for c in objects if c.kind != WORKLOAD_PODGROUP])
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
