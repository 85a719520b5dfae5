"""Fair share: queues furthest below their fair share of GPU units go first (KAI's allocation order:
queues at or under fair share before those over it, then higher queue priority, then the smaller
usage-to-share ratio). The fair shares themselves come from the two-phase division with
time-decayed usage (`gpupool.core.quota.fair_shares`), which changes only over-quota shares.

Inside a queue, higher priority first, then by `job_order`:

- `submitted`: submission time (first come, first served);
- `expected_end`: submission time plus the runtime estimate, i.e. the end the job would reach had it
  started on arrival. A job is passed only by jobs submitted before its own expected end, and shorter
  jobs go first among those, which lowers the mean wait; a job without an estimate keeps its place
  by submission time.

With `overdue_first`, a job that has waited `overdue_after` times its own estimate (1: its expected end has
passed while it waits) is overdue and goes before every job that is not, whatever their priorities, overdue
jobs by expected end: higher priority and shorter jobs may pass a job only for that long, so no job starves
behind a stream of them (and each queue's reservations go to its overdue jobs first). Jobs without an
estimate are never overdue.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from gpupool.core.framework import QueueOrderPlugin
from gpupool.core.model import JobSpec
from gpupool.core.queues import GPU_UNITS

if TYPE_CHECKING:
    from gpupool.core.framework import QueueView

#: usage-to-share ratios are compared as integers scaled by this (exact to one part in 10^9, and far faster
#: than fractions in the queue heap)
RATIO_SCALE = 10**9
INFINITE = 10**30
JOB_ORDERS = ("submitted", "expected_end")


class FairShareQueueOrder(QueueOrderPlugin):
    name = "fair_share"

    def __init__(self, job_order: str = "submitted", overdue_first: bool = False, overdue_after: float = 1.0) -> None:
        if job_order not in JOB_ORDERS:
            raise ValueError(f"fair_share: job_order must be one of {', '.join(JOB_ORDERS)}")
        if not isinstance(overdue_first, bool):
            raise ValueError("fair_share: overdue_first must be true or false")
        if not isinstance(overdue_after, int | float) or isinstance(overdue_after, bool) or not overdue_after > 0:
            raise ValueError("fair_share: overdue_after must be a number > 0")
        self.expected_end = job_order == "expected_end"
        self.overdue_first = overdue_first
        self.overdue_after = float(overdue_after)

    def job_key(self, job: JobSpec, now: float) -> tuple[Hashable, ...]:
        estimate = job.estimate_s
        at = job.submitted_at + (estimate or 0.0) if self.expected_end else job.submitted_at
        if self.overdue_first and estimate is not None and now >= job.submitted_at + self.overdue_after * estimate:
            return (False, 0, at, job.id)
        return (True, -job.priority, at, job.id)

    def queue_key(self, queue: str, view: QueueView) -> tuple[Hashable, ...] | None:
        used = view.used[GPU_UNITS]
        if view.fair_share > 0:
            ratio = used * RATIO_SCALE // view.fair_share
        else:
            ratio = INFINITE if used else 0
        return (used > view.fair_share, -view.priority, ratio, queue)
