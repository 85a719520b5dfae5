"""FakeDiscovery: spec parsing, deterministic UUIDs, scripted telemetry, run-time pins and injected faults."""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.devices import (
    DEFAULT_MEMORY_MIB,
    DeviceDiscovery,
    DiscoveryError,
    FakeDiscovery,
    FakeGpuGroup,
    FakeTelemetryScript,
    fake_uuid,
    open_discovery,
    parse_fake_spec,
)
from gpupool.core.clock import FixedClock


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("8xH100-80GB", [FakeGpuGroup(8, "H100", 81920)]),
        ("8xH100-80GB,2xA100-40GB", [FakeGpuGroup(8, "H100", 81920), FakeGpuGroup(2, "A100", 40960)]),
        ("T4", [FakeGpuGroup(1, "T4", 16384)]),
        ("2xT4", [FakeGpuGroup(2, "T4", 16384)]),
        ("h100", [FakeGpuGroup(1, "h100", 81920)]),
        ("H200-141gb", [FakeGpuGroup(1, "H200", 141 * 1024)]),
        (" 4xL40S , A10G ", [FakeGpuGroup(4, "L40S", 48 * 1024), FakeGpuGroup(1, "A10G", 24 * 1024)]),
        ("1xMyGpu-12GB", [FakeGpuGroup(1, "MyGpu", 12 * 1024)]),
        ("", []),
        ("   ", []),
    ],
)
def test_parse_spec(spec, want):
    assert parse_fake_spec(spec) == want


@pytest.mark.parametrize(
    ("spec", "bad"),
    [
        ("8xH100-80GB,,T4", "''"),
        ("0xH100", "'0xH100'"),
        ("257xT4", "'257xT4'"),
        ("8x", "'8x'"),
        ("x100", "'x100'"),
        ("8*H100", "'8*H100'"),
        ("H100-80", "'H100-80'"),
        ("H100-80MB", "'H100-80MB'"),
        ("H100-0GB", "'H100-0GB'"),
        ("H100-80GB-SXM", "'H100-80GB-SXM'"),
        ("8xX9000", "'8xX9000'"),
        ("T4,-1xT4", "'-1xT4'"),
    ],
)
def test_malformed_spec_names_the_bad_token(spec, bad):
    with pytest.raises(ValueError, match=re.escape(f"token {bad}")):
        parse_fake_spec(spec)


def test_bare_model_memory_comes_from_the_default_table():
    assert DEFAULT_MEMORY_MIB["T4"] == 16 * 1024
    assert all(mib > 0 and mib % 1024 == 0 for mib in DEFAULT_MEMORY_MIB.values())


@given(st.lists(st.tuples(st.integers(1, 16), st.sampled_from(sorted(DEFAULT_MEMORY_MIB)), st.integers(1, 200))))
def test_well_formed_specs_round_trip(groups):
    spec = ",".join(f"{count}x{model}-{gib}GB" for count, model, gib in groups)
    assert parse_fake_spec(spec) == [FakeGpuGroup(c, m, g * 1024) for c, m, g in groups]


def test_devices_are_labelled_fake_and_indexed_in_spec_order():
    devices = FakeDiscovery("2xH100-80GB,T4").list_devices()
    assert [(d.index, d.model, d.memory_mib, d.fake) for d in devices] == [
        (0, "H100", 81920, True),
        (1, "H100", 81920, True),
        (2, "T4", 16384, True),
    ]
    assert all(not d.mig_enabled and d.nvlink_peers == [] and d.numa_node is None for d in devices)


def test_uuids_are_deterministic_per_node_and_index():
    first = [d.uuid for d in FakeDiscovery("3xT4", node="node-a").list_devices()]
    again = [d.uuid for d in FakeDiscovery("3xT4", node="node-a").list_devices()]
    other = [d.uuid for d in FakeDiscovery("3xT4", node="node-b").list_devices()]
    assert first == again == [fake_uuid("node-a", i) for i in range(3)]
    assert len(set(first + other)) == 6
    assert all(u.startswith("GPU-fake-") for u in first)
    assert uuid.UUID(first[0].removeprefix("GPU-fake-")).version == 5


def test_numa_spread_and_nvlink_groups():
    devices = FakeDiscovery("4xH100,2xT4", numa_nodes=2, nvlink_groups=True).list_devices()
    assert [d.numa_node for d in devices] == [0, 0, 0, 1, 1, 1]
    h100s, t4s = [d.uuid for d in devices[:4]], [d.uuid for d in devices[4:]]
    assert devices[0].nvlink_peers == h100s[1:]
    assert devices[5].nvlink_peers == t4s[:1]


