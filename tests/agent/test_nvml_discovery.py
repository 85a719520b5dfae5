"""The real `gpupool.agent.devices.nvml` code and the real pynvml, in a subprocess, on the C fake libnvidia-ml.so.1.

Each test configures the fake through FAKE_NVML_* variables (see tests/agent/fake_nvml/fake_nvml.c) and checks the
JSON the probe prints.
"""

from __future__ import annotations

import subprocess
import sys

H100 = "NVIDIA H100 80GB HBM3:81559"
A100 = "NVIDIA A100-SXM4-40GB:40960"
T4 = "Tesla T4:15360"


def test_lists_gpus_with_names_memory_and_uuids(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=f"{H100},{A100}")
    assert report["available"] is True and report["reason"] is None and report["returncode"] == 0
    assert report["driver_version"] == "550.00.fake"
    devices = report["devices"]
    assert [(d["index"], d["model"], d["memory_mib"]) for d in devices] == [
        (0, "NVIDIA H100 80GB HBM3", 81559),
        (1, "NVIDIA A100-SXM4-40GB", 40960),
    ]
    assert [d["uuid"] for d in devices] == [f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(2)]
    assert all(d["fake"] is False and d["mig_enabled"] is False and d["nvlink_peers"] == [] for d in devices)
    assert [d["numa_node"] for d in devices] == [0, 1]
    assert [t["uuid"] for t in report["telemetry"]] == [d["uuid"] for d in devices]


def test_library_present_but_no_gpu(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS="")
    assert (report["available"], report["devices"], report["telemetry"]) == (True, [], [])


def test_not_supported_device_degrades_gracefully(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=f"{H100},{T4}", FAKE_NVML_NOT_SUPPORTED="1", FAKE_NVML_UTIL="10,50")
    supported, unsupported = report["telemetry"]
    assert (supported["temperature_c"], supported["power_w"], supported["utilization_pct"]) == (40, 100, 10)
    assert unsupported["temperature_c"] is None and unsupported["power_w"] is None
    assert (unsupported["utilization_pct"], unsupported["ecc_uncorrected"], unsupported["healthy"]) == (0, 0, True)
    assert unsupported["memory_used_mib"] == ((15360 << 20) // 100 * 50) >> 20  # memory is mandatory, still read
    t4 = report["devices"][1]
    assert (t4["model"], t4["numa_node"], t4["mig_enabled"], t4["nvlink_peers"]) == ("Tesla T4", None, False, [])


def test_telemetry_readings(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=f"{H100},{H100}", FAKE_NVML_UTIL="37,0", FAKE_NVML_ECC="0,2")
    busy, broken = report["telemetry"]
    assert busy == {
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "utilization_pct": 37,
        "memory_used_mib": ((81559 << 20) // 100 * 37) >> 20,
        "temperature_c": 40,
        "power_w": 181,  # 181.4 W in milliwatts, rounded
        "ecc_uncorrected": 0,
        "xid_errors": [],
        "healthy": True,
    }
    assert (broken["ecc_uncorrected"], broken["healthy"]) == (2, False)


def test_mig_instances(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=f"{A100},{H100},{H100}", FAKE_NVML_MIG="0=1g.5gb+3g.20gb,2=")
    mig, plain, empty = report["devices"]
    assert mig["mig_enabled"] is True
    assert [(m["profile"], m["memory_mib"], m["gpu_instance_id"]) for m in mig["mig_instances"]] == [
        ("1g.5gb", 5 * 1024, 1),
        ("3g.20gb", 20 * 1024, 3),
    ]
    assert all(m["uuid"].startswith("MIG-") for m in mig["mig_instances"])
    assert (plain["mig_enabled"], plain["mig_instances"]) == (False, [])
    assert (empty["mig_enabled"], empty["mig_instances"]) == (True, [])


def test_nvlink_pairs_and_nvswitch(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=",".join([H100] * 5), FAKE_NVML_NVLINK="0-1", FAKE_NVML_NVSWITCH="2,3,4")
    uuids = [d["uuid"] for d in report["devices"]]
    assert [d["nvlink_peers"] for d in report["devices"]] == [
        [uuids[1]],
        [uuids[0]],
        [uuids[3], uuids[4]],
        [uuids[2], uuids[4]],
        [uuids[2], uuids[3]],
    ]


def test_xid_events_fatal_and_not(nvml_probe):
    report = nvml_probe(
        FAKE_NVML_GPUS=f"{H100},{H100},{H100}", FAKE_NVML_XID="0:13,1:79,1:31,2:48", FAKE_NVML_NOT_SUPPORTED="2"
    )
    app_fault, fallen_off_bus, no_events = report["telemetry"]
    assert (app_fault["xid_errors"], app_fault["healthy"]) == ([13], True)
    assert (fallen_off_bus["xid_errors"], fallen_off_bus["healthy"]) == ([79, 31], False)
    assert (no_events["xid_errors"], no_events["healthy"]) == ([], True)  # events unsupported on GPU 2


def test_driver_not_loaded_is_zero_gpus(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=H100, FAKE_NVML_DRIVER_NOT_LOADED="1")
    assert (report["available"], report["reason"], report["devices"]) == (False, "Driver Not Loaded", [])


def test_lost_gpu_fails_the_listing_with_a_clear_error(nvml_probe):
    report = nvml_probe(FAKE_NVML_GPUS=f"{H100},{H100}", FAKE_NVML_LOST="1")
    assert report["returncode"] == 1 and report["available"] is False
    assert "GPU 1 memory" in report["error"] and "GPU is lost" in report["error"]


def test_no_library_is_zero_gpus(nvml_probe_without_library):
    report = nvml_probe_without_library(FAKE_NVML_GPUS=H100)
    assert report == {
        "available": False,
        "reason": "NVML Shared Library Not Found",
        "driver_version": None,
        "devices": [],
        "telemetry": [],
        "returncode": 0,
    }


def test_importing_the_agent_loads_neither_pynvml_nor_other_gpupool_layers():
    code = (
        "import sys, gpupool.agent, gpupool.agent.devices, gpupool.agent.devices.nvml\n"
        "print('pynvml' in sys.modules)\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpupool.')"
        " and not m.startswith(('gpupool.agent', 'gpupool.protocol'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["False", "[]"]
