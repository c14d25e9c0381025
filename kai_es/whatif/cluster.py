"""The counterfactual cluster: a recorded workload played back against a live scheduler.

It is the simulator's cluster at the level of observed payloads instead of raw Kubernetes
objects (the log holds payloads): recorded input events happen at their recorded times; a
workload pod arrives at its recorded time, runs its recorded run time from the moment it is
bound, and is then observed Succeeded (or Failed, as recorded); an evicted pod is removed and,
as the simulated cluster's controllers do, recreated Pending as `<name>-r<k>` with a uid derived
from the evicted one — in a PodGroup of its own when the evicted pod had one of its own
(`pg-<name>-<uid>`: a bare pod's or a Deployment's, observed before the pod as the simulated
cluster makes it), else in the evicted pod's. The observations it makes are exactly those `kai_es.sim.cluster.SimCluster`
makes through the informer for the same happenings, so with the recorded configuration a
simulated log is reproduced decision for decision.

Contract: deterministic (a heap ordered by time, then recorded position, then push order);
time moves only through `advance`. A bind is admitted when the pod exists with that uid, is not
placed elsewhere and the node exists: capacity is the scheduler's own state, which observes
exactly what this cluster holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from kai_es.adapters.ids import SeededIds
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.events.timefmt import parse_rfc3339, rfc3339
from kai_es.ingest.translate import GPU_GROUP_LABEL, implicit_podgroup_name, subject_of
from kai_es.ports import ActionOutcome, Clock, EventLog
from kai_es.sim.cluster import recreated_group_uid, recreated_identity
from kai_es.whatif.workload import Input, PodRun, Workload

SOURCE = "kai-es/informer"


@dataclass(slots=True)
class _Live:
    run: PodRun
    spec: p.PodObserved  # as last observed
    generation: int = 0
    node: str = ""


class RecordedCluster:
    def __init__(self, workload: Workload, node_names: set[str]) -> None:
        self.workload = workload
        self.now_ns = workload.start_ns
        self.node_names = set(node_names)
        self._heap: list[tuple[int, int, int, str, object]] = []
        self._seq = 0
        self.live: dict[str, _Live] = {}
        self._by_root: dict[str, str] = {}  # arrival uid -> key of its live incarnation
        self._changes: list[p.Payload] = []
        #: the recorded PodGroups (the latest of each), a recreated pod's own group is made from
        self._groups = {(i.payload.namespace, i.payload.name): i.payload for i in [*workload.initial, *workload.inputs]
                        if isinstance(i, Input) and isinstance(i.payload, p.PodGroupObserved)}
        self.binds = self.bind_failures = self.evictions = self.completions = 0
        self._later = max([i.order for i in workload.inputs] + [r.order for r in workload.pods]
                          + [r.deleted_at[1] for r in workload.pods if r.deleted_at is not None] + [0]) + 1
        for run in workload.initial:
            if isinstance(run, PodRun):
                self._arrive(run, report=False)
        for item in workload.inputs:
            self._push(item.at_ns, item.order, "input", item)
        for run in workload.pods:
            if not run.initial:
                self._push(run.at_ns, run.order, "submit", run)
            if run.deleted_at is not None:
                self._push(run.deleted_at[0], run.deleted_at[1], "delete", run.spec.uid)

    # -- time ---------------------------------------------------------------------------------

    def _push(self, at: int, order: int, what: str, item: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, order, self._seq, what, item))

    def next_event_ns(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def advance(self, now_ns: int) -> None:
        """Apply every happening due up to and including `now_ns`."""
        self.now_ns = now_ns
        while self._heap and self._heap[0][0] <= now_ns:
            _, _, _, what, item = heapq.heappop(self._heap)
            if what == "input":
                assert isinstance(item, Input)
                self._input(item.payload)
            elif what == "submit":
                assert isinstance(item, PodRun)
                self._arrive(item, report=True)
            elif what == "complete":
                assert isinstance(item, tuple)
                done_key, generation = item
                live = self.live.get(done_key)
                if live is not None and live.generation == generation and live.node:
                    self._finish(done_key, live)
            elif what == "delete":
                key = self._by_root.get(str(item))
                live = self.live.pop(key, None) if key is not None else None
                if live is not None:
                    self._report(p.PodRemoved(namespace=live.spec.namespace, name=live.spec.name,
                                              uid=live.spec.uid))

    def _input(self, payload: p.Payload) -> None:
        if isinstance(payload, p.NodeObserved):
            self.node_names.add(payload.name)
        elif isinstance(payload, p.NodeRemoved):
            self.node_names.discard(payload.name)
        self._report(payload)

    def _report(self, payload: p.Payload) -> None:
        self._changes.append(payload)

    def drain(self) -> list[p.Payload]:
        out, self._changes = self._changes, []
        return out

    # -- pods ---------------------------------------------------------------------------------

    def _arrive(self, run: PodRun, report: bool) -> None:
        key = f"{run.spec.namespace}/{run.spec.name}"
        live = self.live[key] = _Live(run=run, spec=run.spec)
        self._by_root[run.spec.uid] = key
        if run.placed:  # running before the log began: its run time counts from now
            live.node, live.generation = run.spec.node_name, 1
            if run.run_for_ns is not None:
                self._push(self.now_ns + run.run_for_ns, self._later, "complete", (key, 1))
        if report:
            self._report(run.spec)

    def _finish(self, key: str, live: _Live) -> None:
        phase = "Failed" if live.run.end_phase == "Failed" else "Succeeded"
        live.spec = msgspec.structs.replace(live.spec, phase=phase)
        self.completions += 1
        self._report(live.spec)
        del self.live[key]

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Sequence[int], gpu_groups: Sequence[str]) -> ActionOutcome:
        key = f"{namespace}/{name}"
        live = self.live.get(key)
        if live is None or live.spec.uid != uid:
            return self._fail(f"pod {key} (uid {uid}) does not exist")
        if live.node:
            if live.node == node:
                return ActionOutcome(ok=True, already=True, message="already bound to this node")
            return self._fail(f"pod {key} is already bound to {live.node}")
        if node not in self.node_names:
            return self._fail(f"node {node} does not exist")
        spec = live.spec
        labels = spec.labels
        group = spec.gpu_group
        if gpu_groups:
            labels, group = {**labels, GPU_GROUP_LABEL: gpu_groups[0]}, gpu_groups[0]
        live.spec = msgspec.structs.replace(
            spec, phase="Running", node_name=node,
            gpu_devices=tuple(gpu_devices) if gpu_devices else spec.gpu_devices, gpu_group=group, labels=labels)
        live.node = node
        live.generation += 1
        if live.run.run_for_ns is not None:
            self._push(self.now_ns + live.run.run_for_ns, self._later, "complete", (key, live.generation))
        self.binds += 1
        self._report(live.spec)
        return ActionOutcome(ok=True)

    def _fail(self, message: str) -> ActionOutcome:
        self.bind_failures += 1
        return ActionOutcome(ok=False, message=message)

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        key = f"{namespace}/{name}"
        live = self.live.get(key)
        if live is None or live.spec.uid != uid:
            return ActionOutcome(ok=True, already=True, message="pod is already gone")
        del self.live[key]
        self.evictions += 1
        self._report(p.PodRemoved(namespace=namespace, name=name, uid=uid))
        first = live.run.spec
        labels = {k: v for k, v in first.labels.items() if k != GPU_GROUP_LABEL}
        new_name, new_uid = recreated_identity(namespace, name, uid, self.live)
        podgroup = first.podgroup
        created = parse_rfc3339(rfc3339(self.now_ns))
        if first.implicit_podgroup and first.owner is None:  # one group per pod: named after it
            podgroup = implicit_podgroup_name({"metadata": {"name": new_name, "uid": new_uid}})
        own = self._groups.get((namespace, first.podgroup))
        if not first.implicit_podgroup and first.podgroup == f"pg-{first.name}-{first.uid}" and own is not None:
            podgroup = f"pg-{new_name}-{new_uid}"  # a group of its own, as the podgrouper makes it
            self._report(msgspec.structs.replace(own, name=podgroup, uid=recreated_group_uid(new_uid),
                                                 created_ns=created))
        spec = msgspec.structs.replace(
            first, name=new_name, uid=new_uid, podgroup=podgroup, phase="Pending", node_name="",
            gpu_devices=(), gpu_group="", labels=labels, created_ns=created)
        new_key = f"{namespace}/{spec.name}"
        self.live[new_key] = _Live(run=live.run, spec=spec)
        self._by_root[live.run.spec.uid] = new_key
        self._report(spec)
        return ActionOutcome(ok=True)


class PayloadInformer:
    """Appends what a RecordedCluster observed, as the informer would: same source and
    subjects, and a payload equal to the last one of its subject is dropped."""

    def __init__(self, events: EventLog, cluster: RecordedCluster, clock: Clock, ids: SeededIds,
                 initial: list[p.Payload]) -> None:
        self.events, self.cluster, self.clock, self.ids = events, cluster, clock, ids
        self.initial = initial
        self._last: dict[str, p.Payload] = {}

    def _envelopes(self, payloads: list[p.Payload]) -> list[Envelope]:
        out = []
        now = self.clock.now_ns()
        for payload in payloads:
            if isinstance(payload, (p.ResyncStarted, p.ResyncCompleted)):
                subject = f"resync/{payload.kind.lower()}"
                if isinstance(payload, p.ResyncStarted):
                    prefix = f"{payload.kind.lower()}/"
                    for s in [s for s in self._last if s.startswith(prefix)]:
                        del self._last[s]
            elif isinstance(payload, p.ObjectRejected):
                subject = f"rejected/{payload.kind.lower()}/{payload.name}"
            else:
                subject = subject_of(payload)
                if type(payload).__name__.endswith("Removed"):
                    self._last.pop(subject, None)
                elif self._last.get(subject) == payload:
                    continue
                else:
                    self._last[subject] = payload
            out.append(make_envelope(payload, event_id=self.ids.new_id(), source=SOURCE, subject=subject,
                                     logicaltime=now))
        return out

    async def resync(self) -> int:
        batch = self._envelopes(self.initial)
        if batch:
            await self.events.append(batch)
        return len(batch)

    async def pump_pending(self) -> int:
        batch = self._envelopes(self.cluster.drain())
        if batch:
            await self.events.append(batch)
        return len(batch)