def test_default_telemetry_is_idle_and_healthy():
    samples = FakeDiscovery("2xT4").telemetry()
    assert [(s.utilization_pct, s.memory_used_mib, s.healthy, s.xid_errors) for s in samples] == [(0, 0, True, [])] * 2


def test_list_script_steps_with_the_injected_clock_and_holds_its_last_value():
    clock = FixedClock(100.0)
    script = FakeTelemetryScript(utilization_pct=[0, 50, 100], memory_used_mib=[0, 1024], step_s=10)
    discovery = FakeDiscovery("T4", clock=clock, scripts={0: script})
    seen = []
    for _ in range(4):
        (sample,) = discovery.telemetry()
        seen.append((sample.utilization_pct, sample.memory_used_mib))
        clock.advance(10)
    assert seen == [(0, 0), (50, 1024), (100, 1024), (100, 1024)]


def test_callable_script_reads_elapsed_seconds():
    clock = FixedClock(5.0)
    script = FakeTelemetryScript(utilization_pct=lambda t: min(100, int(t)), memory_used_mib=lambda t: 100 * int(t))
    discovery = FakeDiscovery("H100,T4", clock=clock, scripts={1: script})
    clock.advance(42.5)
    idle, busy = discovery.telemetry()
    assert (idle.utilization_pct, busy.utilization_pct, busy.memory_used_mib) == (0, 42, 4200)
    assert script.sample(-3) == (0, 0)


def test_pins_win_over_scripts_until_unpinned():
    clock = FixedClock()
    discovery = FakeDiscovery("2xT4", clock=clock, scripts={0: FakeTelemetryScript(utilization_pct=[90])})
    discovery.set_utilization(0, 0)
    discovery.set_utilization(1, 100, memory_used_mib=2048)
    assert [(s.utilization_pct, s.memory_used_mib) for s in discovery.telemetry()] == [(0, 0), (100, 2048)]
    discovery.unpin(0)
    discovery.set_script(1, FakeTelemetryScript(utilization_pct=[7]))
    assert [s.utilization_pct for s in discovery.telemetry()] == [90, 100]
    discovery.unpin(1)
    assert [s.utilization_pct for s in discovery.telemetry()] == [90, 7]


def test_bad_values_are_rejected():
    discovery = FakeDiscovery("T4")
    with pytest.raises(ValueError):
        discovery.set_utilization(0, 101)
    with pytest.raises(IndexError, match="index 1"):
        discovery.set_utilization(1, 5)
    discovery.set_utilization(0, 5, memory_used_mib=16385)
    with pytest.raises(ValueError, match="memory_used_mib"):
        discovery.telemetry()
    with pytest.raises(ValueError):
        FakeTelemetryScript(utilization_pct=[])
    with pytest.raises(ValueError):
        FakeTelemetryScript(step_s=0)
    with pytest.raises(ValueError):
        FakeDiscovery("T4", numa_nodes=-1)


def test_injected_xids_are_reported_once_and_fatal_ones_stick():
    discovery = FakeDiscovery("3xT4")
    discovery.inject_xid(0, 13)
    discovery.inject_xid(1, 79)
    discovery.inject_xid(1, 31)
    first = discovery.telemetry()
    assert [(s.xid_errors, s.healthy) for s in first] == [([13], True), ([79, 31], False), ([], True)]
    second = discovery.telemetry()
    assert [(s.xid_errors, s.healthy) for s in second] == [([], True), ([], False), ([], True)]
    discovery.set_healthy(1, True)
    discovery.set_healthy(2, False)
    assert [s.healthy for s in discovery.telemetry()] == [True, True, False]


def test_close_then_use_raises():
    with FakeDiscovery("T4") as discovery:
        assert isinstance(discovery, DeviceDiscovery)
        assert discovery.unavailable_reason is None
    discovery.close()
    with pytest.raises(DiscoveryError):
        discovery.list_devices()
    with pytest.raises(DiscoveryError):
        discovery.set_utilization(0, 1)


def test_open_discovery_picks_the_fake_for_a_spec():
    discovery = open_discovery("2xA100", node="n1")
    assert isinstance(discovery, FakeDiscovery)
    assert [d.uuid for d in discovery.list_devices()] == [fake_uuid("n1", 0), fake_uuid("n1", 1)]
    assert open_discovery("").list_devices() == []
