"""A simulated Kubernetes cluster: plays the API server, the kubelets and the workload
controllers for the simulator. It implements both ClusterSource and ClusterActuator.

Contract:
- Objects are the scenario's raw Kubernetes JSON; every change is reported as an ObjectChange
  exactly as a watch would report it, so the informer's real translation path is exercised.
- A bind is admitted like a kubelet would: the pod must exist with that uid, the node must exist
  and have room (CPU, memory, pod slots, and the named GPU devices); otherwise it fails with a
  message. A pod already bound to that node is success (`already=True`).
- A bound pod with `kai-es.io/run-for` succeeds that long after it was bound. An evicted pod is
  deleted and, unless `kai-es.io/recreate: "false"`, recreated as a new Pending pod (as its
  controller would) named `<name>-r<k>`. A recreated pod whose PodGroup the podgrouper made is
  grouped again, as the informer groups a new pod: it rejoins its workload's group (a Job's, a
  PyTorchJob's, …), or — where every pod is a group of its own (a bare pod, a Deployment's) —
  gets a new one, `pg-<new name>-<new uid>` created now (with uid `recreated_group_uid`), which
  is reported before the pod. A pod of a Kubernetes PodGroup (`spec.schedulingGroup`) keeps its
  group, which outlives its pods.
- A pod annotated `kai-es.io/refuse-eviction: "true"` refuses every eviction permanently (as a
  failed precondition would); `"retryable"` refuses it as a PodDisruptionBudget does (a 429 that
  may pass later); `"once"` refuses its first eviction only, finally, as a transient error does
  (a 403 while a restarted apiserver's RBAC cache fills), and lets later ones pass. A pod annotated `kai-es.io/refuse-bind: "true"` refuses every bind (as a
  webhook or a kubelet that never admits it would).
- `delete_pod` deletes a pod as a user would (its controller recreates it, as after an
  eviction); `delete_node` deletes a node and, as the pod garbage collector does, the pods bound
  to it (recreated likewise). Both report the deletions as a watch would.
- Time only moves through `advance(now)`; everything is deterministic.
"""

from __future__ import annotations

import copy
import heapq
import re
from collections.abc import AsyncIterator, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from kai_es.events.factory import name_id
from kai_es.events.timefmt import rfc3339
from kai_es.ingest import podgrouper as pg
from kai_es.ingest.groupers import workload_api as wa
from kai_es.ingest import translate as tr
from kai_es.ports import ActionOutcome, ObjectChange
from kai_es.scenario import Scenario, ScenarioObject
from kai_es.state.reducer import device_count, device_milli_on


@dataclass(slots=True)
class _NodeUse:
    cpu: int = 0
    memory: int = 0
    pods: int = 0
    devices: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _PodInfo:
    obj: dict[str, Any]
    run_for_ns: int | None
    recreate: bool
    owners: tuple[dict[str, Any], ...] | None = None  # when the podgrouper grouped it: its chain
    generation: int = 0
    node: str = ""
    devices: tuple[int, ...] = ()
    device_milli: int = 0


REFUSE_EVICTION = "kai-es.io/refuse-eviction"
REFUSE_BIND = "kai-es.io/refuse-bind"


def _annotation(obj: dict[str, Any], name: str) -> str:
    value = (obj.get("metadata") or {}).get("annotations", {}).get(name, "")
    return value if isinstance(value, str) else ""


def recreated_identity(namespace: str, name: str, uid: str, live: Container[str]) -> tuple[str, str]:
    """(name, uid) of the pod a controller recreates after `name` is evicted: `<base>-r<k>` with
    the lowest k whose `namespace/name` is not in `live` (base: the name without a previous
    `-r<k>`), and a uid derived from the evicted pod's."""
    base = re.sub(r"-r\d+$", "", name)
    k = 1
    while f"{namespace}/{base}-r{k}" in live:
        k += 1
    return f"{base}-r{k}", recreated_uid(uid)


def recreated_uid(uid: str) -> str:
    """The uid of the pod recreated after the pod `uid` is evicted: uuid5(NAMESPACE, uid + "/recreated")."""
    return name_id(f"{uid}/recreated")


