"""A ClusterActuator over the Kubernetes API: bind through pods/binding, evict through the
Eviction API (policy/v1).

Contract:
- `bind` POSTs a Binding whose metadata.uid is the decided pod's uid (a precondition: a pod
  re-created under the same name is never bound by an old decision). 201: done. 409: the pod
  is read back; already on the decided node with that uid counts as done (`already=True`, e.g.
  a decision replayed after a crash), anything else is a failure naming what the pod is now.
  404: a failure (no such pod).
- `evict` POSTs an Eviction with the uid as delete precondition. 200/201: done. 404 (the pod is
  gone) and a 409 whose pod is gone or has another uid count as done (`already=True`); a 409
  for the same pod is retried. 429 because of a PodDisruptionBudget, and other client errors,
  are failures with the API's message.
- Transient errors — 5xx, 429 from API priority and fairness, connection errors, timeouts —
  are retried with bounded exponential backoff (with jitter) up to `max_attempts` tries; then a
  failure naming the last error. Nothing raises for an API answer: every outcome is an
  ActionOutcome.
- A decision with GPU groups (a shared-GPU pod) is prepared before the Binding by `GpuSharing`
  (kai_es/adapters/kubernetes/gpushare.py: reservation pod, published device id, the GPU group
  and device indices written on the pod): the pod is read first (uid checked, "already bound to
  that node" is done), and a failed preparation is a failed bind naming why. Devices of a
  whole-GPU decision are not written (see gpushare.py).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.gpushare import GpuShareError, GpuSharing
from kai_es.adapters.kubernetes.http import read_response
from kai_es.ports import ActionOutcome

log = logging.getLogger(__name__)


class _Transient(Exception):
    """A try that may succeed if repeated."""


_read = read_response


def _message(status: int, doc: dict[str, Any]) -> str:
    return f"HTTP {status}: {doc.get('message') or doc.get('reason') or 'no message'}"


def _is_pdb_refusal(doc: dict[str, Any]) -> bool:
    causes = (doc.get("details") or {}).get("causes") or []
    return any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes) or (
        "disruption budget" in str(doc.get("message", "")).lower())


class KubernetesActuator:
    """ClusterActuator over one kubernetes-asyncio ApiClient (contract: module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        max_attempts: int = 5,
        base_delay_s: float = 0.1,
        max_delay_s: float = 5.0,
        request_timeout_s: float = 30.0,
        gpu_sharing: GpuSharing | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.core = client.CoreV1Api(api)
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
        self.retries = 0
        self.gpu_sharing = gpu_sharing if gpu_sharing is not None else GpuSharing(api)

    async def _with_retries(self, what: str, attempt: Callable[[], Awaitable[ActionOutcome]]) -> ActionOutcome:
        last = ""
        for i in range(self.max_attempts):
            try:
                return await attempt()
            except (_Transient, aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if not isinstance(exc, _Transient) else str(exc)
            if i + 1 < self.max_attempts:
                self.retries += 1
                delay = min(self.max_delay_s, self.base_delay_s * 2 ** i)
                delay *= 0.5 + random.random() / 2
                log.info("%s: transient error (%s); retry %d in %.2fs", what, last, i + 1, delay)
                await anyio.sleep(delay)
        return ActionOutcome(ok=False, message=f"gave up after {self.max_attempts} attempts: {last}")

    # -- bind ------------------------------------------------------------------------------------

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   gpu_devices: Sequence[int], gpu_groups: Sequence[str]) -> ActionOutcome:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}

        async def attempt() -> ActionOutcome:
            if gpu_groups:
                prepared = await self._prepare_shared(namespace, name, uid, node, gpu_devices, gpu_groups)
                if prepared is not None:
                    return prepared
            status, doc = await _read(await self.core.create_namespaced_pod_binding(
                name, namespace, body,  # type: ignore[arg-type]  # a dict is serialized as is
                _preload_content=False, _request_timeout=self.timeout))
            if status in (200, 201):
                return ActionOutcome(ok=True)
            if status == 409:
                return await self._after_bind_conflict(namespace, name, uid, node, doc)
            if status == 404:
                return ActionOutcome(ok=False, message=f"pod {namespace}/{name} not found")
            if status >= 500 or status == 429:
                raise _Transient(_message(status, doc))
            return ActionOutcome(ok=False, message=_message(status, doc))

        return await self._with_retries(f"bind {namespace}/{name} -> {node}", attempt)

    async def _prepare_shared(self, namespace: str, name: str, uid: str, node: str,
                              gpu_devices: Sequence[int], gpu_groups: Sequence[str]) -> ActionOutcome | None:
        """None when the pod is ready to bind, else the bind's outcome (done or failed)."""
        outcome, pod = await self._unbound_pod(namespace, name, uid, node)
        if outcome is not None:
            return outcome
        try:
            await self.gpu_sharing.prepare(pod, node, gpu_devices, gpu_groups)
        except GpuShareError as exc:
            return ActionOutcome(ok=False, message=f"shared GPU for {namespace}/{name}: {exc}")
        return None

    async def _get_pod(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        return await _read(await self.core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=self.timeout))

    async def _unbound_pod(self, namespace: str, name: str, uid: str,
                           node: str) -> tuple[ActionOutcome | None, dict[str, Any]]:
        """(None, the pod) when the decided pod exists unbound; else (the bind's outcome, {}):
        not found, re-created, already bound to `node` (done) or elsewhere. Raises _Transient
        for a retryable answer."""
        status, pod = await self._get_pod(namespace, name)
        if status == 404:
            return ActionOutcome(ok=False, message=f"pod {namespace}/{name} not found"), {}
        if status != 200:
            if status >= 500 or status == 429:
                raise _Transient(_message(status, pod))
            return ActionOutcome(ok=False, message=_message(status, pod)), {}
        meta = pod.get("metadata") or {}
        bound_to = (pod.get("spec") or {}).get("nodeName") or ""
        if uid and meta.get("uid") != uid:
            return ActionOutcome(ok=False, message=(
                f"pod {namespace}/{name} was re-created (uid {meta.get('uid')}, decided for {uid})")), {}
        if bound_to == node:
            return ActionOutcome(ok=True, already=True, message=f"already bound to {node}"), {}
        if bound_to:
            return ActionOutcome(ok=False, message=f"pod {namespace}/{name} is bound to {bound_to}"), {}
        return None, pod

    async def _after_bind_conflict(self, namespace: str, name: str, uid: str, node: str,
                                   conflict: dict[str, Any]) -> ActionOutcome:
        outcome, _ = await self._unbound_pod(namespace, name, uid, node)
        return outcome if outcome is not None else ActionOutcome(ok=False, message=_message(409, conflict))

    # -- evict -----------------------------------------------------------------------------------

    async def evict(self, namespace: str, name: str, uid: str) -> ActionOutcome:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}

        async def attempt() -> ActionOutcome:
            status, doc = await _read(await self.core.create_namespaced_pod_eviction(
                name, namespace, body,  # type: ignore[arg-type]  # a dict is serialized as is
                _preload_content=False, _request_timeout=self.timeout))
            if status in (200, 201):
                return ActionOutcome(ok=True)
            if status == 404:
                return ActionOutcome(ok=True, already=True, message=f"pod {namespace}/{name} already gone")
            if status == 409:
                got, pod = await self._get_pod(namespace, name)
                if got == 404 or (uid and (pod.get("metadata") or {}).get("uid") != uid):
                    return ActionOutcome(ok=True, already=True,
                                         message=f"pod {namespace}/{name} (uid {uid}) already gone")
                raise _Transient(_message(status, doc))
            if status == 429:
                if _is_pdb_refusal(doc):  # the budget may allow it later: the binder retries
                    return ActionOutcome(ok=False, retryable=True, message=_message(status, doc))
                raise _Transient(_message(status, doc))
            if status >= 500:
                raise _Transient(_message(status, doc))
            return ActionOutcome(ok=False, message=_message(status, doc))

        return await self._with_retries(f"evict {namespace}/{name}", attempt)
