"""Scenario files (see SCENARIOS.md): a multi-document YAML stream of Kubernetes objects and at
most one `kai-es.io/v1alpha1` Scenario document.

Contract:
- `load_scenario(path)` returns a `Scenario` whose objects are expanded and grouped — a workload
  owner (`kai_es.controllers.CONTROLLERS`, or a kind of the config's no-code grouping rules)
  becomes the pods its controllers would create, and every kai-scheduler pod that names no
  PodGroup is grouped by the informer's podgrouper (`kai_es.ingest.podgrouper.group_pod`, with
  the owner chain the controllers made), a bare pod too (`pg-<pod>-<uid>`) — and already
  translated to observed payloads by the same pure functions the informer uses. A PodGroup the
  podgrouper makes for several pods is the one it makes for the last of them (as the informer's
  last update of it); it is created with the first.
- Any problem raises `ScenarioError` naming the file, the document index (1-based), the object
  and the field path. Nothing is skipped silently.
- Uids and creation times that a document does not state are derived deterministically (uuid5 of
  the object's identity; scenario start + submit-after + document order), so loading a file twice
  gives identical events.
- Objects mean what `kubectl apply` of them means: a Pod (or pod template) without
  `schedulerName: kai-scheduler` belongs to the default scheduler — kai-es does not place it, but
  once it runs on a node it occupies that node. Nodes get the labels a kubelet sets
  (`kubernetes.io/hostname`, `kubernetes.io/os: linux`, `kubernetes.io/arch: amd64`) unless the
  file sets them.
"""

from __future__ import annotations

import copy
import os
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from kai_es.yaml_shape import ShapeError, check_shape

from kai_es.events import payloads as p
from kai_es.events.factory import NAMESPACE
from kai_es.events.timefmt import parse_duration, parse_rfc3339, rfc3339
from kai_es.controllers import CONTROLLERS, REFERENCE_KINDS, Context, rule_controller
from kai_es.controllers import workload_with_job
from kai_es.controllers.base import simulation_annotations
from kai_es.ingest import bounds
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.ingest.groupers import workload_api as wa
from kai_es.ingest.groupers.base import DEFAULT_QUEUE, OwnerError, describe
from kai_es.scheduling.config import ConfigError, SchedulerConfig, parse_config
from kai_es.scheduling.fairshare import parent_loops

SUBMIT_AFTER = "kai-es.io/submit-after"
RUN_FOR = "kai-es.io/run-for"
RECREATE = "kai-es.io/recreate"
DEFAULT_START = "2026-01-01T00:00:00Z"
#: the feature gates `spec.cluster.featureGates` may name: the Workload API's (the loader reads
#: its PodGroups whatever the gates; WorkloadWithJob makes the Job controller emulate its part)
FEATURE_GATES = frozenset({"GenericWorkload", workload_with_job.GATE})


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Simulation:
    until_ns: int | None  # None: run until idle
    cycle_period_ns: int


@dataclass(frozen=True, slots=True)
class ScenarioObject:
    """One object of the scenario, expanded and translated."""

    doc_index: int
    kind: str
    obj: dict[str, Any]
    payload: p.Payload
    submit_after_ns: int = 0
    run_for_ns: int | None = None
    recreate: bool = True
    #: a pod's owner chain as its controllers made it (nearest first; what the podgrouper read)
    owners: tuple[dict[str, Any], ...] = ()
    #: the podgrouper made the pod's PodGroup (its `pod-group-name` is not the user's)
    grouped: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    path: str
    name: str
    start_ns: int
    config: SchedulerConfig
    simulation: Simulation
    objects: list[ScenarioObject] = field(default_factory=list)
    #: every owner the controllers made or read (the documents' copies included), as the
    #: apiserver would return them to the informer's owner reads
    owners: list[dict[str, Any]] = field(default_factory=list)

    def initial(self) -> list[ScenarioObject]:
        """Objects present at the start (submit-after 0), in creation order."""
        return [o for o in self.objects if o.submit_after_ns == 0]