def recreated_group_uid(pod_uid: str) -> str:
    """The uid of the PodGroup made for the recreated pod `pod_uid` (where each pod has its own)."""
    return name_id(f"{pod_uid}/podgroup")


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


class SimCluster:
    def __init__(self, scenario: Scenario, now_ns: int) -> None:
        self.scenario = scenario
        self.now_ns = now_ns
        self.nodes: dict[str, dict[str, Any]] = {}
        self.node_use: dict[str, _NodeUse] = {}
        self.others: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, _PodInfo] = {}
        self._heap: list[tuple[int, int, str, Any]] = []
        self._seq = 0
        self._changes: list[ObjectChange] = []
        self._wake = anyio.Event()
        self.binds = 0
        self.bind_failures = 0
        self.evictions = 0
        #: uids of the pods annotated to refuse their first eviction that did
        self.refused_once: set[str] = set()
        self.eviction_refusals = 0
        self.completions = 0
        for obj in scenario.objects:
            if obj.submit_after_ns == 0:
                self._create(obj, report=False)
            else:
                self._push(scenario.start_ns + obj.submit_after_ns, "submit", obj)

    # -- time -------------------------------------------------------------------------------

    def _push(self, at: int, what: str, item: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, what, item))

    def next_event_ns(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def advance(self, now_ns: int) -> None:
        """Apply every scheduled happening up to and including `now_ns`."""
        self.now_ns = now_ns
        while self._heap and self._heap[0][0] <= now_ns:
            _, _, what, item = heapq.heappop(self._heap)
            if what == "submit":
                self._create(item, report=True)
            elif what == "complete":
                key, generation = item
                info = self.pods.get(key)
                if info is not None and info.generation == generation and info.node:
                    self._finish(key, info)

    # -- objects ----------------------------------------------------------------------------

    def _report(self, kind: str, action: str, obj: dict[str, Any]) -> None:
        self._changes.append(ObjectChange(kind=kind, action=action, obj=copy.deepcopy(obj)))  # type: ignore[arg-type]
        self._wake.set()

    def _create(self, so: ScenarioObject, report: bool) -> None:
        obj = copy.deepcopy(so.obj)
        if report:
            obj["metadata"]["creationTimestamp"] = rfc3339(self.now_ns)
        kind = so.kind
        if kind == "Node":
            name = obj["metadata"]["name"]
            self.nodes[name] = obj
            gpus = getattr(so.payload, "gpus", 0)
            self.node_use[name] = _NodeUse(devices=[0] * gpus)
        elif kind == "Pod":
            key = _key(obj)
            info = _PodInfo(obj=obj, run_for_ns=so.run_for_ns, recreate=so.recreate,
                            owners=so.owners if so.grouped else None)
            self.pods[key] = info
            node = (obj.get("spec") or {}).get("nodeName")
            if node and (obj.get("status") or {}).get("phase") == "Running":
                payload = tr.pod(obj, ours=self.scenario.config.scheduler_name)
                devices = tuple(payload.gpu_devices) or self._first_fit(node, payload)
                self._take(key, info, node, devices, payload)
        else:
            meta = obj["metadata"]
            self.others[(kind, f"{meta.get('namespace', '')}/{meta['name']}")] = obj
        if report:
            self._report(kind, "ADDED", obj)

    def _first_fit(self, node: str, payload: Any) -> tuple[int, ...]:
        use = self.node_use.get(node)
        if use is None:
            return ()
        milli = device_milli_on(tr.node(self.nodes[node]), payload.gpu)
        count = device_count(payload.gpu)
        free = [i for i, u in enumerate(use.devices) if u + milli <= 1000]
        return tuple(free[:count])

    def _take(self, key: str, info: _PodInfo, node: str, devices: tuple[int, ...], payload: Any) -> None:
        use = self.node_use[node]
        milli = device_milli_on(tr.node(self.nodes[node]), payload.gpu) if devices else 0
        use.cpu += payload.requests.milli_cpu
        use.memory += payload.requests.memory_bytes
        use.pods += 1
        for d in devices:
            use.devices[d] += milli
        info.node, info.devices, info.device_milli = node, devices, milli
        info.generation += 1
        if info.run_for_ns is not None:
            self._push(self.now_ns + info.run_for_ns, "complete", (key, info.generation))

    def _free(self, info: _PodInfo) -> None:
        if not info.node:
            return
        use = self.node_use.get(info.node)
        if use is not None:
            payload = tr.pod(info.obj, ours=self.scenario.config.scheduler_name)
            use.cpu -= payload.requests.milli_cpu
            use.memory -= payload.requests.memory_bytes
            use.pods -= 1
            for d in info.devices:
                use.devices[d] -= info.device_milli
        info.node, info.devices, info.device_milli = "", (), 0

    def _finish(self, key: str, info: _PodInfo) -> None:
        self._free(info)
        info.obj.setdefault("status", {})["phase"] = "Succeeded"
        self.completions += 1
        self._report("Pod", "MODIFIED", info.obj)
        del self.pods[key]

    # -- ClusterSource --------------------------------------------------------------------------

    async def list_objects(self) -> list[ObjectChange]:
        out = [ObjectChange("Node", "ADDED", copy.deepcopy(o)) for o in self.nodes.values()]
        out += [ObjectChange(kind, "ADDED", copy.deepcopy(o)) for (kind, _), o in self.others.items()]
        out += [ObjectChange("Pod", "ADDED", copy.deepcopy(i.obj)) for i in self.pods.values()]
        self._changes.clear()
        return out

    def objects_of(self, kind: str) -> tuple[dict[str, Any], ...]:
        """Every object of `kind` that exists now (copies, with `kind` set), as a relist returns
        them; pending changes stay pending."""
        if kind == "Node":
            objs = list(self.nodes.values())
        elif kind == "Pod":
            objs = [i.obj for i in self.pods.values()]
        else:
            objs = [o for (k, _), o in self.others.items() if k == kind]
        out = []
        for obj in objs:
            item = copy.deepcopy(obj)
            item.setdefault("kind", kind)
            out.append(item)
        return tuple(out)

    def delete_pod(self, key: str) -> bool:
        """Delete pod `namespace/name` (see the module contract); False when there is none."""
        info = self.pods.pop(key, None)
        if info is None:
            return False
        self._free(info)
        self._report("Pod", "DELETED", info.obj)
        if info.recreate:
            self._recreate(info)
        return True

    def delete_node(self, name: str) -> bool:
        """Delete node `name` and the pods bound to it (see the module contract)."""
        node = self.nodes.pop(name, None)
        if node is None:
            return False
        self._report("Node", "DELETED", node)
        for key in [k for k, i in self.pods.items() if i.node == name]:
            self.delete_pod(key)
        del self.node_use[name]
        return True

    def drain_changes(self) -> list[ObjectChange]:
        out, self._changes = self._changes, []
        return out

    async def changes(self) -> AsyncIterator[list[ObjectChange]]:
        while True:
            if not self._changes:
                self._wake = anyio.Event()
                await self._wake.wait()
            yield self.drain_changes()

    # -- ClusterActuator ------------------------------------------------------------------------

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Sequence[int], gpu_groups: Sequence[str]) -> ActionOutcome:
        key = f"{namespace}/{name}"
        info = self.pods.get(key)
        if info is None or info.obj["metadata"].get("uid") != uid:
            return self._fail(f"pod {key} (uid {uid}) does not exist")
        if info.node:
            if info.node == node:
                return ActionOutcome(ok=True, already=True, message="already bound to this node")
            return self._fail(f"pod {key} is already bound to {info.node}")
        if node not in self.nodes:
            return self._fail(f"node {node} does not exist")
        if _annotation(info.obj, REFUSE_BIND) == "true":
            return self._fail(f"pod {key} refuses every bind ({REFUSE_BIND})")
        payload = tr.pod(info.obj, ours=self.scenario.config.scheduler_name)
        use = self.node_use[node]
        node_payload = tr.node(self.nodes[node])
        milli = device_milli_on(node_payload, payload.gpu)
        devices = tuple(gpu_devices)
        problems = []
        if use.cpu + payload.requests.milli_cpu > node_payload.milli_cpu:
            problems.append("cpu")
        if use.memory + payload.requests.memory_bytes > node_payload.memory_bytes:
            problems.append("memory")
        if use.pods + 1 > node_payload.max_pods:
            problems.append("pods")
        if len(devices) != device_count(payload.gpu) or any(
                not 0 <= d < len(use.devices) or use.devices[d] + milli > 1000 for d in devices):
            problems.append("gpu devices")
        if problems:
            return self._fail(f"node {node} cannot admit pod {key}: insufficient {', '.join(problems)}")
        info.obj.setdefault("spec", {})["nodeName"] = node
        info.obj.setdefault("status", {})["phase"] = "Running"
        meta = info.obj["metadata"]
        if devices:
            meta.setdefault("annotations", {})["kai-es.io/gpu-devices"] = ",".join(map(str, devices))
        if gpu_groups:
            meta.setdefault("labels", {})[tr.GPU_GROUP_LABEL] = gpu_groups[0]
        self._take(key, info, node, devices, payload)
        self.binds += 1
        self._report("Pod", "MODIFIED", info.obj)
        return ActionOutcome(ok=True)

    def _fail(self, message: str) -> ActionOutcome:
        self.bind_failures += 1
        return ActionOutcome(ok=False, message=message)

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        key = f"{namespace}/{name}"
        info = self.pods.get(key)
        if info is None or info.obj["metadata"].get("uid") != uid:
            return ActionOutcome(ok=True, already=True, message="pod is already gone")
        refuse = _annotation(info.obj, REFUSE_EVICTION)
        if refuse == "once" and uid not in self.refused_once:
            self.refused_once.add(uid)  # a transient refusal: a later eviction passes
            self.eviction_refusals += 1
            return ActionOutcome(ok=False, message=f"pod {key} refuses its first eviction ({REFUSE_EVICTION}: once)")
        if refuse in ("true", "retryable"):
            self.eviction_refusals += 1
            return ActionOutcome(ok=False, retryable=refuse == "retryable",
                                 message=f"pod {key} refuses eviction ({REFUSE_EVICTION}: {refuse})")
        self._free(info)
        del self.pods[key]
        self.evictions += 1
        self._report("Pod", "DELETED", info.obj)
        if info.recreate:
            self._recreate(info)
        return ActionOutcome(ok=True)

    def _recreate(self, info: _PodInfo) -> None:
        obj = copy.deepcopy(info.obj)
        meta = obj["metadata"]
        meta["name"], meta["uid"] = recreated_identity(meta.get("namespace", "default"), meta["name"],
                                                       meta["uid"], self.pods)
        meta["creationTimestamp"] = rfc3339(self.now_ns)
        meta.get("annotations", {}).pop("kai-es.io/gpu-devices", None)
        meta.get("labels", {}).pop(tr.GPU_GROUP_LABEL, None)
        obj.get("spec", {}).pop("nodeName", None)
        obj["status"] = {"phase": "Pending"}
        if info.owners is not None:
            obj = self._regroup(obj, info.owners)
        self.pods[_key(obj)] = _PodInfo(obj=obj, run_for_ns=info.run_for_ns, recreate=info.recreate,
                                        owners=info.owners)
        self._report("Pod", "ADDED", obj)

    def _regroup(self, obj: dict[str, Any], owners: tuple[dict[str, Any], ...]) -> dict[str, Any]:
        """The recreated pod grouped as a new pod (see the module contract); a pod of a
        Kubernetes PodGroup (the Workload API) stays in it, as the group outlives its pods."""
        meta = obj["metadata"]
        if wa.wanted(obj, owners) is not None:
            return obj
        meta.get("annotations", {}).pop(tr.PODGROUP_ANNOTATION, None)
        meta.get("labels", {}).pop(tr.SUBGROUP_LABEL, None)
        grouping = pg.group_pod(obj, owners, rules=pg.rules_by_kind(self.scenario.config.grouping),
                                ours=self.scenario.config.scheduler_name)
        if grouping is None:  # (it was grouped before, with the same owners)
            return obj
        group = grouping.podgroup
        key = ("PodGroup", f"{group['metadata']['namespace']}/{group['metadata']['name']}")
        if key not in self.others:
            group["metadata"]["uid"] = recreated_group_uid(meta["uid"])
            group["metadata"]["creationTimestamp"] = meta["creationTimestamp"]
            self.others[key] = group
            self._report("PodGroup", "ADDED", group)
        return grouping.pod
