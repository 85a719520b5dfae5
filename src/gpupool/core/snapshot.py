"""The cluster as one cycle sees it.

A `ClusterSnapshot` is read-only for the cycle: `run_cycle` returns it exactly as it received it.
Its owner (the simulator's cluster or the control plane's cache) updates the node table and the
running map between cycles, incrementally, so a snapshot is valid until its owner next applies
decisions (the Kubernetes scheduler's snapshot contract).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from gpupool.core.model import DeviceShare, JobSpec, TaskShape
from gpupool.core.nodes import NodeTable
from gpupool.core.queues import QueueTree
from gpupool.core.resources import ResourceVector


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task holding resources on a node."""

    task_id: str
    job_id: str
    node: str
    shape: TaskShape
    shares: tuple[DeviceShare, ...]
    queue: str = "default"
    priority: int = 0
    preemptible: bool = True
    started_at: float = 0.0
    checkpointable: bool = False
    #: when the scheduler expects it to end (start + runtime estimate, else + limit); None = unknown
    expected_end: float | None = None
    #: when its job was submitted
    submitted_at: float = 0.0

    @property
    def is_movable(self) -> bool:
        """Consolidation may move only tasks that may be preempted or can be checkpointed."""
        return self.preemptible or self.checkpointable


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: NodeTable
    pending: tuple[JobSpec, ...] = ()
    running: Mapping[str, RunningTask] = field(default_factory=lambda: MappingProxyType({}))
    generation: int = 0
    taken_at: float = 0.0
    #: times of task moves (consolidation) the driver made recently, for per-hour budgets
    recent_moves: tuple[float, ...] = ()
    #: the queue tree; None means one implicit queue without quotas
    queues: QueueTree | None = None
    #: normalised time-decayed GPU usage per queue (0..1), for time-based fair share
    usage_history: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    #: resources in use per queue (leaf and ancestors) as the driver keeps them; None = derive from `running`
    queue_usage: Mapping[str, ResourceVector] | None = None
