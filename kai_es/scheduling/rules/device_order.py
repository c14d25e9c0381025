"""Device order: how pods sharing GPUs are spread over a node's devices (the packer's
`DeviceStrategy`), per policy version.

- `DeviceOrderV1` (kai-es/v1): `gpuSharingOrder` as configured.
- `SpreadImpliesGpuSpread` (kai-es/v2 on, as KAI): `placementStrategy.gpu: spread` also orders
  shared devices gpuspread, whatever `gpuSharingOrder` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.packing import DeviceStrategy

if TYPE_CHECKING:
    from kai_es.scheduling.config import SchedulerConfig


class DeviceOrder(Protocol):
    def device_strategy(self, config: SchedulerConfig) -> DeviceStrategy:
        """The shared-device order under `config`."""


def _configured(config: SchedulerConfig) -> DeviceStrategy:
    return DeviceStrategy.GPUPACK if config.gpu_sharing_order == "gpupack" else DeviceStrategy.GPUSPREAD


class DeviceOrderV1:
    __slots__ = ()

    def device_strategy(self, config: SchedulerConfig) -> DeviceStrategy:
        return _configured(config)


class SpreadImpliesGpuSpread:
    __slots__ = ()

    def device_strategy(self, config: SchedulerConfig) -> DeviceStrategy:
        if config.placement_strategy.gpu == "spread":
            return DeviceStrategy.GPUSPREAD
        return _configured(config)
