"""Victims: lose the least work first: lowest priority, then the most recently started (least
progress lost), then the smallest GPU footprint, then task id.

A task's rank is a function of the task alone, so it is remembered per task (by identity, since a restarted
task is a new object) across calls and cycles: eviction searches rank the same running tasks many times.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.core.framework import VictimPlugin
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import RunningTask

#: ranks remembered before the memo starts again (it keeps tasks that have ended until then)
RANK_MEMO_LIMIT = 200_000

Rank = tuple[int, float, int, str]


class LeastWorkVictims(VictimPlugin):
    name = "least_work"

    def __init__(self) -> None:
        self._ranks: dict[str, tuple[RunningTask, Rank]] = {}

    def order_victims(self, preemptor: JobSpec, candidates: Sequence[RunningTask]) -> Sequence[RunningTask]:
        if len(self._ranks) > RANK_MEMO_LIMIT:
            self._ranks.clear()
        return sorted(candidates, key=self._rank)

    def _rank(self, task: RunningTask) -> Rank:
        known = self._ranks.get(task.task_id)
        if known is not None and known[0] is task:
            return known[1]
        rank = (task.priority, -task.started_at, task.shape.total_gpu_milli, task.task_id)
        self._ranks[task.task_id] = (task, rank)
        return rank
