"""Nodes and their GPUs, drains and node actions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpupool.protocol.api.common import UtcTime, _Request, _Response


class GpuOut(_Response):
    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated_milli: int
    utilization_pct: int | None = None
    temperature_c: int | None = None
    fake: bool = False


class NodeOut(_Response):
    name: str
    state: str
    cordoned: bool
    cpu_milli: int
    memory_mib: int
    site: str
    gpus: list[GpuOut]
    last_seen: UtcTime | None
    untrusted_images: bool = Field(default=False, description="runs jobs with an image (its agent found a "
                                                               "container toolkit safe for any tenant's image)")
    jobs_as: str = Field(default="unknown", description="who its process jobs run as: dynamic-uid (a transient uid "
                                                        "per job), local-user, agent-user (the agent's own, not "
                                                        "root), root, or unknown (an agent that does not say)")
    drain_since: UtcTime | None = Field(default=None, description="draining since then: it takes no new work")
    drain_deadline: UtcTime | None = Field(default=None, description="when work still running on the draining "
                                                                     "node is evicted (None: it ends on its own)")
    removing: bool = Field(default=False, description="removed once its evicted work has stopped")
    tasks: int = Field(default=0, description="tasks open there (starting, running or stopping); on a Kubernetes "
                                              "node, gpupool's pods bound there and not ended")
    source: Literal["agent", "kubernetes"] = Field(default="agent", description="who reports the node: a gpupool "
                                                                                 "agent, or a Kubernetes cluster "
                                                                                 "gpupool schedules pods on")


class DrainRequest(_Request):
    deadline_s: int | None = Field(default=None, ge=0, le=366 * 86400, description=(
        "seconds from now after which work still running there is stopped (with the pool's kill grace) and "
        "requeued; none: it ends on its own"))
    dry_run: bool = Field(default=False, description="say what would be evicted; change nothing")


class NodeWork(_Response):
    job: str
    task_index: int
    project: str
    user: str
    state: str = Field(description="the allocation's state: starting, running or stopping")


class NodeActionOut(_Response):
    """What `drain`, `undrain` or `remove` did on a node (with dry_run: would do)."""

    node: str
    action: Literal["drain", "undrain", "remove"]
    dry_run: bool
    deadline: UtcTime | None = None
    work: list[NodeWork] = Field(description="what runs there: evicted at the deadline (drain), requeued now "
                                             "(remove with force)")
    message: str
