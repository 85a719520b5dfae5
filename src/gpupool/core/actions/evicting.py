"""Starting a job by evicting others (shared by preempt and reclaim)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpupool.core.actions.reservations import held_nodes
from gpupool.core.actions.room import make_room
from gpupool.core.decisions import Evict
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import RunningTask

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle


def start_by_evicting(cycle: Cycle, job: JobSpec, victims: list[RunningTask],
                      may_take: Callable[[RunningTask], bool], allowance: int, reason: str) -> int:
    """Try to start `job`, evicting from `victims` (in any order: the victim plugin orders each node's as room is
    made there; callers list them once for the jobs that share a candidate list); jobs evicted (0 if it did not
    start).

    Like allocate, it keeps off the nodes that this cycle's reservations hold against `job`.
    """
    placer, table, plugin = cycle.plugins.placer, cycle.workspace.table, cycle.plugins.victims
    fenced = held_nodes(cycle, job)
    with cycle.statement() as stmt:
        for k, task in enumerate(job.tasks):
            i = placer.choose(table, task.shape, cycle.rng, fenced)
            if i is None:
                spent = _evicted_jobs(stmt.decisions)
                made = make_room(cycle, stmt, task.shape, victims, lambda ts: plugin.order_victims(job, ts),
                                 may_take, None, allowance - spent, reason, fenced)
                if made is None:
                    if k >= job.min_tasks:
                        break
                    return 0
                i = made[0]
            stmt.allocate(job, task, i, placer.pick(table, i, task.shape, cycle.rng))
        if cycle.quota_reason(job):
            return 0
        evicted = _evicted_jobs(stmt.decisions)
        cycle.emit(job, stmt.commit())
        return evicted


def _evicted_jobs(decisions: tuple[object, ...]) -> int:
    return len({d.job_id for d in decisions if isinstance(d, Evict)})


class Attempts:
    """Bounds the eviction searches of one action in one cycle.

    At most `limit` jobs are tried; a job whose (queue, priority, task shapes) already failed to start in
    this cycle is not tried again, since nothing it could evict has changed in its favour.
    """

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.failed: set[tuple[object, ...]] = set()

    @property
    def exhausted(self) -> bool:
        return self.left <= 0

    @staticmethod
    def _key(job: JobSpec) -> tuple[object, ...]:
        return (job.queue, job.priority, job.min_tasks, tuple(t.shape for t in job.tasks))

    def known_to_fail(self, job: JobSpec) -> bool:
        return self._key(job) in self.failed

    def record(self, job: JobSpec, evicted: int) -> None:
        self.left -= 1
        if not evicted:
            self.failed.add(self._key(job))
