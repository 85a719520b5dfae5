"""Real GPUs through NVML (the `pynvml` module of nvidia-ml-py), imported only when an `NvmlDiscovery` is made.

Contract beyond `DeviceDiscovery`: no NVML library, no driver or no nvidia-ml-py is a node with zero GPUs and an
`unavailable_reason` (e.g. "NVML Shared Library Not Found"). Name, UUID and memory are mandatory: an NVML error
while listing raises `DiscoveryError`. MIG, NVLink, NUMA, utilization, temperature, power, ECC and Xid events are
optional: NotSupported/FunctionNotFound, or a binding without the call, degrade them to []/0/None. A sample lists
the Xids seen since the previous one (best effort). Health is sticky: after a fatal Xid, an uncorrected ECC error
or a failed query a GPU stays unhealthy for the life of the object.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import sys
from typing import Any

from gpupool.agent.devices.base import DeviceDiscovery, DiscoveryError, is_healthy_after
from gpupool.agent.devices.nvlink import LinkEnds, link_peers, norm_bus_id
from gpupool.protocol.devices import GpuInfo, GpuTelemetry, MigInstance

MAX_EVENTS_PER_SAMPLE = 1024
_MIG_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")


def load_pynvml() -> Any:
    """Import the NVML binding on first use, so importing gpupool.agent never loads it."""
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    """nvidia-ml-py 13 returns str, 11.x returned bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle: the pointer value for ctypes handles, else the handle itself."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


