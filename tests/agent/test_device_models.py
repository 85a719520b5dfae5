"""gpupool.protocol.devices: the wire models validate ranges, reject unknown fields and are frozen."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpupool.protocol.devices import GpuInfo, GpuTelemetry, MigInstance

GPU = {"index": 0, "uuid": "GPU-a", "model": "H100", "memory_mib": 81920}
SAMPLE = {"uuid": "GPU-a", "utilization_pct": 50, "memory_used_mib": 10}
MIG = {"uuid": "MIG-a", "profile": "1g.10gb", "memory_mib": 9984, "gpu_instance_id": 9}


def test_defaults_and_json_round_trip():
    info = GpuInfo(**GPU, mig_enabled=True, mig_instances=[MigInstance(**MIG)], nvlink_peers=["GPU-b"], numa_node=1)
    assert GpuInfo.model_validate_json(info.model_dump_json()) == info
    bare = GpuInfo(**GPU)
    assert (bare.mig_enabled, bare.mig_instances, bare.nvlink_peers, bare.numa_node, bare.fake) == (
        False,
        [],
        [],
        None,
        False,
    )
    sample = GpuTelemetry(**SAMPLE)
    assert (sample.temperature_c, sample.power_w, sample.ecc_uncorrected, sample.xid_errors, sample.healthy) == (
        None,
        None,
        0,
        [],
        True,
    )


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        (GpuInfo, {**GPU, "index": -1}),
        (GpuInfo, {**GPU, "uuid": ""}),
        (GpuInfo, {**GPU, "memory_mib": 0}),
        (GpuInfo, {**GPU, "numa_node": -1}),
        (GpuInfo, {**GPU, "vendor": "nvidia"}),
        (GpuInfo, {**GPU, "mig_instances": [MIG]}),  # MIG instances without MIG mode
        (GpuInfo, {**GPU, "mig_enabled": True, "mig_instances": [MIG, MIG]}),
        (GpuInfo, {**GPU, "nvlink_peers": ["GPU-a"]}),
        (GpuInfo, {**GPU, "nvlink_peers": ["GPU-b", "GPU-b"]}),
        (MigInstance, {**MIG, "memory_mib": 0}),
        (MigInstance, {**MIG, "gpu_instance_id": -1}),
        (MigInstance, {**MIG, "profile": ""}),
        (GpuTelemetry, {**SAMPLE, "utilization_pct": 101}),
        (GpuTelemetry, {**SAMPLE, "utilization_pct": -1}),
        (GpuTelemetry, {**SAMPLE, "memory_used_mib": -1}),
        (GpuTelemetry, {**SAMPLE, "power_w": -5}),
        (GpuTelemetry, {**SAMPLE, "temperature_c": 500}),
        (GpuTelemetry, {**SAMPLE, "ecc_uncorrected": -1}),
        (GpuTelemetry, {**SAMPLE, "xid_errors": [-1]}),
        (GpuTelemetry, {**SAMPLE, "utilization": 5}),
    ],
)
def test_invalid_values_are_rejected(model, fields):
    with pytest.raises(ValidationError):
        model(**fields)


def test_models_are_frozen():
    info = GpuInfo(**GPU)
    with pytest.raises(ValidationError):
        info.memory_mib = 1
