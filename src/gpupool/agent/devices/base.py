"""The one narrow interface through which the node agent sees its GPUs.

`DeviceDiscovery` is implemented by `NvmlDiscovery` (real GPUs through NVML) and `FakeDiscovery` (made-up GPUs
for tests and GPU-less machines). The rest of the agent depends on this module only, never on NVML.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Protocol, Self

from gpupool.protocol.devices import GpuInfo, GpuTelemetry

# Xid codes after which the GPU itself (not only the process that hit it) needs an operator or a reset:
# 48 double-bit ECC, 62 internal micro-controller halt, 64 row-remap failure, 74 NVLink error,
# 79 fallen off the bus, 95 uncontained ECC error, 119/120 GSP errors. Application faults (13, 31, 43, ...)
# are reported in telemetry but do not make the GPU unhealthy.
FATAL_XIDS: frozenset[int] = frozenset({48, 62, 64, 74, 79, 95, 119, 120})


class DiscoveryError(RuntimeError):
    """Discovery is broken in a way the agent cannot paper over: a mandatory query failed, or use after close().

    An absent NVML library or driver is NOT an error: that is a node with zero GPUs (see `unavailable_reason`).
    """


class Clock(Protocol):
    """Seconds in the clock's own epoch; structurally the same as `gpupool.core.clock.Clock`."""

    def now(self) -> float: ...


class MonotonicClock:
    """The default clock: `time.monotonic()`, immune to wall-clock jumps."""

    def now(self) -> float:
        return time.monotonic()


class DeviceDiscovery(ABC):
    """Inventory and telemetry of the GPUs on this node.

    Contract:
    * `list_devices()` returns the GPUs in index order; UUIDs are unique and stable across calls and restarts.
      An implementation that cannot see any GPU returns [] and says why in `unavailable_reason`.
    * `telemetry()` returns one sample per device of `list_devices()`, in the same order.
    * `close()` releases what the implementation holds; it is idempotent. Any other call after it raises
      `DiscoveryError`.
    * Usable as a context manager that closes on exit.
    """

    @abstractmethod
    def list_devices(self) -> list[GpuInfo]:
        """The GPUs this node has right now."""

    @abstractmethod
    def telemetry(self) -> list[GpuTelemetry]:
        """One sample per GPU, in `list_devices()` order."""

    def close(self) -> None:  # noqa: B027 - a no-op default is the contract for implementations holding nothing
        """Release held resources; safe to call more than once."""

    @property
    def unavailable_reason(self) -> str | None:
        """Why no GPU can be seen (e.g. "NVML Shared Library Not Found"), or None when discovery works."""
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def is_healthy_after(xids: list[int], ecc_uncorrected: int) -> bool:
    """The health verdict from one sample's evidence: no fatal Xid and no uncorrected ECC error."""
    return ecc_uncorrected == 0 and not FATAL_XIDS.intersection(xids)
