"""What the agent needs from a way of running workloads: launch, poll, stop, and adopt after a restart.

A workload is one attempt of one allocation: `(allocation_id, attempt)` is its key everywhere. A runtime keeps
what it needs on disk, so that a restarted agent can `adopt()` workloads that outlived it and learn the exit code
of those that ended while it was down. Discovery (which GPUs exist) is a separate interface on purpose.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpupool.protocol.agent import GpuGrant, Launch, Rendezvous

WorkloadKey = tuple[str, int]


class LaunchError(RuntimeError):
    """The runtime could not start the workload (bad workdir, unsupported image, exec failure before start)."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything a runtime needs to start one attempt; built from a protocol `Launch` by `from_launch`.

    `gpus` lists the granted devices in the order the workload will see them (CUDA ordinal 0 is `gpus[0]`);
    a grant's `uuid` is a MIG instance UUID when the grant is a MIG slice. `user` is the submitting user's name (the
    local account of a node that runs jobs as local users). `max_disconnect_s` is how long the workload keeps running
    while the agent hears from no control plane (None: the node's default, the runtime's `fence_s`).
    """

    allocation_id: str
    attempt: int
    job_id: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    image: str | None = None
    gpus: tuple[GpuGrant, ...] = ()
    task_index: int = 0
    user: str = ""
    max_disconnect_s: float | None = None
    #: a gang task's rendezvous (its MASTER_PORT chosen: see gpupool.agent.rendezvous), None for a job of one task
    rendezvous: Rendezvous | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("a launch needs a non-empty command")
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "env", dict(self.env))

    @classmethod
    def from_launch(cls, order: Launch) -> LaunchSpec:
        """The spec of a launch order (epoch and expiry are the order checker's business, not the runtime's)."""
        return cls(
            allocation_id=order.allocation_id,
            attempt=order.attempt,
            job_id=order.job_id,
            command=tuple(order.command),
            env=dict(order.env),
            workdir=order.workdir,
            image=order.image,
            gpus=tuple(order.gpus),
            task_index=order.task_index,
            user=order.user,
            max_disconnect_s=order.max_disconnect_s,
            rendezvous=order.rendezvous,
        )

    @property
    def key(self) -> WorkloadKey:
        return (self.allocation_id, self.attempt)


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A started workload, as persisted by the runtime; enough to poll, stop or adopt it later.

    `pid` is the process the runtime started (its process group is `pgid`); `start_ticks` is that process's start
    time from /proc/<pid>/stat and `host_boot_id` the kernel boot it ran in: together they tell a live workload from
    a reused pid. `started_at` is wall-clock seconds. `note` is a short free-form marker the agent attaches
    (e.g. "fenced") that survives a restart. `uid` is the user the workload runs as (None: the agent's own);
    `uid_claim` the claim file of a transient uid (gpupool.agent.runtime.uids; empty for any other identity): every
    process of that uid belongs to the workload. `work_dir` is the workload's own work folder. `max_disconnect_s` is
    the workload's own limit on the control plane's silence (None: the node's default).
    """

    allocation_id: str
    attempt: int
    pid: int
    started_at: float
    log_path: Path
    job_id: str = ""
    pgid: int = 0
    start_ticks: int | None = None
    host_boot_id: str = ""
    state_dir: Path | None = None
    note: str = ""
    uid: int | None = None
    uid_claim: str = ""
    work_dir: Path | None = None
    max_disconnect_s: float | None = None

    @property
    def key(self) -> WorkloadKey:
        return (self.allocation_id, self.attempt)


@dataclass(frozen=True, slots=True)
class RunState:
    """What a workload is doing: still running, or exited with `exit_code`.

    `exit_code` follows the shell convention: 0..255 for a normal exit, 128 + N after signal N (137 = SIGKILL).
    It is None for a running workload, and for one that is gone without a recorded exit code (e.g. the host
    rebooted).
    """

    status: Literal["running", "exited"]
    exit_code: int | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"


RUNNING = RunState("running")


class WorkloadRuntime(ABC):
    """Runs workloads on this node.

    Contract:
    * `launch` starts the workload and returns at once; it raises `LaunchError` when it cannot start it.
      `devices` (DESIGN.md §5) overrides `spec.gpus` when given.
    * `poll` never blocks for long and never raises for a workload that is gone: it says "exited".
    * `stop` asks politely (SIGTERM or the runtime's equivalent), waits up to `grace_s`, then kills; it returns the
      final state. It is safe to call on an exited workload, and from a worker thread.
    * `adopt` returns the handles of every workload recorded on disk, running or not, so a restarted agent can
      re-attach to them and report the ones that ended while it was down.
    * `forget` deletes what the runtime keeps for an exited workload; call it once its end has been reported. It
      raises RuntimeError while the workload (or, for a transient uid, any process of its uid) still runs.
    """

    @abstractmethod
    def launch(self, spec: LaunchSpec, devices: Sequence[GpuGrant] | None = None) -> RunHandle:
        """Start `spec`; see the class contract."""

    @abstractmethod
    def poll(self, handle: RunHandle) -> RunState:
        """The workload's state right now."""

    @abstractmethod
    def stop(self, handle: RunHandle, grace_s: float) -> RunState:
        """Terminate, wait `grace_s`, kill; the state afterwards."""

    @abstractmethod
    def adopt(self) -> list[RunHandle]:
        """Every workload recorded on disk, oldest first."""

    @abstractmethod
    def forget(self, handle: RunHandle) -> None:
        """Drop the on-disk record of an exited workload; raises RuntimeError while it still runs."""

    @abstractmethod
    def set_note(self, handle: RunHandle, note: str) -> RunHandle:
        """Persist `note` with the workload and return the updated handle."""

    def renew_lease(self, heard_at: float) -> None:  # noqa: B027 - optional: runtimes without a watchdog ignore it
        """The agent last heard from the control plane at `heard_at` (time.monotonic()); a runtime that watches its
        workloads independently of the agent stops them once this is older than the fence interval."""

    def of_this_boot(self, handle: RunHandle) -> bool:
        """False for a workload started before the machine last booted (it ended with that boot)."""
        return True

    def self_fenced(self, handle: RunHandle) -> bool:
        """True when the runtime's own watchdog stopped the workload (its lease ran out)."""
        return False
