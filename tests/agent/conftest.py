"""Agent test fixtures: the C fake NVML library, built once per session, and a runner for the NVML probe.

The probe (`python -m gpupool.agent.devices.nvml`) runs in a NEW process because pynvml caches the loaded library
in a module global, and LD_LIBRARY_PATH is read by the dynamic loader at process start.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.devtools import jobdirs

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML_SOURCE = Path(__file__).resolve().parent / "fake_nvml" / "fake_nvml.c"

NvmlProbe = Callable[..., dict[str, Any]]


def real_nvml_installed() -> bool:
    """True when this machine has a real libnvidia-ml.so.1 (a GPU machine): the no-library test cannot run there."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake libnvidia-ml.so.1 compiled from tests/agent/fake_nvml/fake_nvml.c."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed; the NVML tests drive the real pynvml")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: cannot build the fake libnvidia-ml.so.1 for the NVML tests")
    out = tmp_path_factory.mktemp("fake_nvml")
    command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out / "libnvidia-ml.so.1"), str(FAKE_NVML_SOURCE)]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    assert built.returncode == 0, f"building the fake NVML library failed:\n{built.stderr}"
    return out


def _probe(library_dir: Path | None, env: dict[str, str]) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_") and k != "LD_LIBRARY_PATH"}
    if library_dir is not None:
        base["LD_LIBRARY_PATH"] = str(library_dir)
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.agent.devices.nvml"],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), f"probe crashed (rc={done.returncode}):\n{done.stderr}"
    assert done.stderr == "", done.stderr
    report = json.loads(done.stdout)
    report["returncode"] = done.returncode
    return report


@pytest.fixture
def nvml_probe(fake_nvml_dir: Path) -> NvmlProbe:
    """Run the NVML probe on the fake library: `nvml_probe(FAKE_NVML_GPUS="name:MiB,...", ...)` -> its JSON."""

    def run(**env: str) -> dict[str, Any]:
        return _probe(fake_nvml_dir, env)

    return run


@pytest.fixture
def nvml_probe_without_library(tmp_path: Path) -> NvmlProbe:
    """Run the NVML probe where no libnvidia-ml.so.1 can be found."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    if real_nvml_installed():
        pytest.skip("a real libnvidia-ml.so.1 is installed on this machine")

    def run(**env: str) -> dict[str, Any]:
        return _probe(tmp_path, env)

    return run


@pytest.fixture
def job_root() -> Iterator[Path]:
    """A folder that jobs running as transient uids can pass through (pytest's own are 0700), e.g. for work roots."""
    with jobdirs.open_folder() as folder:
        yield folder
