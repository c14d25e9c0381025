"""Upper bounds of every quantity kai-es accepts from a cluster or a log.

Contract: an object or event whose quantity is outside these bounds is rejected with a reason
(ingest: `IngestError`; fold: counted in `ClusterState.rejected_objects`, never applied), so no
input can make the reducer allocate without bound or the packer refuse a task mid-cycle. The
bounds sit far above any real cluster and inside what the C packer accepts
(`kai_es.scheduling.packing.model`).
"""

from __future__ import annotations

from typing import Final

from kai_es.events import timefmt

#: GPUs of one node (the reducer keeps per-device lists)
MAX_NODE_GPUS: Final = 4096
#: milli-CPU, bytes, and any scalar resource amount (the packer's MAX_QUANTITY is 2**62)
MAX_QUANTITY: Final = 2**62
#: GPU memory of one device, MiB (the packer's MAX_MEMORY_MIB is 2**40)
MAX_GPU_MEMORY_MIB: Final = 2**40
#: pods on one node
MAX_NODE_PODS: Final = 1_000_000
#: devices one pod may ask for (whole, or shared across `gpu-fraction-num-devices`)
MAX_POD_GPUS: Final = MAX_NODE_GPUS
#: a duration (min-runtime, preemption delay, staleness grace period), either sign: 100 years in ns
#: (the longest `parse_duration` reads)
MAX_DURATION_NS: Final = timefmt.MAX_DURATION_NS
#: pods one owner (Job, Deployment, PyTorchJob replica type) may expand into in a scenario
MAX_REPLICAS: Final = 100_000


def quantity_problem(name: str, value: int, bound: int = MAX_QUANTITY) -> str | None:
    """Why `value` is not acceptable for `name`, or None."""
    if value < 0:
        return f"{name} must not be negative, got {value}"
    if value > bound:
        return f"{name} is {value}, above the largest accepted ({bound})"
    return None


def duration_problem(name: str, value: int | None, *, signed: bool = False) -> str | None:
    """Why the duration `value` (ns; None: unset) is not acceptable for `name`, or None."""
    if value is None:
        return None
    if value < 0 and not signed:
        return f"{name} must not be negative, got {value}ns"
    if abs(value) > MAX_DURATION_NS:
        return f"{name} is {value}ns, beyond the longest accepted ({MAX_DURATION_NS}ns, 100 years)"
    return None
