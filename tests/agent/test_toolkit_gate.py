"""The container-toolkit gate (RELIABILITY.md §3.2 S8, CPU tier): a node vouches for running any tenant's image
(`untrusted_images`) only with a container runtime and an NVIDIA Container Toolkit of at least 1.17.8
(CVE-2025-23266), or, without the toolkit, only when no real GPU could be handed to a container. A fake
`nvidia-ctk` script on PATH stands in for the real one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpupool.agent import toolkit
from gpupool.agent.devices import FakeDiscovery
from gpupool.agent.main import build_registration
from gpupool.protocol.devices import GpuInfo

REAL_GPU = GpuInfo(index=0, uuid="GPU-1", model="H100", memory_mib=81_559)
FAKE_GPU = GpuInfo(index=0, uuid="GPU-fake-1", model="H100", memory_mib=81_559, fake=True)


def fake_ctk(folder: Path, output: str, exit_code: int = 0) -> Path:
    """An `nvidia-ctk` in `folder` that prints `output` for --version."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-ctk"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(("output", "want"), [
    ("NVIDIA Container Toolkit CLI version 1.17.7\ncommit: 0123abc", (1, 17, 7, False)),
    ("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80", (1, 17, 8, False)),
    ("NVIDIA Container Toolkit CLI version v1.18.0-rc.2", (1, 18, 0, True)),
    ("nvidia-ctk: unknown flag", None),
], ids=["1.17.7", "1.17.8", "rc", "garbage"])
def test_the_version_is_read_from_nvidia_ctk(tmp_path: Path, output: str, want: tuple[int, int, int, bool] | None):
    assert toolkit.ctk_version(str(fake_ctk(tmp_path, output))) == want


@pytest.mark.parametrize(("version", "trusted"), [
    ("1.17.7", False), ("1.17.8", True), ("1.18.0", True), ("2.0.0", True), ("1.9.99", False),
    ("1.17.8-rc.1", False), ("1.17.9-rc.1", True),
])
def test_below_1_17_8_no_untrusted_image_runs_on_the_node(tmp_path: Path, version: str, trusted: bool):
    ctk = fake_ctk(tmp_path, f"NVIDIA Container Toolkit CLI version {version}")
    assert toolkit.untrusted_images(podman="/usr/bin/podman", ctk=str(ctk), gpus=[REAL_GPU]) is trusted


def test_without_the_toolkit_only_gpu_less_or_fake_gpu_nodes_with_podman_vouch():
    """No nvidia-ctk: no NVIDIA hook runs in a container, so CVE-2025-23266 cannot apply; but a real GPU's
    devices could then only reach a container by hand, which gpupool does not vouch for."""
    assert toolkit.untrusted_images(podman="/usr/bin/podman", ctk=None, gpus=[]) is True
    assert toolkit.untrusted_images(podman="/usr/bin/podman", ctk=None, gpus=[FAKE_GPU]) is True
    assert toolkit.untrusted_images(podman="/usr/bin/podman", ctk=None, gpus=[FAKE_GPU, REAL_GPU]) is False
    assert toolkit.untrusted_images(podman=None, ctk=None, gpus=[]) is False, "no runtime, no images"


def test_a_failing_or_hanging_nvidia_ctk_means_no(tmp_path: Path):
    failing = fake_ctk(tmp_path / "a", "NVIDIA Container Toolkit CLI version 1.18.0", exit_code=1)
    assert toolkit.untrusted_images(podman="/usr/bin/podman", ctk=str(failing), gpus=[REAL_GPU]) is False
    hanging = tmp_path / "b" / "nvidia-ctk"
    hanging.parent.mkdir()
    hanging.write_text("#!/bin/sh\nexec sleep 30\n")
    hanging.chmod(0o755)
    assert toolkit.ctk_version(str(hanging), timeout_s=0.5) is None


def test_the_registration_carries_the_verdict_of_the_nvidia_ctk_on_path(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch, s8):
    with s8.case("toolkit_gate_agent"):
        bin_dir = tmp_path / "bin"
        fake_ctk(bin_dir, "NVIDIA Container Toolkit CLI version 1.17.7")
        podman = bin_dir / "podman"
        podman.write_text("#!/bin/sh\nexit 0\n")
        podman.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        discovery = FakeDiscovery("2xH100", node="n1")
        assert build_registration("abcdef.0123456789abcdef", "n1", "boot", discovery).untrusted_images is False
        fake_ctk(bin_dir, "NVIDIA Container Toolkit CLI version 1.17.8")
        assert build_registration("abcdef.0123456789abcdef", "n1", "boot", discovery).untrusted_images is True
