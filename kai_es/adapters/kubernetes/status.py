"""Status back to Kubernetes: a binder Follower that turns the decisions and outcomes it reads
from the log into what kubectl, cluster autoscalers and KAI's tools read.

Contract:
- core/v1 Events on the pod: `Scheduled` (Normal) for each PodBound (unless
  `scheduled_events=False`: one API write per bound pod), `Preempted` (Normal) for
  each PodEvicted whose EvictionDecided was read (its action, reason and preemptor in words),
  `FailedScheduling` (Warning) for a PodUnschedulable whose message (its structured reasons in
  words, `"; "`-joined) differs from the last one written for that pod — a pod pending for
  1,000 cycles with the same verdict gets one Event, not 1,000.
- The pod's `PodScheduled` condition is set `False`/`Unschedulable` with that message through
  pods/status (a strategic merge on the condition type), so cluster autoscalers see it. A bound
  pod's condition is set True by the API server's Binding itself.
- A verdict whose first reason is `NotReady` (kai-es/v14: the gang is not ready for scheduling,
  too few of its pods exist without scheduling gates) is, as KAI's status updater does for a job
  not ready, a `NotReady` Event (Normal) and nothing else: no FailedScheduling, no PodScheduled
  condition, no PodGroup condition — an autoscaler does not provision nodes for a gang that cannot
  start yet. (KAI writes its NotReady Event on the PodGroup; kai-es on the pod, as its others.)
- The PodGroup (when it exists in the API) gets KAI's `status.schedulingConditions`: one
  `UnschedulableOnNodePool` condition (reason `Unschedulable`, the message, and `reasons` as
  {reason: code, message}) while its pods are unschedulable and none of its pods was bound since;
  a bind clears it. A group kai-es made up (see grouping.py) is not in the API: skipped.
  While the writer holds the whole fold (as for Queue status), the condition's message starts
  with the job's place in its queue and in the cluster-wide order — the order the last cycle
  tried, from kai-es/v13 on (`#3 of 7 in queue team-a, #5
  of 12 in the cluster: ...`, `kai_es.visibility.positions`, as `kai-es explain --queue` lists
  them, from the state folded up to the last record read), so `kubectl describe podgroup` (and, with
  kai-es's CRD, `kubectl get podgroup -o wide`) tell where a job stands. A new verdict is written
  at once; a change of position alone is written at most every `position_interval_s` per group,
  and not at all while it stays the same — a queue of 1,000 jobs moving up by one does not
  cost 1,000 writes per bind.
- Queues get `status.allocated`, `status.requested` (allocated + pending, capped at the
  queue's limit) and `status.fairShare`
  (kai-es's; KAI publishes fair share as metrics) as quantities keyed `gpu`, `cpu`, `memory`
  (`gpu` and `cpu` in milli units, e.g. "1500m"; memory in bytes), computed from the state this
  follower folds from the records it reads (so it needs every record since the log's start, or
  an `initial` state), written at most every `queue_interval_s` and only when changed.
- PodGroups (kai-es/v7 on, by the config in force in the log) get the times KAI's status
  updater keeps as annotations, in RFC 3339 seconds, so KAI taking over from kai-es (or kai-es
  from KAI: `kai_es.state.handlers.jobs.track_stale`) keeps the gang's clocks:
  `kai.scheduler/last-start-timestamp` at a BindingDecided of the group,
  `kai.scheduler/last-eviction-timestamp` at an EvictionDecided of one of its pods (the records'
  logical times), and `kai.scheduler/stale-podgroup-timestamp` = the folded state's
  `stale_since_ns` while the gang is stale (needs the whole fold, as Queue status does),
  removed when a gang it was written for (or that arrived with one) is no longer stale and
  runs, or was seen stale and is not. A PodGroup that already carries the second wanted is not
  written; a merge patch on the PodGroup's metadata (verb `patch` on podgroups).
- Replay-safe: an Event's name is derived from the record that caused it, so a replayed record
  finds it already there (409: done); condition and status writes are idempotent. Writes that
  collapse (several verdicts for one pod before a flush) write only the last. Timestamps are the
  records' logical times. A pod that was removed gets no further writes.
- API failures are logged; a write that failed with a retryable error (5xx, 429, a connection
  error) is tried again at the next flush, up to `attempts` times; nothing here raises.
- Binding comes first: one flush sends at most `max_writes` writes, `concurrency` at a time; the
  rest wait for the next flush (after the binder's next batch).
- Queue status needs the whole fold: it is written only when this writer saw the log from its
  first record (position 0) or was given an `initial` state (records at or before the initial
  state's position are not folded again). `kai-es binder` resumed from saved progress passes the
  scheduler's newest valid snapshot (folded up to its resume point); without one it logs once
  that queue status is off.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.http import read_response
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.timefmt import rfc3339
from kai_es.scheduling.fairshare import shares_for_state
from kai_es.scheduling.framework import NOT_READY
from kai_es.scheduling.policy import CURRENT_POLICY, POLICIES, policy_for
from kai_es.ingest.translate import (
    LAST_EVICTION_TIMESTAMP_ANNOTATION,
    LAST_START_TIMESTAMP_ANNOTATION,
    STALE_TIMESTAMP_ANNOTATION,
)
from kai_es.state import ClusterState
from kai_es.state.keys import pod_key
from kai_es.state.reducer import apply
from kai_es.state.versions import fold_rules
from kai_es.visibility.positions import cluster_ranks, queue_order

log = logging.getLogger(__name__)

COMPONENT = "kai-scheduler"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


def reasons_in_words(reasons: Sequence[p.Reason]) -> str:
    return "; ".join(r.message or r.code for r in reasons) or "unschedulable"


def _seconds(ns: int) -> str:
    """`ns` as KAI writes its PodGroup times: RFC 3339, whole seconds, UTC."""
    return rfc3339(ns - ns % 1_000_000_000)


def _event_name(pod: str, record_id: str, reason: str) -> str:
    digest = hashlib.sha256(f"{record_id}/{reason}".encode()).hexdigest()[:16]
    return f"{pod[:200]}.{digest}"


@dataclass
class _Verdict:
    """What a PodGroup's condition states: the verdict, and the position last written with it."""
    message: str
    reasons: Sequence[p.Reason]
    when: str
    transition: str
    place: tuple[int, int, str, int, int] | None = None
    written_at: float | None = None  # monotonic time of the last write of a place (None: at a verdict)