def _uid(*parts: str) -> str:
    return str(uuid.uuid5(NAMESPACE, "/".join(parts)))


class _Loader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.start_ns = parse_rfc3339(DEFAULT_START)
        self.name = Path(path).stem
        self.config = SchedulerConfig()
        self.simulation = Simulation(until_ns=None, cycle_period_ns=1_000_000_000)
        self.objects: list[ScenarioObject] = []
        self.owners: list[dict[str, Any]] = []
        self.references: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.workload_with_job = False  # spec.cluster.featureGates.WorkloadWithJob
        self._made_groups: dict[tuple[str, str], int] = {}  # PodGroups the podgrouper made -> index
        self._made_for: dict[tuple[str, str], tuple[int, Any]] = {}  # ... -> the document it was made for
        self._known: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) -> owner or pod

    def fail(self, index: int, obj: Any, path: str, message: str) -> ScenarioError:
        what = ""
        if isinstance(obj, Mapping):
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
            name = meta.get("name", "?") if isinstance(meta, Mapping) else "?"
            ns = meta.get("namespace") if isinstance(meta, Mapping) else None
            what = f" ({obj.get('kind', '?')} {ns + '/' if ns else ''}{name})"
        where = f" at {path}" if path else ""
        return ScenarioError(f"{self.path}: document {index}{what}{where}: {message}")

    # -- documents ------------------------------------------------------------------------

    def load(self, text: str) -> Scenario:
        try:
            docs = parse_documents(text)
        except ShapeError as exc:  # valid YAML, but no Kubernetes object
            raise ScenarioError(f"{self.path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{self.path}: not valid YAML: {exc}") from None
        for index, doc in enumerate(docs, 1):
            self._check_form(index, doc)
        settings = [(i, d) for i, d in enumerate(docs, 1)
                    if isinstance(d, Mapping) and d.get("kind") == "Scenario"]
        if len(settings) > 1:
            raise self.fail(settings[1][0], settings[1][1], "", "only one Scenario document is allowed")
        if settings:
            self._settings(*settings[0])
        self.rules = pg.rules_by_kind(self.config.grouping)
        for index, doc in enumerate(docs, 1):  # what controllers read, wherever it is in the file
            if isinstance(doc, Mapping) and (tr.api_group(doc), str(doc.get("kind"))) in REFERENCE_KINDS:
                self._reference(index, dict(doc))
        for index, doc in enumerate(docs, 1):
            if doc is None or (isinstance(doc, Mapping) and doc.get("kind") == "Scenario"):
                continue
            if not isinstance(doc, Mapping):
                raise self.fail(index, doc, "", "a document must be a Kubernetes object (a map)")
            self._object(index, dict(doc))
        self._check_references()
        return Scenario(path=self.path, name=self.name, start_ns=self.start_ns, config=self.config,
                        simulation=self.simulation, objects=self.objects, owners=self.owners)

    def _check_form(self, index: int, doc: Any) -> None:
        """What every document must be before any field is read: `metadata`, and its labels and
        annotations, are maps (that every key is a string `check_shape` saw to already)."""
        if not isinstance(doc, Mapping):
            return
        meta = doc.get("metadata")
        if meta is None:
            return
        if not isinstance(meta, Mapping):
            raise self.fail(index, doc, "metadata", f"must be a map, got {type(meta).__name__}")
        for field_name in ("labels", "annotations"):
            value = meta.get(field_name)
            if value is not None and not isinstance(value, Mapping):
                raise self.fail(index, doc, f"metadata.{field_name}",
                                f"must be a map of strings, got {type(value).__name__}")

    def _settings(self, index: int, doc: Mapping[str, Any]) -> None:
        if doc.get("apiVersion") != "kai-es.io/v1alpha1":
            raise self.fail(index, doc, "apiVersion", "the Scenario document's apiVersion is kai-es.io/v1alpha1")
        meta = doc.get("metadata") or {}
        if isinstance(meta, Mapping) and meta.get("name"):
            self.name = str(meta["name"])
        spec = doc.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise self.fail(index, doc, "spec", "must be a map")
        unknown = sorted(set(spec) - {"start", "scheduler", "simulation", "cluster"})
        if unknown:
            raise self.fail(index, doc, f"spec.{unknown[0]}", "unknown field")
        if "start" in spec:
            try:
                self.start_ns = parse_rfc3339(str(spec["start"]))
            except ValueError as exc:
                raise self.fail(index, doc, "spec.start", str(exc)) from None
        try:
            self.config = parse_config(spec.get("scheduler"))
        except ConfigError as exc:
            raise self.fail(index, doc, "spec.scheduler", str(exc)) from None
        self._cluster(index, doc, spec.get("cluster"))
        sim = spec.get("simulation") or {}
        if not isinstance(sim, Mapping):
            raise self.fail(index, doc, "spec.simulation", "must be a map")
        unknown = sorted(set(sim) - {"until", "cyclePeriod"})
        if unknown:
            raise self.fail(index, doc, f"spec.simulation.{unknown[0]}", "unknown field")
        until = sim.get("until", "idle")
        try:
            until_ns = None if str(until) == "idle" else parse_duration(str(until))
            period = parse_duration(str(sim.get("cyclePeriod", "1s")))
        except ValueError as exc:
            raise self.fail(index, doc, "spec.simulation", str(exc)) from None
        if period <= 0:
            raise self.fail(index, doc, "spec.simulation.cyclePeriod", "must be positive")
        self.simulation = Simulation(until_ns=until_ns, cycle_period_ns=period)

    def _cluster(self, index: int, doc: Mapping[str, Any], cluster: Any) -> None:
        """`spec.cluster`: what the emulated cluster is, beyond its objects: `featureGates`, the
        alpha gates whose behaviour the controllers emulate (FEATURE_GATES)."""
        if cluster is None:
            return
        if not isinstance(cluster, Mapping):
            raise self.fail(index, doc, "spec.cluster", "must be a map")
        unknown = sorted(set(cluster) - {"featureGates"})
        if unknown:
            raise self.fail(index, doc, f"spec.cluster.{unknown[0]}", "unknown field")
        gates = cluster.get("featureGates") or {}
        if not isinstance(gates, Mapping):
            raise self.fail(index, doc, "spec.cluster.featureGates", "must be a map of gate names to true or false")
        for name, on in gates.items():
            if name not in FEATURE_GATES:
                raise self.fail(index, doc, f"spec.cluster.featureGates.{name}",
                                f"not a gate the simulation emulates (known: {', '.join(sorted(FEATURE_GATES))})")
            if not isinstance(on, bool):
                raise self.fail(index, doc, f"spec.cluster.featureGates.{name}", f"must be true or false, got {on!r}")
        if gates.get(workload_with_job.GATE) and gates.get("GenericWorkload") is False:
            raise self.fail(index, doc, "spec.cluster.featureGates.WorkloadWithJob", "needs GenericWorkload")
        self.workload_with_job = bool(gates.get(workload_with_job.GATE))

    def _sim_annotations(self, index: int, obj: Mapping[str, Any], annotations: Mapping[str, Any]
                         ) -> tuple[int, int | None, bool]:
        try:
            submit = parse_duration(str(annotations.get(SUBMIT_AFTER, "0s")))
            run_for = parse_duration(str(annotations[RUN_FOR])) if RUN_FOR in annotations else None
        except ValueError as exc:
            raise self.fail(index, obj, "metadata.annotations", str(exc)) from None
        recreate = str(annotations.get(RECREATE, "true")).lower() != "false"
        return submit, run_for, recreate

    def _object(self, index: int, doc: dict[str, Any]) -> None:
        kind = str(doc.get("kind"))
        group = tr.api_group(doc)
        if (group, kind) in CONTROLLERS or (group, kind) in self.rules:
            self._expand(index, doc)
        elif (group, kind) in REFERENCE_KINDS:
            pass  # read before any owner (`_reference`)
        elif (group, kind) == ("", "Pod"):
            self._pod(index, doc)
        elif (group, kind) in tr.TRANSLATORS:
            annotations = (doc.get("metadata") or {}).get("annotations") or {}
            submit, run_for, recreate = self._sim_annotations(index, doc, annotations)
            self._add(index, doc, submit, run_for, recreate)
        else:
            raise self.fail(index, doc, "kind", f"unsupported object {doc.get('apiVersion')}/{kind}")

    def _reference(self, index: int, doc: dict[str, Any]) -> None:
        meta = doc.get("metadata") or {}
        if not isinstance(meta, Mapping) or not meta.get("name"):
            raise self.fail(index, doc, "metadata.name", "is required")
        ns = "" if doc.get("kind") == "ClusterTrainingRuntime" else str(meta.get("namespace") or "default")
        if (tr.api_group(doc), doc.get("kind")) == (wa.API_GROUP, wa.KIND):
            # a Kubernetes PodGroup is the gang's owner: an identity and an age, as the apiserver gives
            doc = copy.deepcopy(doc)
            m = doc["metadata"] = {**meta, "namespace": ns}
            m.setdefault("uid", _uid(self.name, f"{wa.RELATED_KIND}/{ns}/{meta['name']}"))
            self._created(m, 0)
            self.references[(wa.RELATED_KIND, ns, str(meta["name"]))] = doc
            return
        self.references[(str(doc.get("kind")), ns, str(meta["name"]))] = doc

    def _add(self, index: int, obj: dict[str, Any], submit: int, run_for: int | None,
             recreate: bool, owners: tuple[dict[str, Any], ...] = (), grouped: bool = False) -> None:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise self.fail(index, obj, "metadata", "must be a map")
        kind = str(obj.get("kind"))
        if kind in ("Pod", "PodGroup"):
            meta.setdefault("namespace", "default")
        ident = f"{kind}/{meta.get('namespace', '')}/{meta.get('name', '')}"
        meta.setdefault("uid", _uid(self.name, ident))
        self._created(meta, submit)
        if kind == "Node" and isinstance(meta, dict):
            labels = meta.get("labels")
            if labels is None:
                labels = meta["labels"] = {}
            if isinstance(labels, dict):
                # what the kubelet sets on every node, unless the file says otherwise
                for label, value in (("kubernetes.io/hostname", meta.get("name")),
                                     ("kubernetes.io/os", "linux"), ("kubernetes.io/arch", "amd64")):
                    if value:
                        labels.setdefault(label, str(value))
        try:
            payload = tr.translate(obj, ours=self.config.scheduler_name)
        except tr.IngestError as exc:
            raise self.fail(index, obj, exc.path, exc.message) from None
        self.objects.append(ScenarioObject(doc_index=index, kind=kind, obj=obj, payload=payload,
                                           submit_after_ns=submit, run_for_ns=run_for,
                                           recreate=recreate, owners=owners, grouped=grouped))

    # -- owners and grouping ------------------------------------------------------------------

    def _owner_parts(self, index: int, doc: dict[str, Any]) -> tuple[str, str, str, dict[str, Any]]:
        meta = doc.get("metadata") or {}
        if not isinstance(meta, Mapping) or not meta.get("name"):
            raise self.fail(index, doc, "metadata.name", "is required")
        name = str(meta["name"])
        ns = str(meta.get("namespace") or "default")
        uid = str(meta.get("uid") or _uid(self.name, f"{doc.get('kind')}/{ns}/{name}"))
        return name, ns, uid, dict(meta)

    def _grouping_error(self, index: int, doc: Any, exc: tr.IngestError) -> ScenarioError:
        """An error of the grouping or the expansion, at the document; another object's named."""
        message = exc.message
        if isinstance(exc, OwnerError) and exc.owner and exc.owner != describe(doc):
            message = f"({exc.owner}) {message}"
        return self.fail(index, doc, exc.path, message)

    def _created(self, meta: dict[str, Any], submit: int) -> None:
        if "creationTimestamp" not in meta:
            # document order is creation order: a nanosecond apart keeps FIFO exact
            meta["creationTimestamp"] = rfc3339(self.start_ns + submit + len(self.objects))

    def _expand(self, index: int, doc: dict[str, Any]) -> None:
        """An owner document: its controllers' objects and pods, each pod grouped."""
        name, ns, uid, meta = self._owner_parts(index, doc)
        submit, _, _ = self._sim_annotations(index, doc, meta.get("annotations") or {})
        top = copy.deepcopy(doc)
        top_meta = {**meta, "name": name, "namespace": ns, "uid": uid}
        self._created(top_meta, submit)
        top["metadata"] = top_meta
        group, kind = tr.api_group(doc), str(doc.get("kind"))
        controller = CONTROLLERS.get((group, kind)) or rule_controller(self.rules[(group, kind)])
        ctx = Context(uid=lambda ident: _uid(self.name, ident), start_ns=self.start_ns,
                      max_pods=bounds.MAX_REPLICAS, rules=self.rules, references=self.references,
                      simulation=simulation_annotations(top))
        try:
            expansion = controller(top, ctx)
        except tr.IngestError as exc:
            raise self._grouping_error(index, doc, exc) from None
        if self.workload_with_job:
            for made in workload_with_job.apply(expansion, ctx):
                if made["kind"] == wa.KIND:
                    self.references[(wa.RELATED_KIND, ns, str(made["metadata"]["name"]))] = made
        self.owners += expansion.objects
        for o in expansion.objects:
            self._known[(str(o.get("kind")), ns, str(o["metadata"]["name"]))] = o
        related = {(str(o.get("kind")), str(o["metadata"]["name"])): o for o in expansion.objects}
        index_ = _Pods([p.obj for p in expansion.pods])
        for expanded in expansion.pods:
            pod = expanded.obj
            s, r, rc = self._sim_annotations(index, doc, pod["metadata"].get("annotations") or {})
            self._created(pod["metadata"], s)
            self._group(index, doc, pod, expanded.owners, s, r, rc, related, index_)

    def _pod(self, index: int, doc: dict[str, Any]) -> None:
        """A Pod document: grouped as the informer groups it (a bare pod: `pg-<pod>-<uid>`)."""
        pod = copy.deepcopy(doc)
        meta = pod.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise self.fail(index, pod, "metadata", "must be a map")
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", _uid(self.name, f"Pod/{meta.get('namespace')}/{meta.get('name', '')}"))
        submit, run_for, recreate = self._sim_annotations(index, doc, meta.get("annotations") or {})
        self._created(meta, submit)
        try:
            chain = self._chain(pod)
        except tr.IngestError as exc:
            raise self._grouping_error(index, pod, exc) from None
        self._known[("Pod", str(meta["namespace"]), str(meta.get("name", "")))] = copy.deepcopy(pod)
        self._group(index, pod, pod, chain, submit, run_for, recreate, {}, _Pods([]))

    def _chain(self, pod: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """A Pod document's owner chain: the owners its ownerReferences name, as far as they are
        objects of the scenario (expanded owners, pods before it), else their bare references."""
        ns = str(pod["metadata"]["namespace"])
        chain: list[dict[str, Any]] = []
        obj: dict[str, Any] = pod
        ref = pg.first_owner(pod)
        while ref is not None:
            if len(chain) >= 8:
                raise tr.IngestError("metadata.ownerReferences", "owner chain deeper than 8")
            found = self._known.get((ref["kind"], ns, ref["name"]))
            if found is None or not pg.is_fetched(ref, self.rules):
                chain.append(pg.ref_object(ref, ns))
                break
            chain.append(found)
            obj = found
            ref = pg.first_owner(obj, is_pod=False)
        return tuple(chain)

    def _group(self, index: int, doc: Any, pod: dict[str, Any], owners: tuple[dict[str, Any], ...],
               submit: int, run_for: int | None, recreate: bool,
               related: Mapping[tuple[str, str], dict[str, Any]], pods: _Pods) -> None:
        try:
            wanted = wa.wanted(pod, owners)
            k8s_group = self.references.get((wa.RELATED_KIND, str(pod["metadata"]["namespace"]), wanted or ""))
            if k8s_group is not None:
                related = {**related, (wa.RELATED_KIND, str(wanted)): k8s_group}
            grouping = pg.group_pod(pod, owners, related=related, pods=pods, rules=self.rules,
                                    ours=self.config.scheduler_name)
        except tr.IngestError as exc:
            raise self._grouping_error(index, doc, exc) from None
        if grouping is not None:
            meta = grouping.podgroup["metadata"]
            self._made_for.setdefault((str(meta["namespace"]), str(meta["name"])), (index, doc))
            self._made_group(index, grouping.podgroup, submit)
            pod = grouping.pod
        self._add(index, pod, submit, run_for, recreate, owners=owners, grouped=grouping is not None)

    def _made_group(self, index: int, obj: dict[str, Any], submit: int) -> None:
        """Add a PodGroup the podgrouper made, or make it the latest version of one made before."""
        meta = obj["metadata"]
        key = (str(meta["namespace"]), str(meta["name"]))
        at = self._made_groups.get(key)
        if at is None:
            self._made_groups[key] = len(self.objects)
            self._add(index, obj, submit, None, True)
            return
        before = self.objects[at]
        obj = copy.deepcopy(obj)
        obj["metadata"]["uid"] = before.obj["metadata"]["uid"]
        obj["metadata"]["creationTimestamp"] = before.obj["metadata"]["creationTimestamp"]
        if obj == before.obj:
            return
        try:
            payload = tr.translate(obj, ours=self.config.scheduler_name)
        except tr.IngestError as exc:
            raise self.fail(index, obj, exc.path, exc.message) from None
        self.objects[at] = ScenarioObject(doc_index=before.doc_index, kind="PodGroup", obj=obj, payload=payload,
                                          submit_after_ns=before.submit_after_ns)

    # -- cross-object checks ----------------------------------------------------------------

    def _check_references(self) -> None:
        queues = {o.payload.name: o for o in self.objects if isinstance(o.payload, p.QueueObserved)}
        groups = {(o.payload.namespace, o.payload.name): o.payload
                  for o in self.objects if isinstance(o.payload, p.PodGroupObserved)}
        nodes = {o.payload.name for o in self.objects if isinstance(o.payload, p.NodeObserved)}
        parents = {q.payload.parent for q in queues.values() if isinstance(q.payload, p.QueueObserved)}
        loops = parent_loops({name: o.payload.parent for name, o in queues.items()
                              if isinstance(o.payload, p.QueueObserved)})
        for name in sorted(loops):
            o = queues[name]
            raise self.fail(o.doc_index, o.obj, "spec.parentQueue",
                            f"the parent chain never reaches a root queue: {' -> '.join(loops[name])}")
        for o in queues.values():
            assert isinstance(o.payload, p.QueueObserved)
            if o.payload.parent and o.payload.parent not in queues:
                raise self.fail(o.doc_index, o.obj, "spec.parentQueue",
                                f"parent queue {o.payload.parent!r} is not defined in this scenario")
        seen_names: set[tuple[str, str]] = set()
        for o in self.objects:
            key = (o.kind, tr.subject_of(o.payload))
            if key in seen_names:
                raise self.fail(o.doc_index, o.obj, "metadata.name", "an object of this kind and name is already defined")
            seen_names.add(key)
            pl = o.payload
            if isinstance(pl, p.PodGroupObserved) and pl.queue and pl.queue not in queues:
                made = self._made_for.get((pl.namespace, pl.name))
                if made is not None and pl.queue != DEFAULT_QUEUE:  # (no queue at all: said of its pods)
                    raise self.fail(made[0], made[1], f"metadata.labels[{tr.QUEUE_LABEL}]",
                                    f"queue {pl.queue!r} is not defined in this scenario (its PodGroup {pl.name}'s)")
                if made is None:
                    raise self.fail(o.doc_index, o.obj, "spec.queue", f"queue {pl.queue!r} is not defined in this scenario")
            if not isinstance(pl, p.PodObserved) or pl.scheduler_name != self.config.scheduler_name:
                continue
            group = groups.get((pl.namespace, pl.podgroup))
            if not pl.implicit_podgroup and group is None:
                raise self.fail(o.doc_index, o.obj, f"metadata.annotations[{tr.PODGROUP_ANNOTATION}]",
                                f"PodGroup {pl.podgroup!r} is not defined in this scenario")
            queue = group.queue if group is not None and group.queue else pl.queue
            if not queue or (queue == DEFAULT_QUEUE and queue not in queues and not pl.queue):
                raise self.fail(o.doc_index, o.obj, f"metadata.labels[{tr.QUEUE_LABEL}]",
                                "the pod has no queue (label kai.scheduler/queue or the PodGroup's spec.queue"
                                f"; KAI's podgrouper default, {DEFAULT_QUEUE!r}, is not defined in this scenario)")
            if queue not in queues:
                raise self.fail(o.doc_index, o.obj, f"metadata.labels[{tr.QUEUE_LABEL}]",
                                f"queue {queue!r} is not defined in this scenario")
            if queue in parents:
                raise self.fail(o.doc_index, o.obj, f"metadata.labels[{tr.QUEUE_LABEL}]",
                                f"queue {queue!r} is a parent queue; only leaf queues hold jobs")
            if pl.node_name and pl.node_name not in nodes:
                raise self.fail(o.doc_index, o.obj, "spec.nodeName", f"node {pl.node_name!r} is not defined in this scenario")


class _Pods:
    """The pods one owner expanded into, by label: the podgrouper's PodIndex for the loader."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def has_pod(self, namespace: str, labels: Mapping[str, str]) -> bool:
        for pod in self.pods:
            meta = pod.get("metadata") or {}
            have = meta.get("labels") or {}
            if meta.get("namespace", "default") == namespace and all(have.get(k) == v for k, v in labels.items()):
                return True
        return False


#: libyaml's safe loader (PyYAML's wheels ship it): ~8x faster than the pure-Python one on big
#: scenarios; the same documents. The pure-Python loader only where PyYAML was built without it.
YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_documents(text: str) -> list[Any]:
    """The YAML documents of `text`, parsed safely (plain data only) by `YAML_LOADER`; raises
    yaml.YAMLError."""
    docs = list(yaml.load_all(text, Loader=YAML_LOADER))
    for index, doc in enumerate(docs, 1):
        check_shape(doc, f"document {index}")
    return docs


#: the largest scenario file read (a pipe included): 2,000,000 pods of a cluster-day scenario
#: take about 400 MiB
MAX_SCENARIO_BYTES = 1 << 30


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario file (see module docstring). A file that cannot be read or
    is not UTF-8 text raises ScenarioError naming it."""
    return _Loader(str(path)).load(read_text_file(path, "a scenario is YAML text"))


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file (or pipe) at `path`, at most MAX_SCENARIO_BYTES; a device, an
    unreadable file, a larger one or one that is not UTF-8 raises ScenarioError naming it
    (`what` says what the file should have been)."""
    try:
        with open(path, "rb") as f:
            if stat.S_ISCHR(os.fstat(f.fileno()).st_mode):
                raise ScenarioError(f"{path}: is a device, not a file ({what})")
            data = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{path}: larger than {MAX_SCENARIO_BYTES >> 20} MiB: refusing to load it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not a text file (invalid UTF-8 at byte {exc.start}); {what}") from None


def load_scenario_text(text: str, name: str = "<scenario>") -> Scenario:
    """Load a scenario from a string (tests, stdin)."""
    return _Loader(name).load(text)


__all__ = ["Scenario", "ScenarioError", "ScenarioObject", "Simulation", "load_scenario",
           "load_scenario_text", "read_text_file"]
