"""Shared GPUs on a real cluster: GPU facts on the pod, reservation pods, the device id for the
container — what KAI's binder does before it binds a fractional pod (kai-es's own code).

The contract (GPU devices are facts, not guesses):
- Before binding a pod whose decision names GPU groups (a shared-GPU pod: gpu-fraction or
  gpu-memory), the binder makes sure a reservation pod holds each group's GPU, then writes on the
  pod, in one merge patch carrying the pod's uid: the label `runai-gpu-group: <first group>`
  (KAI's label; a share of several GPUs also gets KAI's `runai-gpu-group/<group>: <group>` per
  group), the annotation `kai-es.io/gpu-groups: <groups, comma-separated>` and
  `kai-es.io/gpu-devices: <device indices, comma-separated>` (kai-es's accounting indices, from
  the decision). Only then does it POST the Binding. The informer reads the label and the
  devices annotation back into PodObserved (`gpu_group`, `gpu_devices`), so a pod kai-es placed
  is accounted on the devices it was decided onto, never on guessed ones; the reducer keeps the
  decision's devices for a pod it saw decided. Whole-GPU pods get no patch: their count is the
  fact that matters (which physical GPUs the device plugin gives them does not change
  accounting), and a patch per pod would double the API calls of a bind.
- Reservation pod: one per (node, group), named `gpu-reservation-<hash of node/group>` in
  `kai-resource-reservation` (KAI's namespace, which must exist), labelled `runai-gpu-group` and
  `app: kai-resource-reservation`, with `spec.nodeName` set (no scheduler involved) and
  `nvidia.com/gpu: 1`, so the device plugin hands it, and so the shared pods, a whole GPU. The
  informer's source never lists these pods (the sharing pods account for that GPU).
- Device id for the container: the reservation pod's `run.ai/reserve_for_gpu_index` annotation
  (set on a real GPU node by KAI's reservation image) when `wait_for_index_s` is given (waited
  for up to that long, else the bind fails and the reservation pod is deleted); without it
  (fake GPU nodes such as KWOK's) kai-es's own device index. On a real GPU cluster set both
  `image` and `wait_for_index_s`: kai-es's index is its accounting's, not the physical GPU the
  device plugin gave the reservation pod. It is published as
  NVIDIA_VISIBLE_DEVICES where the pod's `runai/shared-gpu-configmap: <prefix>` annotation points:
  ConfigMap `<prefix>-0-evar` (or `<prefix>-0` when the first container reads
  NVIDIA_VISIBLE_DEVICES from a ConfigMap), and GPU_PORTION in `<prefix>-0`; both ConfigMaps are
  owned by the pod, so they go with it. A pod without the annotation gets no ConfigMap (kai-es
  has no admission webhook to wire one in) and a log line says so.
- Reservation pods are deleted when no pod of their group (either label) is Pending or Running any more
  (`release_unused`, `sync_all`); the binder process calls these when sharing pods leave.
- Every failure is a `GpuShareError` with a readable message; nothing here raises otherwise for
  an API answer.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
from kubernetes_asyncio import client

from kai_es.adapters.kubernetes.http import read_response
from kai_es.adapters.kubernetes.source import RESERVATION_NAMESPACE
from kai_es.ingest.translate import GPU_DEVICES_ANNOTATION, GPU_GROUP_LABEL

log = logging.getLogger(__name__)

RESERVATION_APP = "kai-resource-reservation"
#: KAI's reservation image under its chart's placeholder registry: give `image=` your KAI
#: release's registry and tag on a real GPU cluster
RESERVATION_IMAGE = "registry/local/kai-scheduler/resourcereservation"
GPU_GROUPS_ANNOTATION = "kai-es.io/gpu-groups"
GPU_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"
CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MERGE_PATCH = "application/merge-patch+json"


class GpuShareError(Exception):
    """A shared-GPU preparation that did not succeed; the message says why."""


def reservation_pod_name(node: str, group: str) -> str:
    digest = hashlib.sha256(f"{node}/{group}".encode()).hexdigest()[:16]
    return f"gpu-reservation-{digest}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _portion(pod: Mapping[str, Any]) -> str:
    annotations = _meta(pod).get("annotations") or {}
    return str(annotations.get("gpu-fraction", "") or "") if isinstance(annotations, Mapping) else ""


def _reads_devices_from_configmap(pod: Mapping[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    first = containers[0] if containers and isinstance(containers[0], Mapping) else {}
    return any(isinstance(e, Mapping) and e.get("name") == VISIBLE_DEVICES
               and ((e.get("valueFrom") or {}).get("configMapKeyRef") is not None)
               for e in first.get("env") or [])


class GpuSharing:
    """Shared-GPU preparation and reservation pods over one ApiClient (contract: module doc)."""

    def __init__(self, api: client.ApiClient, *, namespace: str = RESERVATION_NAMESPACE,
                 image: str = RESERVATION_IMAGE, wait_for_index_s: float | None = None) -> None:
        # Any: plain dict bodies and `_content_type` are passed as is (the generated signatures
        # name only their models)
        self.core: Any = client.CoreV1Api(api)
        self.namespace = namespace
        self.image = image
        self.wait_for_index_s = wait_for_index_s
        self.reservations_created = 0
        self.reservations_deleted = 0

    # -- before a bind ---------------------------------------------------------------------------

    async def prepare(self, pod: Mapping[str, Any], node: str, devices: Sequence[int],
                      groups: Sequence[str]) -> None:
        """Reserve each group's GPU on `node`, publish the device ids, write the GPU facts on
        the pod. Idempotent: a replayed decision finds everything in place."""
        meta = _meta(pod)
        ns, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
        if not groups:
            return
        ids = []
        for i, group in enumerate(groups):
            device = devices[i] if i < len(devices) else None
            ids.append(await self._reserve(pod, node, group, device))
        prefix = (meta.get("annotations") or {}).get(CONFIGMAP_ANNOTATION)
        if prefix:
            await self._publish(pod, str(prefix), ",".join(ids))
        else:
            log.info("pod %s/%s has no %s annotation: its GPU (%s) is published only on the pod",
                     ns, name, CONFIGMAP_ANNOTATION, ",".join(ids))
        labels = {GPU_GROUP_LABEL: groups[0]}
        if len(groups) > 1:  # a share of several GPUs: one label per group, as KAI marks them
            labels.update({f"{GPU_GROUP_LABEL}/{g}": g for g in groups})
        patch = {"metadata": {"uid": uid, "labels": labels, "annotations": {
            GPU_GROUPS_ANNOTATION: ",".join(groups), GPU_DEVICES_ANNOTATION: ",".join(str(d) for d in devices)}}}
        status, doc = await read_response(await self.core.patch_namespaced_pod(
            name, ns, patch, _content_type=MERGE_PATCH, _preload_content=False))
        if status != 200:
            raise GpuShareError(f"writing the GPU group on pod {ns}/{name}: HTTP {status}: {doc.get('message', '')}")

    async def _reserve(self, pod: Mapping[str, Any], node: str, group: str, device: int | None) -> str:
        name = reservation_pod_name(node, group)
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {"app": RESERVATION_APP, GPU_GROUP_LABEL: group}},
            "spec": {"nodeName": node, "tolerations": (pod.get("spec") or {}).get("tolerations") or [],
                     "containers": [{"name": "resource-reservation", "image": self.image,
                                     "resources": {"requests": {"nvidia.com/gpu": "1"},
                                                   "limits": {"nvidia.com/gpu": "1"}}}]},
        }  # fmt: skip
        status, doc = await read_response(await self.core.create_namespaced_pod(
            self.namespace, body, _preload_content=False))
        if status == 201:
            self.reservations_created += 1
            log.info("reserved GPU group %s on %s (pod %s/%s)", group, node, self.namespace, name)
        elif status == 409:
            status, doc = await read_response(await self.core.read_namespaced_pod(
                name, self.namespace, _preload_content=False))
            if status != 200:
                raise GpuShareError(f"reservation pod {self.namespace}/{name}: HTTP {status}: {doc.get('message', '')}")
            if (doc.get("spec") or {}).get("nodeName") != node:
                raise GpuShareError(f"GPU group {group} is reserved on {(doc.get('spec') or {}).get('nodeName')}, "
                                    f"not {node}")
        else:
            hint = f" (does namespace {self.namespace} exist?)" if status == 404 else ""
            raise GpuShareError(f"creating reservation pod {self.namespace}/{name}: HTTP {status}: "
                                f"{doc.get('message', '')}{hint}")
        if self.wait_for_index_s is None:
            if device is None:
                raise GpuShareError(f"the decision names GPU group {group} without a device")
            return str(device)
        return await self._wait_for_index(name, doc)

    async def _wait_for_index(self, name: str, doc: Mapping[str, Any]) -> str:
        assert self.wait_for_index_s is not None
        deadline = time.monotonic() + self.wait_for_index_s
        while True:
            index = (_meta(doc).get("annotations") or {}).get(GPU_INDEX_ANNOTATION)
            if index:
                return str(index)
            if time.monotonic() >= deadline:
                await self._delete(name)
                raise GpuShareError(f"reservation pod {self.namespace}/{name} got no GPU within "
                                    f"{self.wait_for_index_s}s (no {GPU_INDEX_ANNOTATION} annotation)")
            await anyio.sleep(0.2)
            status, doc = await read_response(await self.core.read_namespaced_pod(
                name, self.namespace, _preload_content=False))
            if status != 200:
                raise GpuShareError(f"reservation pod {self.namespace}/{name}: HTTP {status}")

    async def _publish(self, pod: Mapping[str, Any], prefix: str, visible: str) -> None:
        meta = _meta(pod)
        owner = [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}]
        capabilities = f"{prefix}-0"
        env_map = capabilities if _reads_devices_from_configmap(pod) else f"{prefix}-0-evar"
        portion = _portion(pod)
        wanted: dict[str, dict[str, str]] = {capabilities: {}, env_map: {}}
        if portion:
            wanted[capabilities].update({"GPU_PORTION": portion, "RUNAI_NUM_OF_GPUS": portion})
        wanted[env_map][VISIBLE_DEVICES] = visible
        for cm_name, data in wanted.items():
            await self._upsert_config_map(str(meta.get("namespace", "")), cm_name, owner, data)

    async def _upsert_config_map(self, ns: str, name: str, owner: list[dict[str, Any]],
                                 data: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": owner}, "data": data}
        status, doc = await read_response(await self.core.create_namespaced_config_map(
            ns, body, _preload_content=False))
        if status == 409:
            patch = {"metadata": {"ownerReferences": owner}, "data": data}
            status, doc = await read_response(await self.core.patch_namespaced_config_map(
                name, ns, patch, _content_type=MERGE_PATCH, _preload_content=False))
        if status not in (200, 201):
            raise GpuShareError(f"publishing the GPU in ConfigMap {ns}/{name}: HTTP {status}: {doc.get('message', '')}")

    # -- after pods leave ------------------------------------------------------------------------

    async def _delete(self, name: str) -> bool:
        status, doc = await read_response(await self.core.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=0, _preload_content=False))
        if status in (200, 202):
            self.reservations_deleted += 1
            return True
        if status != 404:
            log.warning("deleting reservation pod %s/%s: HTTP %s: %s", self.namespace, name, status,
                        doc.get("message", ""))
        return False

    async def release_unused(self, groups: Iterable[str]) -> list[str]:
        """Delete the reservation pods of each group no Pending or Running pod belongs to any
        more; returns the names deleted. A group whose pods cannot be listed is kept."""
        deleted = []
        for group in sorted(set(groups)):
            items: dict[str, Mapping[str, Any]] = {}
            listed = True
            for selector in (f"{GPU_GROUP_LABEL}={group}", f"{GPU_GROUP_LABEL}/{group}={group}"):
                status, doc = await read_response(await self.core.list_pod_for_all_namespaces(
                    label_selector=selector, _preload_content=False))
                if status != 200:
                    log.warning("listing pods of GPU group %s: HTTP %s; kept", group, status)
                    listed = False
                    break
                items.update({str(_meta(i).get("uid", "")): i for i in doc.get("items") or []
                              if isinstance(i, Mapping)})
            if not listed:
                continue
            holders = [i for i in items.values() if _meta(i).get("namespace") == self.namespace]
            sharers = [i for i in items.values() if _meta(i).get("namespace") != self.namespace
                       and (i.get("status") or {}).get("phase", "Pending") in ("Pending", "Running")]
            if sharers:
                continue
            for holder in holders:
                name = str(_meta(holder).get("name", ""))
                if await self._delete(name):
                    log.info("released GPU group %s: deleted reservation pod %s/%s", group, self.namespace, name)
                    deleted.append(name)
        return deleted

    async def sync_all(self) -> list[str]:
        """`release_unused` for every group that has a reservation pod."""
        status, doc = await read_response(await self.core.list_namespaced_pod(
            self.namespace, label_selector=GPU_GROUP_LABEL, _preload_content=False))
        if status != 200:
            log.warning("listing reservation pods in %s: HTTP %s", self.namespace, status)
            return []
        groups = {str((_meta(i).get("labels") or {}).get(GPU_GROUP_LABEL, "")) for i in doc.get("items") or []
                  if isinstance(i, Mapping)}
        return await self.release_unused(g for g in groups if g)
