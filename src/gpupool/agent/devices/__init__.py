"""GPU discovery for the node agent: one interface, a real NVML implementation and a clearly-labelled fake.

Importing this package never imports the NVML binding; `NvmlDiscovery()` does, on construction. The nvml module
itself is loaded on first use of `NvmlDiscovery` here, so `python -m gpupool.agent.devices.nvml` runs cleanly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpupool.agent.devices.base import FATAL_XIDS, Clock, DeviceDiscovery, DiscoveryError, MonotonicClock
from gpupool.agent.devices.fake import (
    DEFAULT_MEMORY_MIB,
    FakeDiscovery,
    FakeGpuGroup,
    FakeTelemetryScript,
    fake_uuid,
    parse_fake_spec,
)

if TYPE_CHECKING:
    from gpupool.agent.devices.nvml import NvmlDiscovery


def open_discovery(fake_spec: str | None = None, *, node: str = "fake-node") -> DeviceDiscovery:
    """`FakeDiscovery(fake_spec, node=node)` when a spec is given (even "" for a GPU-less node), else NVML."""
    if fake_spec is not None:
        return FakeDiscovery(fake_spec, node=node)
    from gpupool.agent.devices.nvml import NvmlDiscovery

    return NvmlDiscovery()


def __getattr__(name: str) -> Any:
    if name == "NvmlDiscovery":
        from gpupool.agent.devices.nvml import NvmlDiscovery

        return NvmlDiscovery
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MEMORY_MIB",
    "FATAL_XIDS",
    "Clock",
    "DeviceDiscovery",
    "DiscoveryError",
    "FakeDiscovery",
    "FakeGpuGroup",
    "FakeTelemetryScript",
    "MonotonicClock",
    "NvmlDiscovery",
    "fake_uuid",
    "open_discovery",
    "parse_fake_spec",
]
