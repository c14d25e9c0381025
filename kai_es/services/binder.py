"""The binder service: performs bind and evict decisions on the cluster and appends outcomes.

Contract:
- Idempotent by decision id: a decision whose outcome (PodBound, PodBindFailed, PodEvicted or
  PodEvictionFailed naming it) is in the log after it is not performed; a decision id read again
  within the last `DONE_WINDOW` outcomes is ignored. Beyond that window a duplicate would be
  performed again, which the cluster answers "already done" (bind with the pod's uid as
  precondition; "already bound to that node" counts as success) - never a second binding.
- One perform path, `perform_batch`: every pending decision is performed (up to `concurrency` at
  a time, outcomes in decision order), then all their outcomes are appended in ONE atomic append.
  A crash in between loses only outcomes; the decisions are performed again after a restart, and
  the cluster answers "already done".
- A failed eviction is not an eviction: a refusal is recorded as PodEvictionFailed (the pod keeps
  running), never as PodEvicted. A retryable refusal (e.g. a PodDisruptionBudget's 429) is tried
  again after each delay of `evict_retry_delays_ns` before it is recorded; it waits without
  holding up anything: the refused decision stays pending (no outcome) while the batch's other
  outcomes are appended, and a later step whose time has come tries it again (`next_retry_ns`).
  A restarted binder starts its tries again.
- A bind that fails `MAX_BIND_FAILURES` times in a row for the same pod (uid), counted from the
  outcomes in the log, is recorded with `final=True`: the scheduler stops picking that pod.
- The outcome's id is uuid5(decision id), so even a crash between performing and appending
  yields one outcome id.
- Durable progress (`progress=` a `BlobStore`): after each batch, and after reading
  `PROGRESS_EVERY` records without one, the binder saves where it is (the next position to read,
  the earliest position a decision without outcome sits at, the consecutive bind failures per
  pod). A restart reads from that earliest position, not from 0; memory holds only decisions
  without outcomes, the failure counts of pods still failing and the bounded done window.
- Followers (e.g. status back to Kubernetes, GPU reservation clean-up) see every record the
  binder reads, in log order (`observe`), and act (`flush`) after a `step` that performed
  nothing, or at least every `FOLLOWER_MAX_DELAY_NS` while decisions keep coming. A follower's
  failure is logged and never stops the binder. Followers must be replay-safe: a restarted
  binder shows them records again from its resume point — and only from there, so what they
  need from earlier records they get from the cluster (or a state they are given).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import anyio
import msgspec

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.ports import BlobStore, Clock, ClusterActuator, EventLog

log = logging.getLogger(__name__)
SOURCE = "kai-es/binder"

#: consecutive failed binds of one pod after which the binder gives up on it (`final=True`)
MAX_BIND_FAILURES = 5
#: waits before each retry of an eviction refused as retryable (then PodEvictionFailed)
EVICT_RETRY_DELAYS_NS: tuple[int, ...] = (500_000_000, 1_000_000_000, 2_000_000_000)
#: while decisions keep coming, followers act at least this often (else only when idle)
FOLLOWER_MAX_DELAY_NS = 2_000_000_000
#: how many recent decision ids with outcomes the binder remembers (duplicates inside are ignored)
DONE_WINDOW = 65_536
#: records read without a batch after which the progress is saved anyway
PROGRESS_EVERY = 10_000
PROGRESS_FORMAT = 1


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """The binder's saved progress (JSON in its BlobStore)."""

    format: int
    #: the next position to read
    position: int
    #: where a restart reads from: the earliest decision without an outcome (else `position`)
    resumefrom: int
    #: pod uid -> consecutive failed binds recorded at positions before `position`
    bindfailures: dict[str, int]


class Follower(Protocol):
    """Something the binder process does with the records it reads, besides binding."""

    def observe(self, record: Record) -> None: ...

    async def flush(self) -> None: ...


