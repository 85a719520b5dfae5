"""Victims: lose the least work first: lowest priority, then the most recently started (least
progress lost), then the smallest GPU footprint, then task id."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.core.framework import VictimPlugin
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import RunningTask


class LeastWorkVictims(VictimPlugin):
    name = "least_work"

    def order_victims(self, preemptor: JobSpec, candidates: Sequence[RunningTask]) -> Sequence[RunningTask]:
        return sorted(candidates, key=lambda t: (t.priority, -t.started_at, t.shape.total_gpu_milli, t.task_id))
