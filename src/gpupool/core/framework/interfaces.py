"""Plugin extension points: one small ABC each. A plugin subclasses only the points it implements.

Every plugin has a class-level `name` (snake_case, unique in a registry) that appears in profiles,
diagnostics and logs. Placement plugins (filter, score, devices) are pure functions of
(node kind, node state, task shape): the placement engine caches their results by those keys, so a
plugin that reads anything else (the clock, other nodes) breaks the cache and is a bug.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gpupool.core.framework.status import Status
from gpupool.core.model import DeviceShare, JobSpec, TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.resources import ResourceVector

if TYPE_CHECKING:
    from gpupool.core.snapshot import RunningTask


class Plugin(ABC):  # noqa: B024 - a marker base; extension points add the abstract methods
    name: ClassVar[str]


class FilterPlugin(Plugin):
    @abstractmethod
    def filter(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> Status:
        """Called for each node (state) a shape is evaluated on.

        Returns SUCCESS, UNSCHEDULABLE (might fit after evictions) or UNRESOLVABLE (never on this
        node kind). The engine places the shape only on nodes where every filter succeeds, and
        counts rejection reasons for "why pending". Must read only its arguments.
        """


class ScorePlugin(Plugin):
    @abstractmethod
    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        """Called only for feasible nodes. Higher is better; the engine multiplies by the profile
        weight, sums over score plugins and picks the maximum (ties: lowest node name, or a seeded
        random choice when the profile says so)."""


class DevicePlugin(Plugin):
    #: whether `pick_devices` draws from `rng`; a plugin that does not is a pure function of (kind, state, shape),
    #: and the placement engine memoises its picks like scores
    uses_rng = False

    @abstractmethod
    def pick_devices(
        self, kind: NodeKind, state: NodeState, shape: TaskShape, rng: random.Random
    ) -> tuple[DeviceShare, ...]:
        """Called once on the chosen (feasible) node: the exact GPUs or fraction the task gets.

        Must return `shape.gpu_count` shares that fit `state`; () for CPU-only shapes.
        """


@dataclass(frozen=True, slots=True)
class QueueView:
    """What queue-order plugins see of a queue: live usage, this cycle's fair share, and its settings."""

    used: ResourceVector
    fair_share: int
    capacity: ResourceVector
    weight: int
    priority: int


class QueueOrderPlugin(Plugin):
    @abstractmethod
    def job_key(self, job: JobSpec, now: float) -> tuple[Hashable, ...]:
        """Order of pending jobs within a queue at time `now` (smaller first); ties must end on a stable field,
        then id. A function of the job and `now` alone: a cycle sorts its pending jobs by it once."""

    def queue_key(self, queue: str, view: QueueView) -> tuple[Hashable, ...] | None:
        """Which queue's head goes next (smaller first), from the queue's live usage and fair share.

        Called again for a queue after each of its jobs is tried. None (the default) means the order is
        queue-agnostic: all pending jobs are merged by `job_key` alone.
        """
        return None


class VictimPlugin(Plugin):
    @abstractmethod
    def order_victims(self, preemptor: JobSpec, candidates: Sequence[RunningTask]) -> Sequence[RunningTask]:
        """Candidates that `preemptor` may evict, in the order they should be evicted (least lost
        work first), an order that does not depend on the order of `candidates` (callers list them in no set
        order) and that ranks each candidate on its own: callers ask for one node's victims at a time, and any
        subset comes out in the order it has within the whole. Called inside a Statement; must not drop a
        candidate it cannot rank."""