class BinderService:
    def __init__(self, events: EventLog, actuator: ClusterActuator, clock: Clock, *,
                 evict_retry_delays_ns: Sequence[int] = EVICT_RETRY_DELAYS_NS,
                 concurrency: int = 1, progress: BlobStore | None = None,
                 followers: Sequence[Follower] = ()) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.events = events
        self.actuator = actuator
        self.clock = clock
        self.evict_retry_delays_ns = tuple(evict_retry_delays_ns)
        self.concurrency = concurrency
        self.progress = progress
        #: pod uid -> consecutive failed binds recorded in the log (dropped once bound or final)
        self.bind_failures: dict[str, int] = {}
        self.position = 0
        #: recent decision ids with outcomes (oldest first), at most DONE_WINDOW
        self.done: OrderedDict[str, None] = OrderedDict()
        #: decisions read without an outcome yet, in log order
        self.pending: dict[str, Record] = {}
        #: decision id -> (tries made, when the next may be made) of pending evictions refused as
        #: retryable
        self.retrying: dict[str, tuple[int, int]] = {}
        self.performed = 0
        self.resumed_from: int | None = None  # the position a saved progress let us start at
        self._count_failures_from = 0
        self._read_since_save = 0
        self.followers = tuple(followers)
        self._flushed_ns = 0

    def _mark_done(self, decision_id: str) -> None:
        self.pending.pop(decision_id, None)
        self.retrying.pop(decision_id, None)
        self.done[decision_id] = None
        self.done.move_to_end(decision_id)
        if len(self.done) > DONE_WINDOW:
            self.done.popitem(last=False)

    def _observe(self, record: Record) -> None:
        for follower in self.followers:
            follower.observe(record)
        data = record.envelope.data
        if isinstance(data, (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)):
            self._mark_done(data.decision_id)
            if record.position < self._count_failures_from:
                return  # counted in the saved progress already
            if isinstance(data, p.PodBindFailed) and not data.final:
                self.bind_failures[data.uid] = self.bind_failures.get(data.uid, 0) + 1
            elif isinstance(data, (p.PodBound, p.PodBindFailed)):
                self.bind_failures.pop(data.uid, None)
        elif isinstance(data, (p.BindingDecided, p.EvictionDecided)):
            if record.envelope.id not in self.done:
                self.pending[record.envelope.id] = record

    async def restore(self) -> None:
        """Start from the saved progress, if there is one that fits this log (else from 0)."""
        if self.progress is None or self.position > 0:
            return
        blob = await self.progress.load_blob()
        if blob is None:
            return
        try:
            saved = msgspec.json.decode(blob, type=Progress)
        except msgspec.DecodeError as exc:
            log.warning("the binder's saved progress is unreadable (%s); reading the log from 0", exc)
            return
        end = await self.events.end_position()
        if saved.format != PROGRESS_FORMAT or not 0 <= saved.resumefrom <= saved.position <= end:
            log.warning("the binder's saved progress (position %d, log end %d) does not fit this "
                        "log; reading it from 0", saved.position, end)
            return
        self.position = saved.resumefrom
        self._count_failures_from = saved.position
        self.bind_failures = dict(saved.bindfailures)
        self.resumed_from = saved.resumefrom

    async def save_progress(self) -> None:
        """Save where the binder is (a no-op without a progress store)."""
        if self.progress is None:
            return
        resume = min((r.position for r in self.pending.values()), default=self.position)
        blob = msgspec.json.encode(Progress(format=PROGRESS_FORMAT, position=self.position,
                                            resumefrom=min(resume, self.position),
                                            bindfailures=dict(sorted(self.bind_failures.items()))))
        await self.progress.save_blob(blob)
        self._read_since_save = 0

    async def step(self) -> int:
        """Read new records, perform decisions without outcomes; returns how many it performed."""
        await self.poll()
        performed = await self.perform_batch()
        now = self.clock.now_ns()
        if performed and now - self._flushed_ns < FOLLOWER_MAX_DELAY_NS:
            return performed  # binding first: followers act when idle, or after the delay
        self._flushed_ns = now
        for follower in self.followers:
            try:
                await follower.flush()
            except Exception:  # noqa: BLE001 - a follower never stops binding
                log.exception("binder follower %s failed; retried after the next step", type(follower).__name__)
        return performed

    async def poll(self) -> None:
        """Read new records (decisions to perform, outcomes already in the log)."""
        async for record in self.events.read(self.position):
            self.observe(record)

    def observe(self, record: Record) -> None:
        """Take a record read elsewhere (e.g. while rebuilding a cluster) as read by `poll`."""
        if record.position >= self.position:
            self._observe(record)
            self.position = record.position + 1
            self._read_since_save += 1

    def next_retry_ns(self) -> int | None:
        """When the earliest refused eviction waiting for its next try may be tried (None: none
        is waiting)."""
        return min((at for _, at in self.retrying.values()), default=None)

    async def perform_batch(self) -> int:
        """Perform every pending decision that is not waiting for a retry, then append all the
        outcomes they have in ONE atomic append (see the module contract); returns how many
        decisions it tried."""
        now = self.clock.now_ns()
        todo = [r for r in self.pending.values() if self.retrying.get(r.envelope.id, (0, now))[1] <= now]
        if not todo:
            if self._read_since_save >= PROGRESS_EVERY:
                await self.save_progress()
            return 0
        outcomes: list[Envelope | None] = [None] * len(todo)
        if self.concurrency == 1:
            for i, record in enumerate(todo):
                outcomes[i] = await self._perform(record)
        else:
            limiter = anyio.CapacityLimiter(self.concurrency)

            async def one(i: int, record: Record) -> None:
                async with limiter:
                    outcomes[i] = await self._perform(record)

            async with anyio.create_task_group() as tg:
                for i, record in enumerate(todo):
                    tg.start_soon(one, i, record)
        answered = [(record, o) for record, o in zip(todo, outcomes) if o is not None]
        if answered:
            await self.events.append([o for _, o in answered])
        for record, _ in answered:
            self._mark_done(record.envelope.id)
        self.performed += len(answered)
        await self.save_progress()
        return len(todo)

    async def _perform(self, record: Record) -> Envelope | None:
        """The outcome of one try of `record`'s decision, or None: an eviction refused as
        retryable that will be tried again (`retrying`)."""
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
                                                gpu_devices=data.gpu_devices), **common)  # type: ignore[arg-type]
            final = self.bind_failures.get(data.uid, 0) + 1 >= MAX_BIND_FAILURES
            log.warning("bind %s/%s -> %s failed%s: %s", data.namespace, data.name, data.node,
                        " for good" if final else "", result.message)
            return make_envelope(p.PodBindFailed(namespace=data.namespace, name=data.name, uid=data.uid,
                                                 node=data.node, decision_id=env.id,
                                                 message=result.message, final=final),
                                 **common)  # type: ignore[arg-type]
        assert isinstance(data, p.EvictionDecided)
        tries = self.retrying.get(env.id, (0, 0))[0] + 1
        result = await self.actuator.evict(data.namespace, data.name, data.uid)
        if not result.ok and result.retryable and tries <= len(self.evict_retry_delays_ns):
            delay = self.evict_retry_delays_ns[tries - 1]
            log.info("evict %s/%s refused, trying again in %.1f s: %s", data.namespace, data.name,
                     delay / 1e9, result.message)
            self.retrying[env.id] = (tries, self.clock.now_ns() + delay)
            return None
        if not result.ok:
            log.warning("evict %s/%s failed: %s", data.namespace, data.name, result.message)
            return make_envelope(p.PodEvictionFailed(namespace=data.namespace, name=data.name, uid=data.uid,
                                                     node=data.node, decision_id=env.id, message=result.message,
                                                     retryable=result.retryable),
                                 **common)  # type: ignore[arg-type]
        return make_envelope(p.PodEvicted(namespace=data.namespace, name=data.name, uid=data.uid,
                                          node=data.node, decision_id=env.id), **common)  # type: ignore[arg-type]

    async def run(self, poll_ns: int = 50_000_000) -> None:
        """The binder loop: restore the saved progress, then read, perform, wait `poll_ns`."""
        await self.restore()
        while True:
            await self.step()
            await self.clock.sleep_until(self.clock.now_ns() + poll_ns)
