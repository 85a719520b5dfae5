"""The only output of a cycle: plain, frozen data that a `DecisionSink` applies.

The simulator applies decisions to its cluster; the control plane's binder writes them to the
database and turns binds into launch orders. A sink that cannot apply one reports it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpupool.core.model import DeviceShare, TaskShape


@dataclass(frozen=True, slots=True)
class Bind:
    """Start `task_id` of `job_id` on `node` with exactly `shares` of its GPUs."""

    job_id: str
    task_id: str
    node: str
    shape: TaskShape
    shares: tuple[DeviceShare, ...]


@dataclass(frozen=True, slots=True)
class Evict:
    """Stop `task_id` (preemption, reclaim or a consolidation move) and free its resources."""

    job_id: str
    task_id: str
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class Move:
    """Checkpoint `task_id` on `from_node` and resume it on `node` with `shares` (consolidation)."""

    job_id: str
    task_id: str
    from_node: str
    node: str
    shape: TaskShape
    shares: tuple[DeviceShare, ...]


Decision = Bind | Evict | Move


@dataclass(frozen=True, slots=True)
class ApplyReport:
    applied: tuple[Decision, ...]
    failed: tuple[tuple[Decision, str], ...] = ()


class DecisionSink(Protocol):
    def apply(self, decisions: list[Decision]) -> ApplyReport: ...