@dataclass
class _Write:
    what: str  # for logs
    kind: str  # "event" | "pod-condition" | "podgroup" | "podgroup-meta" | "queue"
    namespace: str
    name: str
    body: dict[str, Any]
    pod: tuple[str, str] | None = None
    tries: int = 0


class StatusWriter:
    """A binder Follower (kai_es/services/binder.py); contract: module docstring."""

    def __init__(self, api: client.ApiClient, *, queue_status: bool = True, queue_interval_s: float = 5.0,
                 initial: ClusterState | None = None, attempts: int = 3, max_writes: int = 500,
                 concurrency: int = 16, scheduled_events: bool = True,
                 position_interval_s: float = 30.0) -> None:
        # Any: plain dict bodies and `_content_type` are passed as is
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.queue_status = queue_status
        self.queue_interval_s = queue_interval_s
        self.state = initial if initial is not None else ClusterState()
        self.attempts = attempts
        self.max_writes = max_writes
        self.concurrency = concurrency
        self.scheduled_events = scheduled_events
        #: whether `state` holds the whole log (None: not known until the first record)
        self._complete: bool | None = True if initial is not None else None
        self._pending: dict[tuple[str, ...], _Write] = {}
        self._last_message: dict[tuple[str, str], str] = {}  # pod -> last FailedScheduling message
        self._evictions: dict[str, p.EvictionDecided] = {}  # decision id -> decision
        self._group_condition: dict[tuple[str, str], str] = {}  # podgroup -> message written ("" none)
        #: podgroup -> the verdict its condition states (kept to write it again with a new position)
        self._group_verdict: dict[tuple[str, str], _Verdict] = {}
        self.position_interval_s = position_interval_s
        self._queues_written: dict[str, dict[str, Any]] = {}
        self._queues_at = 0.0
        #: the config in force writes the PodGroup times back (kai-es/v7 on)
        self._handover = False
        #: podgroups whose stale timestamp this writer wrote or saw on the object (absent: none
        #: or removed), and those its fold saw stale
        self._stale_stamp: dict[str, str] = {}
        self._seen_stale: set[str] = set()
        self.writes = 0
        self.skipped_duplicates = 0
        #: the latest logical time read, and the cluster-wide order of the state folded to a
        #: position (computed once per position: every group's place reads it)
        self._now_ns = 0
        self._cluster_rank: tuple[int, dict[str, int]] = (-1, {})

    # -- reading the log -------------------------------------------------------------------------

    def observe(self, record: Record) -> None:
        env = record.envelope
        data = env.data
        if self._complete is None:
            self._complete = record.position == 0
            if not self._complete and self.queue_status:
                log.info("status: the log is read from position %d, not its start: Queue status is not "
                         "written by this process", record.position)
        if self.queue_status and self._complete and record.position > self.state.position:
            apply(self.state, record)  # an `initial` state may already hold the first records read
        self._now_ns = max(self._now_ns, env.logicaltime)
        when = rfc3339(env.logicaltime)
        if isinstance(data, p.ConfigApplied):
            self._handover = fold_rules(data.config.get("policyVersion")).handover_stamps
        elif isinstance(data, p.PodGroupObserved):
            group_key = pod_key(data.namespace, data.name)
            if data.stale_timestamp_ns is not None:
                self._stale_stamp[group_key] = _seconds(data.stale_timestamp_ns)
            else:
                self._stale_stamp.pop(group_key, None)
        if isinstance(data, p.PodUnschedulable):
            self._unschedulable(env.id, data, when)
        elif isinstance(data, p.PodBound):
            pod = (data.namespace, data.name)
            self._last_message.pop(pod, None)
            if self.scheduled_events:
                self._event(env.id, data.namespace, data.name, data.uid, "Normal", "Scheduled",
                            f"Successfully assigned {data.namespace}/{data.name} to {data.node}", when)
            self._pending.pop(("pod-condition", data.namespace, data.name), None)
        elif isinstance(data, p.BindingDecided):
            group = (data.namespace, data.podgroup)
            if self._handover and data.podgroup:
                self._annotate(group, LAST_START_TIMESTAMP_ANNOTATION, _seconds(env.logicaltime))
            self._group_verdict.pop(group, None)
            if self._group_condition.get(group):
                self._group_condition[group] = ""
                self._pending[("podgroup", *group)] = _Write(
                    f"clear conditions of podgroup {group[0]}/{group[1]}", "podgroup", group[0], group[1],
                    {"status": {"schedulingConditions": []}})
        elif isinstance(data, p.EvictionDecided):
            self._evictions[env.id] = data
            if self._handover and data.podgroup:
                self._annotate((data.namespace, data.podgroup), LAST_EVICTION_TIMESTAMP_ANNOTATION,
                               _seconds(env.logicaltime))
        elif isinstance(data, p.PodEvicted):
            decision = self._evictions.pop(data.decision_id, None)
            if decision is not None:
                why = f" ({decision.reason})" if decision.reason else ""
                by = f" for {decision.preemptor}" if decision.preemptor else ""
                self._event(env.id, data.namespace, data.name, data.uid, "Normal", "Preempted",
                            f"Evicted by kai-es ({decision.action}){by}{why}", when)
        elif isinstance(data, p.PodEvictionFailed):
            self._evictions.pop(data.decision_id, None)
        elif isinstance(data, p.PodGroupRemoved):
            self._group_condition.pop((data.namespace, data.name), None)
            self._group_verdict.pop((data.namespace, data.name), None)
            group_key = pod_key(data.namespace, data.name)
            self._stale_stamp.pop(group_key, None)
            self._seen_stale.discard(group_key)
            self._pending.pop(("podgroup-meta", data.namespace, data.name), None)
        elif isinstance(data, p.PodRemoved):
            pod = (data.namespace, data.name)
            self._last_message.pop(pod, None)
            for key in [k for k, w in self._pending.items() if w.pod == pod]:
                del self._pending[key]

    def _event(self, record_id: str, ns: str, pod: str, uid: str, type_: str, reason: str, message: str,
               when: str) -> None:
        name = _event_name(pod, record_id, reason)
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": pod, "uid": uid},
                "type": type_, "reason": reason, "message": message[:1024], "count": 1,
                "firstTimestamp": when, "lastTimestamp": when,
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "reportingInstance": "kai-es-binder"}  # fmt: skip
        self._pending[("event", ns, name)] = _Write(f"{reason} event for pod {ns}/{pod}", "event", ns, name, body,
                                                   pod=(ns, pod))

    def _annotate(self, group: tuple[str, str], key: str, value: str | None) -> None:
        """Set (None: remove) one annotation of a PodGroup, merged into a write not sent yet."""
        pending = self._pending.get(("podgroup-meta", *group))
        if pending is None:
            pending = _Write(f"times of podgroup {group[0]}/{group[1]}", "podgroup-meta", group[0], group[1],
                             {"metadata": {"annotations": {}}})
            self._pending[("podgroup-meta", *group)] = pending
        pending.body["metadata"]["annotations"][key] = value

    def _stale_writes(self) -> None:
        """The stale timestamps to write or remove, from the folded state (module docstring)."""
        state = self.state
        for key in sorted(state.gangs_below_minimum | self._stale_stamp.keys()):
            job = state.jobs.get(key)
            if job is None or job.spec is None:
                continue  # a group kai-es made up, or gone
            group = (job.namespace, job.name)
            have = self._stale_stamp.get(key)
            if job.stale_since_ns:
                self._seen_stale.add(key)
                want: str | None = _seconds(job.stale_since_ns)
            elif have is not None and (job.occupying > 0 or key in self._seen_stale):
                self._seen_stale.discard(key)
                want = None
            else:
                continue  # not running yet, never seen stale: the time it carries may be its own
            if have != want:
                if want is None:
                    del self._stale_stamp[key]
                else:
                    self._stale_stamp[key] = want
                self._annotate(group, STALE_TIMESTAMP_ANNOTATION, want)

    def _unschedulable(self, record_id: str, data: p.PodUnschedulable, when: str) -> None:
        pod = (data.namespace, data.name)
        message = reasons_in_words(data.reasons)
        if self._last_message.get(pod) == message:
            self.skipped_duplicates += 1
            return
        self._last_message[pod] = message
        for key in [k for k, w in self._pending.items()
                    if w.pod == pod and w.kind == "event" and w.body.get("reason") in ("FailedScheduling", "NotReady")]:
            del self._pending[key]  # an older verdict not written yet: only the last one is
        if data.reasons and data.reasons[0].code == NOT_READY:  # (module docstring)
            self._pending.pop(("pod-condition", *pod), None)
            self._event(record_id, data.namespace, data.name, data.uid, "Normal", "NotReady", message, when)
            return
        self._event(record_id, data.namespace, data.name, data.uid, "Warning", "FailedScheduling", message, when)
        self._pending[("pod-condition", *pod)] = _Write(
            f"PodScheduled=False on pod {pod[0]}/{pod[1]}", "pod-condition", pod[0], pod[1],
            {"metadata": {"uid": data.uid}, "status": {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message[:1024], "lastTransitionTime": when}]}}, pod=pod)
        if data.podgroup:
            group = (data.namespace, data.podgroup)
            verdict = self._group_verdict.get(group)
            if verdict is None or verdict.message != message:
                self._group_verdict[group] = _Verdict(message, data.reasons, when,
                                                      hashlib.sha256(record_id.encode()).hexdigest()[:8])
                place = self._place(group, {}) if self.queue_status and self._complete else None
                self._group_condition_write(group, place, None)

    def _place(self, group: tuple[str, str], orders: dict[str, dict[str, int]]
               ) -> tuple[int, int, str, int, int] | None:
        """(position, of, queue, place in the cluster, of) of the group's waiting job in the
        folded state, None when it is not waiting; `orders` keeps each queue's order
        (`positions.queue_order`) across calls, the cluster-wide order
        (`positions.cluster_ranks`, as `kai-es explain` gives it) is kept per folded position."""
        job = self.state.jobs.get(pod_key(*group))
        if job is None or not job.pending:
            return None
        index = orders.get(job.queue)
        if index is None:
            index = orders[job.queue] = {k: i for i, k in enumerate(queue_order(self.state, job.queue))}
        at = index.get(job.key)
        if self._cluster_rank[0] != self.state.position:
            self._cluster_rank = (self.state.position, cluster_ranks(self.state, self._now_ns))
        cluster = self._cluster_rank[1]
        where = cluster.get(job.key)
        if at is None or where is None:
            return None
        return (at + 1, len(index), job.queue, where + 1, len(cluster))

    def _group_condition_write(self, group: tuple[str, str], place: tuple[int, int, str, int, int] | None,
                               now: float | None) -> None:
        verdict = self._group_verdict[group]
        verdict.place, verdict.written_at = place, now
        message = verdict.message
        if place is not None:
            message = f"#{place[0]} of {place[1]} in queue {place[2]}, #{place[3]} of {place[4]} in the cluster: {message}"
        if self._group_condition.get(group) == message:
            return
        self._group_condition[group] = message
        self._pending[("podgroup", *group)] = _Write(
            f"conditions of podgroup {group[0]}/{group[1]}", "podgroup", group[0], group[1],
            {"status": {"schedulingConditions": [{
                "type": "UnschedulableOnNodePool", "nodePool": "default", "reason": "Unschedulable",
                "message": message[:1024], "status": "True", "transitionID": verdict.transition,
                "lastTransitionTime": verdict.when,
                "reasons": [{"reason": r.code, "message": r.message} for r in verdict.reasons]}]}})

    def _position_writes(self) -> None:
        """Conditions whose group moved in its queue, at most every `position_interval_s` each."""
        now = time.monotonic()
        orders: dict[str, dict[str, int]] = {}
        for group in sorted(self._group_verdict):
            verdict = self._group_verdict[group]
            if verdict.written_at is not None and now - verdict.written_at < self.position_interval_s:
                continue
            job = self.state.jobs.get(pod_key(*group))
            if job is None or not job.pending:
                continue  # bound meanwhile (its condition is cleared) or gone
            place = self._place(group, orders)
            if place != verdict.place:
                self._group_condition_write(group, place, now)

    # -- writing ---------------------------------------------------------------------------------

    async def _send(self, w: _Write) -> int:
        if w.kind == "event":
            resp = await self.core.create_namespaced_event(w.namespace, w.body, _preload_content=False)
        elif w.kind == "pod-condition":
            resp = await self.core.patch_namespaced_pod_status(
                w.name, w.namespace, w.body, _content_type=STRATEGIC_PATCH, _preload_content=False)
        elif w.kind == "podgroup-meta":
            resp = await self.custom.patch_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", w.namespace, "podgroups", w.name, w.body,
                _content_type=MERGE_PATCH, _preload_content=False)
        elif w.kind == "podgroup":
            resp = await self.custom.patch_namespaced_custom_object_status(
                "scheduling.run.ai", "v2alpha2", w.namespace, "podgroups", w.name, w.body,
                _content_type=MERGE_PATCH, _preload_content=False)
        else:
            resp = await self.custom.patch_cluster_custom_object_status(
                "scheduling.run.ai", "v2", "queues", w.name, w.body, _content_type=MERGE_PATCH,
                _preload_content=False)
        status, doc = await read_response(resp)
        if status in (200, 201):
            self.writes += 1
            if w.kind == "queue":
                self._queues_written[w.name] = w.body["status"]
        elif status == 409 and w.kind == "event":
            pass  # written before (a replayed record)
        elif status == 404 and w.kind in ("podgroup", "podgroup-meta", "pod-condition", "queue"):
            log.debug("%s: gone or not in the API", w.what)
        elif status >= 500 or status == 429:
            return status
        else:
            log.warning("%s: HTTP %s: %s", w.what, status, doc.get("message", ""))
        return 0

    async def flush(self) -> None:
        if self.queue_status and self._complete and time.monotonic() - self._queues_at >= self.queue_interval_s:
            self._queues_at = time.monotonic()
            self._queue_writes()
        if self._handover and self.queue_status and self._complete:
            self._stale_writes()
        if self.queue_status and self._complete:
            self._position_writes()
        keys = list(self._pending)[: self.max_writes]
        todo = [(k, self._pending.pop(k)) for k in keys]
        retry: list[tuple[tuple[str, ...], _Write]] = []
        limiter = anyio.CapacityLimiter(self.concurrency)

        async def one(key: tuple[str, ...], w: _Write) -> None:
            async with limiter:
                try:
                    failed = await self._send(w)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    failed = -1
                    log.info("%s: %s: %s", w.what, type(exc).__name__, exc)
            if failed:
                retry.append((key, w))

        async with anyio.create_task_group() as tg:
            for key, w in todo:
                tg.start_soon(one, key, w)
        for key, w in retry:
            w.tries += 1
            if w.tries < self.attempts:
                self._pending.setdefault(key, w)  # a newer write for the same key wins
            else:
                log.warning("%s: gave up after %d tries", w.what, w.tries)

    def _queue_writes(self) -> None:
        # divided as the config's policy version divides (time-based weighing left out: it
        # needs the scheduler config's window, which the status writer does not parse)
        version = self.state.config.get("policyVersion")
        division = policy_for(version if isinstance(version, str) and version in POLICIES
                              else CURRENT_POLICY).rules.fair_share_division
        shares = shares_for_state(self.state, division.gpu_unit, replacements_once=division.replacements_once,
                                  quota_granted=division.quota_granted)
        for name in sorted(self.state.queues):
            def quantities(field: str) -> dict[str, str]:
                gpu, cpu, mem = (getattr(shares[r][name], field) for r in ("gpu", "cpu", "memory"))
                return {"gpu": f"{gpu}m", "cpu": f"{cpu}m", "memory": str(mem)}

            status = {"allocated": quantities("allocated"), "requested": quantities("request"),
                      "fairShare": quantities("fair_share")}
            if self._queues_written.get(name) == status:
                continue
            self._pending[("queue", name)] = _Write(f"status of queue {name}", "queue", "", name,
                                                     {"status": status})
