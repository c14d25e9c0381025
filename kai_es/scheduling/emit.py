"""Committed operations → decision events: the one place that turns a cycle's outcome into the
envelopes the log records.

Contract:
- Every envelope has `basedon` = the CycleStarted position, `causationid` = its id,
  id = uuid5(CycleStarted id, ordinal), and the config's `policyversion`; equal inputs give
  byte-identical envelopes.
- A pipelined placement's `waiting_for` lists the pods its node's capacity waits for: pods
  already Releasing there and pods this plan evicts there, sorted.
- A pod left Pending gets a PodUnschedulable only when its reasons differ from the last ones
  announced for it (`reasons_fingerprint`), so an unchanged verdict is not repeated every cycle.
"""

from __future__ import annotations

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import DerivedIds, make_envelope
from kai_es.scheduling.plan import Entry, Eviction, Plan
from kai_es.state.model import ClusterState
from kai_es.state.reducer import reasons_fingerprint

SOURCE = "kai-es/scheduler"


class Emitter:
    def __init__(self, started: Record, policy_version: str) -> None:
        self.started = started
        self.policy_version = policy_version
        self._ids = DerivedIds(started.envelope.id)
        self.out: list[Envelope] = []
        self.counts = {"bound": 0, "pipelined": 0, "evicted": 0, "unschedulable": 0}
        self._victims: dict[int, set[str]] | None = None

    def emit(self, payload: p.Payload, subject: str, statedigest: str | None = None) -> None:
        env = self.started.envelope
        self.out.append(make_envelope(
            payload, event_id=self._ids(len(self.out)), source=SOURCE, subject=subject,
            logicaltime=env.logicaltime, causationid=env.id, correlationid=env.id,
            basedon=self.started.position, policyversion=self.policy_version,
            statedigest=statedigest))

    def placement(self, state: ClusterState, plan: Plan, entry: Entry) -> None:
        pod = state.pods[entry.pod_key]
        spec = pod.spec
        job = state.jobs[pod.job_key]
        node = plan.names[entry.node]
        devices = plan.local_devices(entry)
        subject = f"pod/{spec.namespace}/{spec.name}"
        if entry.announced_pipelined:
            if self._victims is None:  # the plan's evictions by node, gathered once
                self._victims = {}
                for v in plan.evictions:
                    self._victims.setdefault(v.node, set()).add(v.pod_key)
            waiting = {k for k in plan.nodes[entry.node].pods if state.pods[k].status == "Releasing"}
            waiting |= self._victims.get(entry.node, set())
            self.emit(p.PodPipelined(
                namespace=spec.namespace, name=spec.name, uid=spec.uid, node=node,
                podgroup=job.name, queue=job.queue, gpu_devices=devices,
                gpu_groups=entry.gpu_groups, waiting_for=tuple(sorted(waiting))), subject)
            self.counts["pipelined"] += 1
        else:
            self.emit(p.BindingDecided(
                namespace=spec.namespace, name=spec.name, uid=spec.uid, node=node,
                podgroup=job.name, queue=job.queue, gpu_devices=devices,
                gpu_groups=entry.gpu_groups), subject)
            self.counts["bound"] += 1

    def eviction(self, state: ClusterState, plan: Plan, op: Eviction) -> None:
        pod = state.pods[op.pod_key]
        spec = pod.spec
        job = state.jobs[pod.job_key]
        self.emit(p.EvictionDecided(
            namespace=spec.namespace, name=spec.name, uid=spec.uid, node=plan.names[op.node],
            podgroup=job.name, queue=job.queue, action=op.action, reason=op.reason,
            preemptor=op.preemptor, numbers=dict(sorted(op.numbers.items())), to_node=op.to_node),
            f"pod/{spec.namespace}/{spec.name}")
        self.counts["evicted"] += 1

    def unschedulable(self, state: ClusterState, pod_key: str, reasons: list[p.Reason]) -> None:
        pod = state.pods[pod_key]
        self.counts["unschedulable"] += 1
        if reasons_fingerprint(reasons) == pod.last_unschedulable:
            return
        job = state.jobs[pod.job_key]
        self.emit(p.PodUnschedulable(
            namespace=pod.spec.namespace, name=pod.spec.name, uid=pod.spec.uid,
            podgroup=job.name, queue=job.queue, reasons=tuple(reasons)),
            f"pod/{pod.spec.namespace}/{pod.spec.name}")

    def completed(self, cycle: int, statedigest: str | None, stuck_releasing: list[str] | None = None,
                  tried_order: p.TriedOrder | None = None) -> list[Envelope]:
        c = self.counts
        self.emit(p.CycleCompleted(
            cycle=cycle, decisions=len(self.out), bound=c["bound"], pipelined=c["pipelined"],
            evicted=c["evicted"], unschedulable=c["unschedulable"], stuck_releasing=tuple(stuck_releasing or ()),
            tried_order=tried_order),
            f"cycle/{cycle}", statedigest=statedigest)
        return self.out
