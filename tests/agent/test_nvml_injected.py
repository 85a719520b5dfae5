"""NvmlDiscovery in-process, on the pure-Python `FakePynvml`: error mapping, degradation, health and topology."""

from __future__ import annotations

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")

from fake_pynvml import FakeGpu, FakePynvml  # noqa: E402

from gpupool.agent.devices import DiscoveryError, NvmlDiscovery  # noqa: E402
from gpupool.agent.devices import nvml as nvml_module  # noqa: E402
from gpupool.agent.devices.nvlink import LinkEnds, link_peers, norm_bus_id  # noqa: E402

GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH


def gpu(i: int, **kw) -> FakeGpu:
    return FakeGpu(
        name=f"NVIDIA Fake {i}", uuid=f"GPU-{i}", memory_mib=1024 * (i + 1), bus_id=f"0000:{i:02X}:00.0", **kw
    )


def test_contract_every_fake_nvml_name_exists_in_pynvml():
    assert [a for a in vars(FakePynvml) if a.startswith("nvml") and not hasattr(pynvml, a)] == []


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_missing_library_or_driver_is_zero_gpus_with_a_reason(code, reason):
    discovery = NvmlDiscovery(FakePynvml([gpu(0)], init_error=code))
    assert discovery.unavailable_reason == reason
    assert discovery.list_devices() == [] and discovery.telemetry() == []
    assert discovery.driver_version is None
    discovery.close()


def test_other_init_errors_raise():
    with pytest.raises(DiscoveryError, match="Insufficient Permissions"):
        NvmlDiscovery(FakePynvml([gpu(0)], init_error=pynvml.NVML_ERROR_NO_PERMISSION))


def test_binding_not_installed_is_zero_gpus(monkeypatch):
    def no_pynvml():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml_module, "load_pynvml", no_pynvml)
    discovery = NvmlDiscovery()
    assert discovery.unavailable_reason == "nvidia-ml-py (pynvml) is not installed"
    assert discovery.list_devices() == [] and discovery.telemetry() == []


def test_bytes_names_and_uuids_from_old_bindings_are_decoded():
    fake = FakePynvml([FakeGpu(name=b"Tesla V100-SXM2-32GB", uuid=b"GPU-abc", memory_mib=32510)])
    (info,) = NvmlDiscovery(fake).list_devices()
    assert (info.model, info.uuid, info.memory_mib, info.fake) == ("Tesla V100-SXM2-32GB", "GPU-abc", 32510, False)


def test_function_not_found_and_absent_wrappers_degrade():
    fake = FakePynvml([gpu(0, numa_node=1)], absent=frozenset({"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetPciInfo"}))
    discovery = NvmlDiscovery(fake)  # no event functions defined: FunctionNotFound, so no Xid events
    (info,) = discovery.list_devices()
    assert info.numa_node is None and info.nvlink_peers == [] and not info.mig_enabled
    (sample,) = discovery.telemetry()
    assert (sample.utilization_pct, sample.temperature_c, sample.power_w, sample.ecc_uncorrected) == (0, None, None, 0)
    assert sample.healthy and sample.xid_errors == []


def test_telemetry_values_and_units():
    fake = FakePynvml([gpu(0, used_mib=512, utilization_pct=80, temperature_c=61, power_mw=299_600, ecc_uncorrected=0)])
    (sample,) = NvmlDiscovery(fake).telemetry()
    assert (sample.utilization_pct, sample.memory_used_mib, sample.temperature_c, sample.power_w) == (80, 512, 61, 300)
    assert sample.healthy


def test_uncorrected_ecc_makes_a_gpu_unhealthy():
    fake = FakePynvml([gpu(0, ecc_uncorrected=3), gpu(1, ecc_uncorrected=0)])
    samples = NvmlDiscovery(fake).telemetry()
    assert [s.healthy for s in samples] == [False, True]
    assert samples[0].ecc_uncorrected == 3


def test_lost_gpu_is_unhealthy_in_telemetry_and_stays_so():
    fake = FakePynvml([gpu(0), gpu(1)])
    discovery = NvmlDiscovery(fake)
    fake.gpus[1].lost = True
    assert [s.healthy for s in discovery.telemetry()] == [True, False]
    fake.gpus[1].lost = False
    assert [s.healthy for s in discovery.telemetry()] == [True, False]


def test_lost_gpu_makes_listing_raise():
    fake = FakePynvml([gpu(0, lost=True)])
    with pytest.raises(DiscoveryError, match="GPU is lost"):
        NvmlDiscovery(fake).list_devices()


def test_enumeration_failure_raises_and_shuts_nvml_down():
    fake = FakePynvml([FakeGpu(name="x", uuid="GPU-x", memory_mib=1)], absent=frozenset({"nvmlDeviceGetUUID"}))
    with pytest.raises(DiscoveryError, match="GPU 0 UUID"):
        NvmlDiscovery(fake)
    assert fake.shutdowns == 1


def test_close_is_idempotent_and_later_use_raises():
    fake = FakePynvml([gpu(0)])
    with NvmlDiscovery(fake) as discovery:
        pass
    discovery.close()
    assert fake.shutdowns == 1
    with pytest.raises(DiscoveryError):
        discovery.list_devices()
    with pytest.raises(DiscoveryError):
        discovery.telemetry()


def test_nvlink_direct_links_and_nvswitch_peers():
    fake = FakePynvml(
        [
            gpu(0, links=[(GPU, "00000000:01:00.0")]),  # 0-1 direct, reported by GPU 0 only
            gpu(1),
            gpu(2, links=[(SWITCH, "0000:C0:00.0"), (SWITCH, "0000:C1:00.0")]),
            gpu(3, links=[(SWITCH, "0000:C0:00.0")]),
            gpu(4, links=[(GPU, "0000:77:00.0")]),  # far end is not a GPU of this node
        ]
    )
    peers = [info.nvlink_peers for info in NvmlDiscovery(fake).list_devices()]
    assert peers == [["GPU-1"], ["GPU-0"], ["GPU-3"], ["GPU-2"], []]


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("00000000:1A:00.0", "00000000:1a:00.0"),
        ("0000:1a:00.0", "00000000:1a:00.0"),
        (" 0001:02:1F.3 ", "00000001:02:1f.3"),
        ("not-a-bus-id", "not-a-bus-id"),
        ("", ""),
    ],
)
def test_norm_bus_id(raw, want):
    assert norm_bus_id(raw) == want


def test_link_peers_without_own_bus_id_uses_the_other_end():
    ends = [LinkEnds(frozenset({"b"})), LinkEnds(), LinkEnds(frozenset({"zz"}))]
    assert link_peers(["u0", "u1", "u2"], [None, "b", None], ends) == [["u1"], ["u0"], []]
