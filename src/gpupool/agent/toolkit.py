"""Whether this node may run any tenant's container image: the `untrusted_images` it reports at registration.

NVIDIA Container Toolkit releases before 1.17.8 let a crafted image escape to the host through the toolkit's
createContainer hook (CVE-2025-23266, "NVIDIAScape"). The verdict, in order:

1. no container runtime (podman): False, the node cannot run images at all;
2. `nvidia-ctk` installed: True exactly when `nvidia-ctk --version` reports 1.17.8 or later (a pre-release of
   1.17.8 is below it); a failing, hanging or unreadable `nvidia-ctk` means False;
3. no `nvidia-ctk`: no NVIDIA hook runs in a container, so the CVE cannot apply, but neither can a real GPU reach
   one the way gpupool hands GPUs over: True only when every GPU is fake (or there is none), as on test and
   GPU-less nodes.

The control plane places jobs with an image only on nodes that reported True.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from gpupool.protocol.devices import GpuInfo

MIN_VERSION = (1, 17, 8)
VERSION = re.compile(r"version\s+v?(\d+)\.(\d+)\.(\d+)(-\S+)?")
TIMEOUT_S = 5.0


def ctk_path() -> str | None:
    """The `nvidia-ctk` executable on PATH, or None."""
    return shutil.which("nvidia-ctk")


def ctk_version(ctk: str, timeout_s: float = TIMEOUT_S) -> tuple[int, int, int, bool] | None:
    """(major, minor, patch, is_prerelease) from `ctk --version`; None when it fails, hangs or says no version."""
    try:
        done = subprocess.run([ctk, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = VERSION.search(done.stdout) if done.returncode == 0 else None
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3]), match[4] is not None


def is_safe_version(version: tuple[int, int, int, bool]) -> bool:
    """At least MIN_VERSION; a pre-release counts as below its release."""
    numbers, prerelease = version[:3], version[3]
    return numbers > MIN_VERSION or (numbers == MIN_VERSION and not prerelease)


def untrusted_images(podman: str | None, ctk: str | None, gpus: Sequence[GpuInfo]) -> bool:
    """The verdict of the module docstring for a node with container runtime `podman`, `nvidia-ctk` at `ctk`
    (None: absent) and `gpus`."""
    if podman is None:
        return False
    if ctk is None:
        return all(gpu.fake for gpu in gpus)
    version = ctk_version(ctk)
    return version is not None and is_safe_version(version)
