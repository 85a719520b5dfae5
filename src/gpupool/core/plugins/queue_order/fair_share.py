"""Fair share: queues furthest below their fair share of GPU units go first (KAI's allocation order:
queues at or under fair share before those over it, then higher queue priority, then the smaller
usage-to-share ratio). The fair shares themselves come from the two-phase division with
time-decayed usage (`gpupool.core.quota.fair_shares`), which changes only over-quota shares."""

from __future__ import annotations

from collections.abc import Hashable
from fractions import Fraction
from typing import TYPE_CHECKING

from gpupool.core.framework import QueueOrderPlugin
from gpupool.core.model import JobSpec
from gpupool.core.queues import GPU_UNITS

if TYPE_CHECKING:
    from gpupool.core.cycle import QueueView

INFINITE = Fraction(10**12)


class FairShareQueueOrder(QueueOrderPlugin):
    name = "fair_share"

    def job_key(self, job: JobSpec) -> tuple[Hashable, ...]:
        return (-job.priority, job.submitted_at, job.id)

    def queue_key(self, queue: str, view: QueueView) -> tuple[Hashable, ...] | None:
        used = view.used[GPU_UNITS]
        if view.fair_share > 0:
            ratio = Fraction(used, view.fair_share)
        else:
            ratio = INFINITE if used else Fraction(0)
        return (ratio > 1, -view.priority, ratio, queue)
