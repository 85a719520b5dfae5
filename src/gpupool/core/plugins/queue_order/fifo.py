"""FIFO: pending jobs in submission order, then by job id, regardless of queue."""

from __future__ import annotations

from collections.abc import Hashable

from gpupool.core.framework import QueueOrderPlugin
from gpupool.core.model import JobSpec


class FifoQueueOrder(QueueOrderPlugin):
    name = "fifo"

    def job_key(self, job: JobSpec, now: float) -> tuple[Hashable, ...]:
        return (job.submitted_at, job.id)
