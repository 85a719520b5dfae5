"""Wire types for GPU inventory and telemetry, shared by the node agent and the control plane.

Every amount is an integer with its unit in the name (`memory_mib`, `power_w`). The models are frozen and reject
unknown fields, so a typo on either side of the wire fails loudly instead of being dropped.

`GpuInfo` is what a node *has* (sent at registration and when the inventory changes); `GpuTelemetry` is what a
GPU is *doing* (sent with heartbeats). Both carry the GPU UUID, which is the stable identity across restarts;
`index` is only the NVML enumeration order on the node.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Bounds of what an agent reports (untrusted input, RELIABILITY.md §3.2 S11): far past any real device, within
#: the database's columns (a GPU UUID fits String(96), a model String(64)).
MAX_MIB = 1 << 24  # 16 TiB
MAX_INDEX = 1023
MAX_COUNT = (1 << 31) - 1
Uuid = Annotated[str, Field(min_length=1, max_length=96)]
XidCode = Annotated[int, Field(ge=0, le=65_535)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigInstance(_Frozen):
    """One MIG device (a GPU instance with its compute instance) carved out of a physical GPU.

    `profile` is the NVML/nvidia-smi profile name such as "1g.10gb"; `memory_mib` is the usable memory NVML
    reports for the instance (slightly below the profile's nominal size).
    """

    uuid: Uuid
    profile: str = Field(min_length=1, max_length=64)
    memory_mib: int = Field(ge=1, le=MAX_MIB)
    gpu_instance_id: int = Field(ge=0, le=MAX_INDEX)


class GpuInfo(_Frozen):
    """Static description of one physical GPU on a node.

    Contract: `mig_instances` is empty unless `mig_enabled`; MIG and NVLink-peer UUIDs are unique and never the
    GPU's own UUID. `fake` is True only for GPUs made up by `FakeDiscovery` (tests, GPU-less CI, demos); the
    control plane may refuse fake GPUs outside of test deployments.
    """

    index: int = Field(ge=0, le=MAX_INDEX)
    uuid: Uuid
    model: str = Field(min_length=1, max_length=64)
    memory_mib: int = Field(ge=1, le=MAX_MIB)
    mig_enabled: bool = False
    mig_instances: list[MigInstance] = Field(default_factory=list, max_length=16)
    nvlink_peers: list[Uuid] = Field(default_factory=list, max_length=64)
    numa_node: int | None = Field(default=None, ge=0, le=MAX_INDEX)
    fake: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> GpuInfo:
        if self.mig_instances and not self.mig_enabled:
            raise ValueError("mig_instances given but mig_enabled is False")
        mig_uuids = [m.uuid for m in self.mig_instances]
        if len(set(mig_uuids)) != len(mig_uuids):
            raise ValueError("duplicate MIG instance UUIDs")
        if len(set(self.nvlink_peers)) != len(self.nvlink_peers):
            raise ValueError("duplicate NVLink peer UUIDs")
        if self.uuid in self.nvlink_peers or self.uuid in mig_uuids:
            raise ValueError("a GPU cannot list its own UUID as an NVLink peer or MIG instance")
        return self


class GpuTelemetry(_Frozen):
    """One sample of what a physical GPU is doing.

    `utilization_pct` and `ecc_uncorrected` are 0 when the device cannot report them (for example utilization
    on a MIG-enabled GPU); `temperature_c` and `power_w` are None in that case. `xid_errors` lists the Xid codes
    observed since the previous sample. `healthy` is the agent's verdict: False after a GPU-fatal Xid, an
    uncorrected ECC error, or a failed mandatory query.
    """

    uuid: Uuid
    utilization_pct: int = Field(ge=0, le=100)
    memory_used_mib: int = Field(ge=0, le=MAX_MIB)
    temperature_c: int | None = Field(default=None, ge=-100, le=200)
    power_w: int | None = Field(default=None, ge=0, le=100_000)
    ecc_uncorrected: int = Field(default=0, ge=0, le=MAX_COUNT)
    xid_errors: list[XidCode] = Field(default_factory=list, max_length=64)
    healthy: bool = True