class NvmlDiscovery(DeviceDiscovery):
    """GPUs of this machine as NVML reports them. `nvml` injects a pynvml-like object (tests); default: pynvml."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml: Any = nvml  # None until _start loads pynvml
        self._reason: str | None = None
        self._inited = False
        self._closed = False
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._event_set: Any | None = None
        self._unhealthy: set[str] = set()
        self._start()

    @property
    def unavailable_reason(self) -> str | None:
        return self._reason

    @property
    def driver_version(self) -> str | None:
        """The driver version string, or None when NVML is unavailable or cannot say."""
        version = self._optional("nvmlSystemGetDriverVersion") if self._inited else None
        return None if version is None else _text(version)

    def list_devices(self) -> list[GpuInfo]:
        self._check_open()
        try:
            peers = link_peers(self._uuids, *self._nvlink_topology())
            return [self._gpu_info(i, handle, peers[i]) for i, handle in enumerate(self._handles)]
        except self._nvml.NVMLError as error:
            raise DiscoveryError(f"NVML failed while listing devices: {error}") from error

    def telemetry(self) -> list[GpuTelemetry]:
        """One sample per GPU; a GPU whose queries fail with an unexpected NVML error is reported unhealthy."""
        self._check_open()
        xids = self._drain_xids()
        samples = []
        for handle, uuid in zip(self._handles, self._uuids, strict=True):
            seen = xids.get(_handle_key(handle), [])
            try:
                sample = self._sample(handle, uuid, seen)
            except self._nvml.NVMLError:
                sample = GpuTelemetry(uuid=uuid, utilization_pct=0, memory_used_mib=0, xid_errors=seen, healthy=False)
            if not sample.healthy:
                self._unhealthy.add(uuid)
            samples.append(sample.model_copy(update={"healthy": uuid not in self._unhealthy}))
        return samples

    def close(self) -> None:
        if not self._closed and self._event_set is not None:
            self._quietly("nvmlEventSetFree", self._event_set)
        if not self._closed and self._inited:
            self._quietly("nvmlShutdown")
        self._closed = True

    def _start(self) -> None:
        if self._nvml is None:
            try:
                self._nvml = load_pynvml()
            except ImportError:
                self._reason = "nvidia-ml-py (pynvml) is not installed"
                return
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            if error.value in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED):
                self._reason = str(error)
                return
            raise DiscoveryError(f"nvmlInit failed: {error}") from error
        self._inited = True
        try:
            self._enumerate()
        except DiscoveryError:
            self.close()
            raise

    def _enumerate(self) -> None:
        count = self._required("device count", "nvmlDeviceGetCount")
        self._handles = [self._required(f"GPU {i} handle", "nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        self._uuids = [
            _text(self._required(f"GPU {i} UUID", "nvmlDeviceGetUUID", h)) for i, h in enumerate(self._handles)
        ]
        with contextlib.suppress(self._nvml.NVMLError):  # Xid events are best effort
            self._event_set = self._register_xid_events()

    def _register_xid_events(self) -> Any | None:
        """An event set for critical-Xid events on every GPU that supports them, or None when none does."""
        event_set = self._optional("nvmlEventSetCreate")
        if event_set is None:
            return None
        xid_type = self._nvml.nvmlEventTypeXidCriticalError
        registered = [
            self._optional("nvmlDeviceRegisterEvents", h, xid_type, event_set, default=0) for h in self._handles
        ]
        if any(result is None for result in registered):  # pynvml returns None on success
            return event_set
        self._quietly("nvmlEventSetFree", event_set)
        return None

    def _gpu_info(self, index: int, handle: Any, peers: list[str]) -> GpuInfo:
        mig_enabled, mig_instances = self._mig(handle)
        numa = self._optional("nvmlDeviceGetNumaNodeId", handle)
        return GpuInfo(
            index=index,
            uuid=self._uuids[index],
            model=_text(self._required(f"GPU {index} name", "nvmlDeviceGetName", handle)),
            memory_mib=self._required(f"GPU {index} memory", "nvmlDeviceGetMemoryInfo", handle).total >> 20,
            mig_enabled=mig_enabled,
            mig_instances=mig_instances,
            nvlink_peers=peers,
            numa_node=numa if numa is not None and numa >= 0 else None,
        )

    def _mig(self, handle: Any) -> tuple[bool, list[MigInstance]]:
        mode = self._optional("nvmlDeviceGetMigMode", handle)
        if mode is None or mode[0] != self._nvml.NVML_DEVICE_MIG_ENABLE:
            return False, []
        slots = self._optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        gone = (self._nvml.NVML_ERROR_NOT_FOUND, self._nvml.NVML_ERROR_INVALID_ARGUMENT)
        instances = []
        for slot in range(slots):
            mig = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, also=gone)
            if mig is not None:
                instances.append(self._mig_instance(mig, slot))
        return True, instances

    def _mig_instance(self, mig: Any, slot: int) -> MigInstance:
        gpu_instance_id = self._optional("nvmlDeviceGetGpuInstanceId", mig)
        return MigInstance(
            uuid=_text(self._required(f"MIG slot {slot} UUID", "nvmlDeviceGetUUID", mig)),
            profile=self._mig_profile(mig),
            memory_mib=self._required(f"MIG slot {slot} memory", "nvmlDeviceGetMemoryInfo", mig).total >> 20,
            gpu_instance_id=gpu_instance_id if gpu_instance_id is not None else slot,
        )

    def _mig_profile(self, mig: Any) -> str:
        """ "1g.10gb" from the MIG device name "NVIDIA H100 80GB HBM3 MIG 1g.10gb"; "unknown" if it has none."""
        match = _MIG_NAME.search(_text(self._optional("nvmlDeviceGetName", mig) or ""))
        return match.group(1) if match else "unknown"

    def _nvlink_topology(self) -> tuple[list[str | None], list[LinkEnds]]:
        """Per GPU: its own canonical PCI bus ID (None if unknown) and the far ends of its active NVLinks."""
        pcis = [self._optional("nvmlDeviceGetPciInfo", handle) for handle in self._handles]
        bus_ids = [norm_bus_id(_text(pci.busId)) if pci is not None else None for pci in pcis]
        return bus_ids, [self._link_ends(handle) for handle in self._handles]

    def _link_ends(self, handle: Any) -> LinkEnds:
        """Where the GPU's active NVLinks lead; links that are down, absent or unsupported are skipped."""
        remote: set[str] = set()
        via_switch = False
        skip = (self._nvml.NVML_ERROR_INVALID_ARGUMENT,)
        for link in range(self._nvml.NVML_NVLINK_MAX_LINKS):
            if not self._optional("nvmlDeviceGetNvLinkState", handle, link, also=skip):
                continue
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, also=skip)
            if kind == self._nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                via_switch = True
                continue
            pci = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, also=skip)
            if pci is not None:
                remote.add(norm_bus_id(_text(pci.busId)))
        return LinkEnds(frozenset(remote), via_switch)

    def _sample(self, handle: Any, uuid: str, xids: list[int]) -> GpuTelemetry:
        nvml = self._nvml
        memory_used_mib = nvml.nvmlDeviceGetMemoryInfo(handle).used >> 20
        rates = self._optional("nvmlDeviceGetUtilizationRates", handle)
        power_mw = self._optional("nvmlDeviceGetPowerUsage", handle)
        ecc_args = (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        ecc = self._optional("nvmlDeviceGetTotalEccErrors", handle, *ecc_args) or 0
        return GpuTelemetry(
            uuid=uuid,
            utilization_pct=min(100, rates.gpu) if rates is not None else 0,
            memory_used_mib=memory_used_mib,
            temperature_c=self._optional("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
            power_w=(power_mw + 500) // 1000 if power_mw is not None else None,
            ecc_uncorrected=ecc,
            xid_errors=xids,
            healthy=is_healthy_after(xids, ecc),
        )

    def _drain_xids(self) -> dict[Any, list[int]]:
        """Xid codes per device-handle key from the events queued since the last call (non-blocking)."""
        found: dict[Any, list[int]] = {}
        if self._event_set is None:
            return found
        nvml = self._nvml
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError:  # Timeout: queue empty; anything else: events are best effort
                break
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                found.setdefault(_handle_key(data.device), []).append(int(data.eventData))
        return found

    def _required(self, what: str, name: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, name)(*args)
        except (self._nvml.NVMLError, AttributeError) as error:
            raise DiscoveryError(f"NVML could not read {what} ({name}): {error}") from error

    def _optional(self, name: str, *args: Any, also: tuple[int, ...] = (), default: Any = None) -> Any:
        """Call `name`; `default` when the binding lacks it or NVML says NotSupported/FunctionNotFound (or a code in
        `also`). Any other NVML error propagates."""
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return default
        try:
            return fn(*args)
        except self._nvml.NVMLError as error:
            if error.value in (self._nvml.NVML_ERROR_NOT_SUPPORTED, self._nvml.NVML_ERROR_FUNCTION_NOT_FOUND, *also):
                return default
            raise

    def _quietly(self, name: str, *args: Any) -> None:
        """Best-effort clean-up call: NVML errors are ignored."""
        with contextlib.suppress(self._nvml.NVMLError):
            getattr(self._nvml, name)(*args)

    def _check_open(self) -> None:
        if self._closed:
            raise DiscoveryError("NvmlDiscovery used after close()")


def report(discovery: NvmlDiscovery) -> dict[str, Any]:
    """What `discovery` sees, as JSON-ready data: available, reason, driver_version, devices, telemetry."""
    devices, samples = discovery.list_devices(), discovery.telemetry()
    return {
        "available": discovery.unavailable_reason is None,
        "reason": discovery.unavailable_reason,
        "driver_version": discovery.driver_version,
        "devices": [gpu.model_dump() for gpu in devices],
        "telemetry": [sample.model_dump() for sample in samples],
    }


def main() -> int:
    """Print this machine's `report` as JSON and return 0; on DiscoveryError print {"error": ...} and return 1."""
    try:
        with NvmlDiscovery() as discovery:
            print(json.dumps(report(discovery), indent=2))
    except DiscoveryError as error:
        print(json.dumps({"available": False, "error": str(error)}, indent=2))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
