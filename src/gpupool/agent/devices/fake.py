"""Made-up GPUs for tests, demos and GPU-less CI. Every `GpuInfo` it returns says `fake=True`.

A node's fake GPUs come from a spec string such as "8xH100-80GB,2xA100-40GB,T4":

* tokens are separated by commas; each is `[COUNTx]MODEL[-NGB]`;
* `COUNT` defaults to 1; `NGB` is GiB, so "H100-80GB" is model "H100" with 80 * 1024 = 81920 MiB;
* a bare MODEL takes its memory from `DEFAULT_MEMORY_MIB` (e.g. "T4" is 16 GiB);
* an empty spec means a node with no GPU. Anything else raises ValueError naming the bad token.

Telemetry is scripted per GPU with `FakeTelemetryScript` against an injected clock, and tests can pin a GPU's
utilization at run time (`set_utilization`) or inject Xid errors. Temperature and power are made up from utilization
(30 + u/2 °C, 50 + 6u W). There is no global state.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.agent.devices.base import Clock, DeviceDiscovery, DiscoveryError, MonotonicClock, is_healthy_after
from gpupool.protocol.devices import GpuInfo, GpuTelemetry

GIB = 1024
MAX_GPUS_PER_TOKEN = 256

# Nominal memory of common data-centre and workstation GPUs, in MiB, for bare model names.
DEFAULT_MEMORY_MIB: Mapping[str, int] = {
    "T4": 16 * GIB,
    "P100": 16 * GIB,
    "V100": 32 * GIB,
    "A10": 24 * GIB,
    "A10G": 24 * GIB,
    "A16": 16 * GIB,
    "A30": 24 * GIB,
    "A40": 48 * GIB,
    "A100": 80 * GIB,
    "A6000": 48 * GIB,
    "L4": 24 * GIB,
    "L40": 48 * GIB,
    "L40S": 48 * GIB,
    "H20": 96 * GIB,
    "H100": 80 * GIB,
    "H200": 141 * GIB,
    "GH200": 96 * GIB,
    "B200": 192 * GIB,
    "RTX3090": 24 * GIB,
    "RTX4090": 24 * GIB,
}

_TOKEN = re.compile(r"^(?:(?P<count>\d+)x)?(?P<model>[A-Za-z][A-Za-z0-9]*)(?:-(?P<gib>\d+)[Gg][Bb])?$")
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "gpupool:fake-gpu")


@dataclass(frozen=True, slots=True)
class FakeGpuGroup:
    """One spec token: `count` GPUs of `model` with `memory_mib` each."""

    count: int
    model: str
    memory_mib: int


def parse_fake_spec(spec: str) -> list[FakeGpuGroup]:
    """Parse a spec string (see the module docstring) into groups, in order. Raises ValueError on a bad token."""
    if not spec.strip():
        return []
    return [_parse_token(token.strip()) for token in spec.split(",")]


def _parse_token(token: str) -> FakeGpuGroup:
    match = _TOKEN.match(token)
    if match is None:
        raise ValueError(f"bad fake GPU spec token {token!r}: expected [COUNTx]MODEL[-NGB], e.g. '8xH100-80GB'")
    count = int(match["count"]) if match["count"] is not None else 1
    if not 1 <= count <= MAX_GPUS_PER_TOKEN:
        raise ValueError(f"bad fake GPU spec token {token!r}: count must be 1..{MAX_GPUS_PER_TOKEN}")
    model = match["model"]
    if match["gib"] is not None:
        memory_mib = int(match["gib"]) * GIB
        if memory_mib <= 0:
            raise ValueError(f"bad fake GPU spec token {token!r}: memory must be positive")
    elif model.upper() in DEFAULT_MEMORY_MIB:
        memory_mib = DEFAULT_MEMORY_MIB[model.upper()]
    else:
        raise ValueError(f"bad fake GPU spec token {token!r}: unknown model {model!r}, write it as {model}-<N>GB")
    return FakeGpuGroup(count=count, model=model, memory_mib=memory_mib)


def fake_uuid(node: str, index: int) -> str:
    """The deterministic UUID of fake GPU `index` on `node`: "GPU-fake-" + uuid5(node/index)."""
    return f"GPU-fake-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


ScriptValues = Sequence[int] | Callable[[float], int]


@dataclass(frozen=True)
class FakeTelemetryScript:
    """Utilization and memory use of one fake GPU as a function of seconds since the discovery started.

    Each of `utilization_pct` and `memory_used_mib` is either a callable of elapsed seconds or a list read one
    element per `step_s` seconds, holding its last element forever after.
    """

    utilization_pct: ScriptValues = (0,)
    memory_used_mib: ScriptValues = (0,)
    step_s: float = 1.0

    def __post_init__(self) -> None:
        if self.step_s <= 0:
            raise ValueError("step_s must be positive")
        for values in (self.utilization_pct, self.memory_used_mib):
            if not callable(values) and len(values) == 0:
                raise ValueError("a scripted value list must not be empty")

    def sample(self, elapsed_s: float) -> tuple[int, int]:
        """(utilization_pct, memory_used_mib) at `elapsed_s` (negative times read as 0)."""
        at = max(0.0, elapsed_s)
        return self._value(self.utilization_pct, at), self._value(self.memory_used_mib, at)

    def _value(self, values: ScriptValues, at: float) -> int:
        if callable(values):
            return int(values(at))
        return int(values[min(int(at // self.step_s), len(values) - 1)])


@dataclass
class _GpuState:
    """Mutable run-time state of one fake GPU."""

    script: FakeTelemetryScript
    pinned_utilization: int | None = None
    pinned_memory_mib: int | None = None
    pending_xids: list[int] = field(default_factory=list)
    healthy: bool = True


class FakeDiscovery(DeviceDiscovery):
    """Fake GPUs from a spec string, with scripted telemetry. Deterministic given `node`, `spec` and `clock`.

    `numa_nodes` > 0 spreads the GPUs evenly over that many NUMA nodes (in index order); `nvlink_groups` makes
    the GPUs of one spec token NVLink peers of each other (like the GPUs of one HGX board).
    """

    def __init__(
        self,
        spec: str,
        *,
        node: str = "fake-node",
        clock: Clock | None = None,
        scripts: Mapping[int, FakeTelemetryScript] | None = None,
        numa_nodes: int = 0,
        nvlink_groups: bool = False,
    ) -> None:
        self._clock = clock if clock is not None else MonotonicClock()
        self._started_at = self._clock.now()
        self._devices = _build_devices(parse_fake_spec(spec), node, numa_nodes, nvlink_groups)
        self._states = [_GpuState(script=FakeTelemetryScript()) for _ in self._devices]
        self._closed = False
        for index, script in (scripts or {}).items():
            self.set_script(index, script)

    def list_devices(self) -> list[GpuInfo]:
        self._check_open()
        return list(self._devices)

    def telemetry(self) -> list[GpuTelemetry]:
        """One sample per GPU: pinned values win over the script; injected Xids are reported once."""
        self._check_open()
        elapsed_s = self._clock.now() - self._started_at
        return [self._sample(gpu, state, elapsed_s) for gpu, state in zip(self._devices, self._states, strict=True)]

    def close(self) -> None:
        self._closed = True

    def set_script(self, index: int, script: FakeTelemetryScript) -> None:
        """Drive GPU `index` from `script` (pins set with `set_utilization` still win)."""
        self._state(index).script = script

    def set_utilization(self, index: int, utilization_pct: int, memory_used_mib: int | None = None) -> None:
        """Pin GPU `index` at `utilization_pct` (and `memory_used_mib` when given) until `unpin(index)`."""
        if not 0 <= utilization_pct <= 100:
            raise ValueError(f"utilization_pct must be 0..100, got {utilization_pct}")
        state = self._state(index)
        state.pinned_utilization = utilization_pct
        state.pinned_memory_mib = memory_used_mib

    def unpin(self, index: int) -> None:
        """Return GPU `index` to its script."""
        state = self._state(index)
        state.pinned_utilization = state.pinned_memory_mib = None

    def inject_xid(self, index: int, xid: int) -> None:
        """Report Xid `xid` on GPU `index` in the next sample; a fatal Xid also makes it unhealthy until repaired."""
        if xid < 0:
            raise ValueError(f"an Xid is a non-negative code, got {xid}")
        self._state(index).pending_xids.append(xid)

    def set_healthy(self, index: int, healthy: bool) -> None:
        """Mark GPU `index` failed or repaired."""
        self._state(index).healthy = healthy

    def _sample(self, gpu: GpuInfo, state: _GpuState, elapsed_s: float) -> GpuTelemetry:
        utilization, memory_used = state.script.sample(elapsed_s)
        if state.pinned_utilization is not None:
            utilization = state.pinned_utilization
        if state.pinned_memory_mib is not None:
            memory_used = state.pinned_memory_mib
        if not 0 <= memory_used <= gpu.memory_mib:
            raise ValueError(f"fake GPU {gpu.index}: memory_used_mib {memory_used} outside 0..{gpu.memory_mib}")
        xids, state.pending_xids = state.pending_xids, []
        state.healthy = state.healthy and is_healthy_after(xids, 0)
        return GpuTelemetry(
            uuid=gpu.uuid,
            utilization_pct=utilization,
            memory_used_mib=memory_used,
            temperature_c=30 + utilization // 2,
            power_w=50 + 6 * utilization,
            xid_errors=xids,
            healthy=state.healthy,
        )

    def _state(self, index: int) -> _GpuState:
        self._check_open()
        if not 0 <= index < len(self._states):
            raise IndexError(f"no fake GPU with index {index}: this node has {len(self._states)}")
        return self._states[index]

    def _check_open(self) -> None:
        if self._closed:
            raise DiscoveryError("FakeDiscovery used after close()")


def _build_devices(groups: list[FakeGpuGroup], node: str, numa_nodes: int, nvlink_groups: bool) -> list[GpuInfo]:
    if numa_nodes < 0:
        raise ValueError("numa_nodes must be >= 0")
    total = sum(group.count for group in groups)
    devices: list[GpuInfo] = []
    for group in groups:
        first = len(devices)
        uuids = [fake_uuid(node, first + offset) for offset in range(group.count)]
        for offset, gpu_uuid in enumerate(uuids):
            index = first + offset
            devices.append(
                GpuInfo(
                    index=index,
                    uuid=gpu_uuid,
                    model=group.model,
                    memory_mib=group.memory_mib,
                    nvlink_peers=[peer for peer in uuids if peer != gpu_uuid] if nvlink_groups else [],
                    numa_node=index * numa_nodes // total if numa_nodes else None,
                    fake=True,
                )
            )
    return devices
