"""The binder service: performs bind and evict decisions on the cluster and appends outcomes.

Contract:
- Idempotent by decision id: a decision that already has an outcome in the log (PodBound,
  PodBindFailed, PodEvicted or PodEvictionFailed naming it) is never performed again, so
  restarting the binder or replaying decisions never binds twice.
- A failed eviction is not an eviction: a refusal is recorded as PodEvictionFailed (the pod keeps
  running), never as PodEvicted. A retryable refusal (e.g. a PodDisruptionBudget's 429) is tried
  again after each delay of `evict_retry_delays_ns` before it is recorded.
- A bind that fails `MAX_BIND_FAILURES` times in a row for the same pod (uid), counted from the
  outcomes in the log, is recorded with `final=True`: the scheduler stops picking that pod.
- The outcome's id is uuid5(decision id), so even a crash between performing and appending
  yields one outcome id; "already bound to that node" counts as success.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.ports import Clock, ClusterActuator, EventLog

log = logging.getLogger(__name__)
SOURCE = "kai-es/binder"

#: consecutive failed binds of one pod after which the binder gives up on it (`final=True`)
MAX_BIND_FAILURES = 5
#: waits before each retry of an eviction refused as retryable (then PodEvictionFailed)
EVICT_RETRY_DELAYS_NS: tuple[int, ...] = (500_000_000, 1_000_000_000, 2_000_000_000)


class BinderService:
    def __init__(self, events: EventLog, actuator: ClusterActuator, clock: Clock, *,
                 evict_retry_delays_ns: Sequence[int] = EVICT_RETRY_DELAYS_NS) -> None:
        self.events = events
        self.actuator = actuator
        self.clock = clock
        self.evict_retry_delays_ns = tuple(evict_retry_delays_ns)
        #: pod uid -> consecutive failed binds recorded in the log (dropped once bound or final)
        self.bind_failures: dict[str, int] = {}
        self.position = 0
        self.done: set[str] = set()
        self.pending: dict[str, Record] = {}
        self.performed = 0

    def _observe(self, record: Record) -> None:
        data = record.envelope.data
        if isinstance(data, (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)):
            self.done.add(data.decision_id)
            self.pending.pop(data.decision_id, None)
            if isinstance(data, p.PodBindFailed) and not data.final:
                self.bind_failures[data.uid] = self.bind_failures.get(data.uid, 0) + 1
            elif isinstance(data, (p.PodBound, p.PodBindFailed)):
                self.bind_failures.pop(data.uid, None)
        elif isinstance(data, (p.BindingDecided, p.EvictionDecided)):
            if record.envelope.id not in self.done:
                self.pending[record.envelope.id] = record

    async def step(self) -> int:
        """Read new records, perform decisions without outcomes; returns how many it performed."""
        await self.poll()
        return await self.perform_pending()

    async def poll(self) -> None:
        """Read new records (decisions to perform, outcomes already in the log)."""
        async for record in self.events.read(self.position):
            self._observe(record)
            self.position = record.position + 1

    def observe(self, record: Record) -> None:
        """Take a record read elsewhere (e.g. while rebuilding a cluster) as read by `poll`."""
        if record.position >= self.position:
            self._observe(record)
            self.position = record.position + 1

    async def perform_batch(self) -> int:
        """Perform every pending decision, then append all their outcomes in ONE atomic append.

        For an actuator whose effects are rebuilt from the log after a crash (the simulated
        cluster of the `kai-es binder` process), a crash before the append loses the effects
        and the outcomes together, so the decisions are simply performed again."""
        todo = list(self.pending)
        outcomes = [await self._perform(self.pending[d]) for d in todo]
        if outcomes:
            await self.events.append(outcomes)
        for decision_id in todo:
            self.done.add(decision_id)
            self.pending.pop(decision_id, None)
        self.performed += len(todo)
        return len(todo)

    async def perform_pending(self) -> int:
        """Perform decisions without outcomes, one append per outcome."""
        count = 0
        for decision_id in list(self.pending):
            record = self.pending[decision_id]
            outcome = await self._perform(record)
            await self.events.append([outcome])
            self.done.add(decision_id)
            self.pending.pop(decision_id, None)
            count += 1
        self.performed += count
        return count

    async def _perform(self, record: Record) -> Envelope:
        env = record.envelope
        data = env.data
        now = max(self.clock.now_ns(), env.logicaltime)
        common = dict(event_id=derived_id(env.id, 0), source=SOURCE, subject=env.subject,
                      logicaltime=now, causationid=env.id, correlationid=env.correlationid)
        if isinstance(data, p.BindingDecided):
            result = await self.actuator.bind(data.namespace, data.name, data.uid, data.node,
                                              data.gpu_devices, data.gpu_groups)
            if result.ok:
                return make_envelope(p.PodBound(namespace=data.namespace, name=data.name, uid=data.uid,
                                                node=data.node, decision_id=env.id,
                                                gpu_devices=list(data.gpu_devices)), **common)  # type: ignore[arg-type]
            final = self.bind_failures.get(data.uid, 0) + 1 >= MAX_BIND_FAILURES
            log.warning("bind %s/%s -> %s failed%s: %s", data.namespace, data.name, data.node,
                        " for good" if final else "", result.message)
            return make_envelope(p.PodBindFailed(namespace=data.namespace, name=data.name, uid=data.uid,
                                                 node=data.node, decision_id=env.id,
                                                 message=result.message, final=final),
                                 **common)  # type: ignore[arg-type]
        assert isinstance(data, p.EvictionDecided)
        result = await self.actuator.evict(data.namespace, data.name, data.uid)
        for delay in self.evict_retry_delays_ns:
            if result.ok or not result.retryable:
                break
            log.info("evict %s/%s refused, retrying: %s", data.namespace, data.name, result.message)
            await self.clock.sleep_until(self.clock.now_ns() + delay)
            result = await self.actuator.evict(data.namespace, data.name, data.uid)
        if not result.ok:
            log.warning("evict %s/%s failed: %s", data.namespace, data.name, result.message)
            return make_envelope(p.PodEvictionFailed(namespace=data.namespace, name=data.name, uid=data.uid,
                                                     node=data.node, decision_id=env.id, message=result.message,
                                                     retryable=result.retryable),
                                 **common)  # type: ignore[arg-type]
        return make_envelope(p.PodEvicted(namespace=data.namespace, name=data.name, uid=data.uid,
                                          node=data.node, decision_id=env.id), **common)  # type: ignore[arg-type]

    async def run(self, poll_ns: int = 50_000_000) -> None:
        while True:
            await self.step()
            await self.clock.sleep_until(self.clock.now_ns() + poll_ns)
