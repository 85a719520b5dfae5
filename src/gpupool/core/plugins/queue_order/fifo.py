"""FIFO: pending jobs in submission order, then by job id."""

from __future__ import annotations

from collections.abc import Hashable

from gpupool.core.framework import QueueOrderPlugin
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import ClusterSnapshot


class FifoQueueOrder(QueueOrderPlugin):
    name = "fifo"

    def sort_key(self, job: JobSpec, snapshot: ClusterSnapshot) -> tuple[Hashable, ...]:
        return (job.submitted_at, job.id)
