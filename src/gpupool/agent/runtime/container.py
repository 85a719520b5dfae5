"""Run image workloads with podman; plain commands still run as processes (see `ProcessRuntime`).

A launch with an `image` becomes `podman run --rm --name gpupool-<workload> ... IMAGE COMMAND` under the same
exit-code wrapper and process group, so poll/adopt/exit codes work as for processes. The container (RELIABILITY.md
§3.2 S8):

* runs as a non-root user (`--user`, default 65534:65534, "nobody"; uid or gid 0 is refused);
* gets no new privileges and no capabilities (`--security-opt=no-new-privileges`, `--cap-drop=ALL`), never
  `--privileged`;
* has private network, PID and IPC namespaces, named explicitly, never the host's;
* has a read-only root file system with writable tmpfs on /tmp, /var/tmp, /run and /dev (`--read-only`,
  `--read-only-tmpfs=true`): the launch protocol has no field to opt out;
* gets only the order's env and gpupool's variables, passed by name (values never appear on a command line), so
  `NVIDIA_VISIBLE_DEVICES` lists exactly the granted GPU UUIDs; GPUs are passed as CDI devices
  (`--device nvidia.com/gpu=<uuid>`, exactly the grants) when an NVIDIA CDI spec is installed.

Since SIGKILL of `podman run` does not stop the container, `stop` and `forget` also `podman rm -f` it.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpupool.agent.runtime.base import LaunchError, LaunchSpec, RunHandle, RunState
from gpupool.agent.runtime.identity import AgentUser
from gpupool.agent.runtime.process import ProcessRuntime, gpupool_env, workload_dir_name
from gpupool.protocol.agent import GpuGrant
from gpupool.protocol.api import image_registry

log = logging.getLogger(__name__)

CDI_SPECS = (Path("/etc/cdi/nvidia.yaml"), Path("/var/run/cdi/nvidia.yaml"), Path("/etc/cdi/nvidia.json"))
DEFAULT_USER = "65534:65534"
HARDENING = ("--security-opt=no-new-privileges", "--cap-drop=ALL", "--network=private", "--pid=private",
             "--ipc=private", "--read-only", "--read-only-tmpfs=true")


def podman_path() -> str | None:
    """The podman executable, or None when it is not installed."""
    return shutil.which("podman")


def container_name(allocation_id: str, attempt: int) -> str:
    return f"gpupool-{workload_dir_name(allocation_id, attempt)}"


def container_user(value: str) -> str:
    """`value` as podman's `--user` if it is "uid:gid" with both positive integers; else ValueError."""
    parts = value.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"container user {value!r}: must be uid:gid, both numbers above 0 (never root)")
    return f"{int(parts[0])}:{int(parts[1])}"


def podman_argv(podman: str, spec: LaunchSpec, gpus: Sequence[GpuGrant], *, cdi: bool,
                user: str = DEFAULT_USER) -> list[str]:
    """The `podman run` command line for an image workload, hardened as the module docstring says (env passed by
    name only). `user` is a `container_user` value."""
    if spec.image is None:
        raise ValueError("podman_argv needs a spec with an image")
    try:
        image_registry(spec.image)  # never an option ("--privileged") or anything else podman would misread
    except ValueError as exc:
        raise ValueError(f"image {spec.image!r}: {exc}") from None
    names = sorted({*spec.env, *gpupool_env(spec, gpus)})
    argv = [podman, "run", "--rm", "--name", container_name(spec.allocation_id, spec.attempt)]
    argv += [f"--user={container_user(user)}", *HARDENING]
    argv += [arg for name in names for arg in ("--env", name)]
    if cdi:
        argv += [arg for grant in gpus for arg in ("--device", f"nvidia.com/gpu={grant.uuid}")]
    if spec.workdir:
        argv += ["--workdir", spec.workdir]
    return [*argv, spec.image, *spec.command]


class ContainerRuntime(ProcessRuntime):
    """`ProcessRuntime` that runs orders with an image through podman, as `user` ("uid:gid", not root; ValueError
    otherwise); the other arguments are ProcessRuntime's."""

    def __init__(self, directory: Path, *, podman: str | None = None, user: str = DEFAULT_USER,
                 **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        found = podman or podman_path()
        if found is None:
            raise RuntimeError("podman not found: use ProcessRuntime on this node")
        self._podman = found
        self._user = container_user(user)
        self._cdi = any(path.exists() for path in CDI_SPECS)

    def launch(self, spec: LaunchSpec, devices: Sequence[GpuGrant] | None = None) -> RunHandle:
        if spec.image is None:
            return super().launch(spec, devices)
        gpus = spec.gpus if devices is None else tuple(devices)
        try:
            argv = podman_argv(self._podman, spec, gpus, cdi=self._cdi, user=self._user)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        # podman itself runs on the host as the agent (rootful podman; the container's user is `user`), in the work
        # folder: the workdir applies inside the container only.
        host_spec = dataclasses.replace(spec, command=tuple(argv), workdir=None, image=None, gpus=tuple(gpus))
        return self._start(host_spec, argv, gpus, AgentUser(), no_new_privs=False)  # podman sets it in the container

    def stop(self, handle: RunHandle, grace_s: float) -> RunState:
        state = super().stop(handle, grace_s)
        self._remove(handle)
        return state

    def forget(self, handle: RunHandle) -> None:
        super().forget(handle)
        self._remove(handle)

    def _remove(self, handle: RunHandle) -> None:
        """Best effort `podman rm -f` of the workload's container (absent containers are fine)."""
        command = [self._podman, "rm", "-f", "--ignore", container_name(handle.allocation_id, handle.attempt)]
        try:
            subprocess.run(command, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("podman rm of %s failed: %s", handle.key, exc)


def open_runtime(directory: Path, *, user: str = DEFAULT_USER, **kwargs: Any) -> ProcessRuntime:
    """ContainerRuntime (containers run as `user`) when podman is installed, else ProcessRuntime (which refuses
    orders with an image)."""
    if podman_path() is not None:
        return ContainerRuntime(directory, user=user, **kwargs)
    return ProcessRuntime(directory, **kwargs)
