"""A pure-Python stand-in for the `pynvml` module, injected into `NvmlDiscovery(nvml=...)` for fast in-process tests.

TEST ONLY. It raises pynvml's real exception classes and forwards constants to the real module. Any `nvml*` function
it does not define behaves like a symbol missing from an old driver: calling it raises NVMLError_FunctionNotFound.
Names listed in `absent` are not there at all (a binding too old to have the wrapper). A contract test checks that
every `nvml*` name defined here exists in pynvml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    """One fake device. `None` for an optional reading means the device answers NotSupported."""

    name: str | bytes
    uuid: str | bytes
    memory_mib: int
    bus_id: str = "00000000:00:00.0"
    used_mib: int = 0
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    ecc_uncorrected: int | None = None
    numa_node: int | None = None
    links: list[tuple[int, str]] = field(default_factory=list)  # (remote device type, remote bus ID) per link
    lost: bool = False  # memory queries fail with NVMLError_GpuIsLost


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakePynvml:
    """The subset of pynvml that `NvmlDiscovery` uses, over a list of `FakeGpu`s. Handles are index + 1."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None, absent: frozenset[str] = frozenset()):
        self.absent = absent  # first: __getattribute__ reads it
        self.gpus = gpus
        self.init_error = init_error
        self.inited = False
        self.shutdowns = 0

    def __getattr__(self, name: str) -> Any:
        if name in self.absent:
            raise AttributeError(name)
        real = getattr(pynvml, name)
        if name.startswith("nvml") and callable(real):

            def missing(*args: Any) -> Any:
                raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        return real

    def __getattribute__(self, name: str) -> Any:
        if name != "absent" and name in object.__getattribute__(self, "absent"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def _gpu(self, handle: int) -> FakeGpu:
        if not self.inited:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if not 1 <= handle <= len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle - 1]

    @staticmethod
    def _optional(value: Any) -> Any:
        if value is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _error(self.init_error)
        self.inited = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.99.fake"

    def nvmlDeviceGetCount(self) -> int:
        if not self.inited:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._gpu(index + 1)
        return index + 1

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        return self._gpu(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        gpu = self._gpu(handle)
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        total, used = gpu.memory_mib << 20, gpu.used_mib << 20
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(handle).bus_id)

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return self._optional(self._gpu(handle).numa_node)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._gpu(handle)
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        pct = self._optional(self._gpu(handle).utilization_pct)
        return SimpleNamespace(gpu=pct, memory=pct)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._optional(self._gpu(handle).temperature_c)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._optional(self._gpu(handle).power_mw)

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        return self._optional(self._gpu(handle).ecc_uncorrected)

    def _link(self, handle: int, link: int) -> tuple[int, str]:
        links = self._gpu(handle).links
        if link >= len(links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        self._link(handle, link)
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return self._link(handle, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link(handle, link)[1])
