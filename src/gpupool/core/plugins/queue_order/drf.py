"""DRF: the queue with the smallest weighted dominant share of the cluster goes next (exact fractions);
inside a queue, priority then submission order."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from gpupool.core.framework import QueueOrderPlugin
from gpupool.core.model import JobSpec

if TYPE_CHECKING:
    from gpupool.core.framework import QueueView


class DrfQueueOrder(QueueOrderPlugin):
    name = "drf"

    def job_key(self, job: JobSpec, now: float) -> tuple[Hashable, ...]:
        return (-job.priority, job.submitted_at, job.id)

    def queue_key(self, queue: str, view: QueueView) -> tuple[Hashable, ...] | None:
        share = view.used.dominant_share(view.capacity)
        weight = view.weight
        return (share / weight if weight else share * 10**9, queue)
