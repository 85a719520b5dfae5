"""S8 device tier (RELIABILITY.md §3.2), where an NVIDIA driver is: a workload that the process runtime starts with
k granted GPUs sees exactly those k through CUDA (the driver API, by UUID), and once it has ended no compute
process is left on them. Skipped without libcuda and nvidia-smi; prints the `S8d` figure line.

The container variant (nvidia-smi -L inside a podman container) needs podman, the NVIDIA Container Toolkit and a
local image: the figure says whether it ran.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.agent.runtime import LaunchSpec, ProcessRuntime
from gpupool.devtools.figures import figure
from gpupool.protocol.agent import GpuGrant

#: Initialises CUDA, lists the devices it sees by UUID, holds a context on them for argv[1] seconds (so that it is a
#: compute process while nvidia-smi looks), then prints what it saw.
PROBE = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
count = ctypes.c_int(0)
if cuda.cuInit(0) == 0:
    cuda.cuDeviceGetCount(ctypes.byref(count))
seen, contexts = [], []
for ordinal in range(count.value):
    device, raw, context = ctypes.c_int(), (ctypes.c_ubyte * 16)(), ctypes.c_void_p()
    cuda.cuDeviceGet(ctypes.byref(device), ordinal)
    cuda.cuDeviceGetUuid(raw, device)
    h = bytes(raw).hex()
    seen.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    contexts.append(context)
print("HOLDING", flush=True)
time.sleep(float(sys.argv[1]))
print("SEEN", count.value, " ".join(seen), flush=True)
"""
HOLD_S = 3.0


def _driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return shutil.which("nvidia-smi") is not None


def _smi(*query: str) -> list[str]:
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _compute_procs(uuids: set[str]) -> int:
    """Compute processes nvidia-smi lists on the GPUs `uuids`, not counting the node's MPS server (it stays)."""
    rows = [[part.strip() for part in row.split(",")] for row in _smi("--query-compute-apps=pid,process_name,gpu_uuid")]
    return sum(1 for row in rows if row[-1] in uuids and not row[1].endswith("nvidia-cuda-mps-server"))


def _until(predicate, timeout_s: float) -> None:  # noqa: ANN001 - a callable
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.skipif(not _driver(), reason="no NVIDIA driver here (libcuda.so.1 and nvidia-smi)")
def test_a_workload_sees_exactly_its_gpus_and_leaves_no_process(tmp_path: Path) -> None:
    gpus = _smi("--query-gpu=uuid")
    runtime = ProcessRuntime(tmp_path / "workloads", base_env=os.environ)
    results, during, leftover = [], 0, 0
    for k in sorted({0, 1, len(gpus)}):
        grants = tuple(GpuGrant(uuid=u, index=i, milli=1000, memory_mib=0) for i, u in enumerate(gpus[:k]))
        spec = LaunchSpec(f"vis-{k}", 0, "j", (sys.executable, "-c", PROBE, str(HOLD_S)), gpus=grants)
        handle = runtime.launch(spec)
        _until(lambda: "HOLDING" in handle.log_path.read_text(), 60)  # noqa: B023 - used at once
        during += _compute_procs(set(gpus[:k])) if k else 0
        _until(lambda: not runtime.poll(handle).running, 60)  # noqa: B023 - used at once
        words = next(line for line in handle.log_path.read_text().splitlines() if line.startswith("SEEN")).split()
        results.append((k, int(words[1]), words[2:]))
        leftover += _compute_procs(set(gpus[:k])) if k else 0
        runtime.forget(handle)
    visible = sum(1 for k, n, seen in results if n == k and seen == gpus[:k])
    containers = "not run (no podman)" if shutil.which("podman") is None else "not run (no local test image)"
    figure(f"S8d device-tier gpu_visibility={visible}/{len(results)} (k={[k for k, _, _ in results]} of "
           f"{len(gpus)} GPUs, CUDA driver API by UUID) leftover_procs={leftover} (compute processes seen while "
           f"running: {during}) ; process runtime; containers {containers}")
    assert visible == len(results), results
    assert leftover == 0
