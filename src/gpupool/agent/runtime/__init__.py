"""How the agent runs workloads: the `WorkloadRuntime` interface, a process runtime and a podman runtime."""

from __future__ import annotations

from gpupool.agent.runtime.base import (
    RUNNING,
    LaunchError,
    LaunchSpec,
    RunHandle,
    RunState,
    WorkloadKey,
    WorkloadRuntime,
)
from gpupool.agent.runtime.container import ContainerRuntime, open_runtime, podman_path
from gpupool.agent.runtime.process import ProcessRuntime, gpu_env, workload_env

__all__ = [
    "RUNNING",
    "ContainerRuntime",
    "LaunchError",
    "LaunchSpec",
    "ProcessRuntime",
    "RunHandle",
    "RunState",
    "WorkloadKey",
    "WorkloadRuntime",
    "gpu_env",
    "open_runtime",
    "podman_path",
    "workload_env",
]
