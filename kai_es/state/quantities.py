"""Quantities of the domain, all integers: resource vectors (milli-GPU, milli-CPU, bytes), how a
pod's GPU request becomes milli-GPU on a device, how many devices it holds, and the bound every
quantity stays within.

The one GPU-memory -> milli-GPU conversion is `gpu_memory_share`: ceil(request * 1000 / device
memory) on a device that can hold the request by size, else None. Its two readings:
- placement (the packer, `kai_es.scheduling.packing.model.need_milli` and its C twin): None
  means the device cannot take the pod;
- accounting (`gpu_memory_milli`: the reducer's device shares, queue requests, fragmentation):
  None means the pod holds a whole device (one observed on a node of unknown or smaller GPU
  memory still occupies it).
On every device that can take the request the two agree (the share is at most 1000 there).
"""

from __future__ import annotations

from typing import Final

from kai_es.events import payloads as p
from kai_es.ingest import bounds


#: (milli-GPU, milli-CPU, bytes)
Vector = tuple[int, int, int]
ZERO: Final[Vector] = (0, 0, 0)
MILLI_PER_GPU: Final = 1000


def add(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def scale(a: Vector, k: int) -> Vector:
    return (a[0] * k, a[1] * k, a[2] * k)


def gpu_memory_share(gpu_memory_mib: int, device_memory_mib: int) -> int | None:
    """Milli-GPU a request of `gpu_memory_mib` takes on a device of `device_memory_mib`, rounded
    up (1..1000 for a request >= 1), or None when the device cannot hold it by size (its memory
    unknown, or smaller than the request)."""
    if device_memory_mib <= 0 or gpu_memory_mib > device_memory_mib:
        return None
    return (gpu_memory_mib * MILLI_PER_GPU + device_memory_mib - 1) // device_memory_mib


def gpu_memory_milli(gpu_memory_mib: int, device_memory_mib: int) -> int:
    """Milli-GPU a gpu-memory request is accounted on a device of `device_memory_mib`: its
    share (`gpu_memory_share`), or a whole device where the device cannot hold it by size."""
    share = gpu_memory_share(gpu_memory_mib, device_memory_mib)
    return MILLI_PER_GPU if share is None else share


def device_milli_on(node: p.NodeObserved, gpu: p.GpuRequest) -> int:
    """Milli-GPU per device that `gpu` takes on `node` (0 for a CPU-only pod).

    A gpu-memory request converts by the node's per-device memory, rounding up; on a node whose
    GPU memory is unknown it takes a whole device.
    """
    if gpu.whole:
        return 1000
    if gpu.fraction_milli:
        return gpu.fraction_milli
    if gpu.gpu_memory_mib:
        return gpu_memory_milli(gpu.gpu_memory_mib, node.gpu_memory_mib)
    return 0


def device_count(gpu: p.GpuRequest) -> int:
    """How many devices a pod holds."""
    if gpu.whole:
        return gpu.whole
    if gpu.fraction_milli or gpu.gpu_memory_mib:
        return max(1, gpu.fraction_devices)
    return 0


MAX_QUANTITY: Final = bounds.MAX_QUANTITY
