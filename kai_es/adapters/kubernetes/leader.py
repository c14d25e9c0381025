"""Active/standby replicas of one kai-es process over a `coordination.k8s.io/v1` Lease.

Contract (the protocol of Kubernetes' own controllers; kai-es's own code):
- `LeaseElector.acquire()` returns once this candidate holds the Lease: it creates the Lease
  when there is none, renews it when it already holds it (a restarted process with a new
  identity waits like any other candidate), and takes it over only when the holder has not
  renewed it for the Lease's own `leaseDurationSeconds` (the holder's `lease_s`; ours when the
  Lease has none) as measured on THIS process's monotonic clock since it last saw the record
  change (so clocks need not agree between nodes), or when it names no holder. Every write is a create or a replace
  with the read resourceVersion: of two candidates racing, the API server lets one win.
- `LeaseElector.hold()` renews every `retry_s` and raises `LeadershipLost` when a renewal has
  not succeeded for `renew_s` (then another candidate may take over after `lease_s` >
  `renew_s`), or at once when the Lease names another holder. It never returns.
- `release()` (best effort, on a clean stop) empties the holder so a standby takes over at its
  next try instead of after `lease_s`.
- API errors while standing by or renewing are logged and retried; they never raise out of
  `acquire`. Leadership is only an optimisation of who works: what keeps two writers from both
  writing is the log's writer fencing (Kafka's transactional id), which still holds when a
  deposed leader has not noticed yet.

Why not kubernetes_asyncio.leaderelection: it runs the leader's work as a detached task whose
failure it never observes, lets a connection error end its loop with an exception while that
task goes on, and writes the wall clock's local time with a "Z" suffix.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.http import read_response
from kai_es.ports import SetupError

log = logging.getLogger(__name__)


class LeadershipLost(SetupError):
    """This process held the Lease and no longer does: it must stop working."""


@dataclass(frozen=True, slots=True)
class LeaseTimes:
    """Seconds: a holder is deposed after `lease_s` without renewal; it gives up after failing
    to renew for `renew_s`; candidates try, and the holder renews, every `retry_s`."""

    lease_s: float = 15.0
    renew_s: float = 10.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_s > self.renew_s > self.retry_s > 0:
            raise ValueError("leader election: need lease duration > renew deadline > retry period > 0 "
                             f"(got {self.lease_s:g}s, {self.renew_s:g}s, {self.retry_s:g}s)")


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str,
                 times: LeaseTimes = LeaseTimes()) -> None:
        self.api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.times = times
        self._seen: tuple[Any, ...] | None = None  # (holder, renewTime, resourceVersion)
        self._seen_at = 0.0
        self._acquired_at: str | None = None
        self.holder: str | None = None  # the holder last read

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def _read(self) -> tuple[int, dict[str, Any]]:
        return await read_response(await self.api.read_namespaced_lease(
            self.name, self.namespace, _preload_content=False, _request_timeout=10))

    def _spec(self) -> dict[str, Any]:
        now = _now_micro()
        if self._acquired_at is None:
            self._acquired_at = now
        return {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.times.lease_s)),
                "acquireTime": self._acquired_at, "renewTime": now}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt (see the module docstring); False when another holds it or the API
        refused; API errors are logged."""
        try:
            status, lease = await self._read()
            if status == 404:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec()}
                status, doc = await read_response(await self.api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=10))  # type: ignore[arg-type]
                if status == 201:
                    self.holder = self.identity
                    return True
                if status != 409:  # 409: another candidate created it first
                    log.warning("leader election: creating Lease %s: %s %s", self.lease, status,
                                doc.get("message", ""))
                return False
            if status != 200:
                log.warning("leader election: reading Lease %s: %s %s", self.lease, status,
                            lease.get("message", ""))
                return False
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or None
            self.holder = holder
            seen = (holder, spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
            now = time.monotonic()
            if seen != self._seen:
                self._seen, self._seen_at = seen, now
            duration = float(spec.get("leaseDurationSeconds") or self.times.lease_s)
            if holder not in (None, self.identity) and now - self._seen_at < duration:
                return False
            if holder != self.identity:
                self._acquired_at = None
            lease["spec"] = {**spec, **self._spec()}
            if holder != self.identity:
                lease["spec"]["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            status, doc = await read_response(await self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _preload_content=False, _request_timeout=10))  # type: ignore[arg-type]
            if status == 200:
                self.holder = self.identity
                return True
            if status != 409:  # 409: someone else wrote it since we read it
                log.warning("leader election: updating Lease %s: %s %s", self.lease, status,
                            doc.get("message", ""))
            return False
        except (OSError, TimeoutError, aiohttp.ClientError, client.ApiException) as exc:
            log.warning("leader election: Lease %s: %s: %s", self.lease, type(exc).__name__, exc)
            return False

    async def acquire(self, on_standby: Any = None) -> None:
        """Return once this process holds the Lease; `on_standby(holder)` hears who holds it
        the first time this candidate finds it held by another."""
        told = False
        while not await self.try_acquire_or_renew():
            if not told and on_standby is not None and self.holder not in (None, self.identity):
                on_standby(self.holder)
                told = True
            await anyio.sleep(self.times.retry_s)

    async def hold(self) -> None:
        """Renew until renewing fails for `renew_s`, or another holds the Lease: then raise
        `LeadershipLost`."""
        last_ok = time.monotonic()
        while True:
            await anyio.sleep(self.times.retry_s)
            if await self.try_acquire_or_renew():
                last_ok = time.monotonic()
                continue
            if self.holder not in (None, self.identity):
                raise LeadershipLost(f"lost the leader Lease {self.lease} to {self.holder}; this "
                                     "replica stops (its restart stands by)")
            if time.monotonic() - last_ok > self.times.renew_s:
                raise LeadershipLost(f"could not renew the leader Lease {self.lease} for "
                                     f"{self.times.renew_s:g} s; this replica stops")

    async def release(self) -> None:
        """Best effort: hand the Lease back (empty holder) if this process still holds it."""
        try:
            status, lease = await self._read()
            spec = lease.get("spec") or {}
            if status != 200 or spec.get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1}
            await read_response(await self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _preload_content=False, _request_timeout=5))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            log.info("leader election: releasing Lease %s: %s", self.lease, exc)
