"""Priority: higher priority first, then submission order, then job id, regardless of queue."""

from __future__ import annotations

from collections.abc import Hashable

from gpupool.core.framework import QueueOrderPlugin
from gpupool.core.model import JobSpec


class PriorityQueueOrder(QueueOrderPlugin):
    name = "priority"

    def job_key(self, job: JobSpec, now: float) -> tuple[Hashable, ...]:
        return (-job.priority, job.submitted_at, job.id)
