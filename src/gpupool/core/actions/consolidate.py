"""Consolidate: make room for a pending job by moving movable tasks elsewhere (defragmentation).

For each pending job in queue order, in one Statement, place its tasks off the nodes this cycle's
reservations hold against it; when a task finds no node, free a node for it by moving movable tasks
(preemptible or checkpointable) off it, each to the best other node by the profile's placement and
never onto a node reserved for another job (`gpupool.core.actions.room`). The statement commits only when all
`min_tasks` are placed and the job's queues may hold it, so every move has a new home and nothing
moves for nothing.

Victims are the tasks that ran before this cycle: checkpointable ones first (they lose nothing), then
preemptible ones that have run at most `max_lost_work_s` (a job that cannot checkpoint starts over when
a task of it moves), in the victim plugin's order (least work lost first). Only jobs that have waited at least
`min_wait_s` since submission move tasks. With `lost_work_within_wait`, a task that would start over moves for a
job only if the GPU-time its restart throws away (its own GPUs times how long it has run) is at most the GPU-time
the job has spent waiting (its GPUs times its wait): a starving job buys its start with no more work than it has
already lost. Budgets: `max_moves_per_cycle`, and
`max_moves_per_hour` counted with the snapshot's `recent_moves`; at most `max_attempts` jobs search
for moves in a cycle, and a job whose shapes and fence already failed is not searched again until
a job starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from gpupool.core.actions.reservations import held_nodes
from gpupool.core.actions.room import make_room
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import RunningTask
from gpupool.core.statement import Statement

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle


class ConsolidateAction(Action):
    name = "consolidate"

    def __init__(self, max_moves_per_cycle: int = 8, max_moves_per_hour: int = 60, max_attempts: int = 16,
                 max_lost_work_s: float = 600.0, min_wait_s: float = 0.0, lost_work_within_wait: bool = False) -> None:
        numbers = (max_moves_per_cycle, max_moves_per_hour, max_attempts, max_lost_work_s, min_wait_s)
        if any(math.isnan(n) or n < 0 for n in numbers):
            raise ValueError("consolidate: move budgets, max_attempts, max_lost_work_s and min_wait_s must be >= 0")
        if not isinstance(lost_work_within_wait, bool):
            raise ValueError("consolidate: lost_work_within_wait must be true or false")
        self.per_cycle = max_moves_per_cycle
        self.per_hour = max_moves_per_hour
        self.max_attempts = max_attempts
        self.max_lost_work_s = max_lost_work_s
        self.min_wait_s = min_wait_s
        self.lost_work_within_wait = lost_work_within_wait

    def execute(self, cycle: Cycle) -> None:
        recent = sum(1 for t in cycle.snapshot.recent_moves if cycle.now - t < 3600)
        left = min(self.per_cycle, self.per_hour - recent)
        search = _Search(cycle, self.max_attempts, self.max_lost_work_s, self.lost_work_within_wait)
        for job in cycle.pending_order():
            if left <= 0 or search.attempts <= 0:
                return
            if cycle.now - job.submitted_at < self.min_wait_s:
                continue
            fenced = held_nodes(cycle, job)
            key = (job.min_tasks, tuple(t.shape for t in job.tasks), fenced)
            if key in search.failed or cycle.quota_precheck(job):
                continue
            with cycle.statement() as stmt:
                spent = search.place(job, stmt, left, fenced)
                if spent is None:
                    search.failed.add(key)
                elif not cycle.quota_reason(job):
                    left -= spent
                    search.failed.clear()
                    cycle.emit(job, stmt.commit())


class _Search:
    """One pass's victims (listed once) and the job shapes that found no room since the last start."""

    def __init__(self, cycle: Cycle, attempts: int, max_lost_work_s: float, lost_work_within_wait: bool) -> None:
        self.cycle = cycle
        self.attempts = attempts
        self.max_lost_work_s = max_lost_work_s
        self.lost_work_within_wait = lost_work_within_wait
        self.failed: set[Hashable] = set()
        self._victims: list[RunningTask] | None = None

    def victims(self) -> list[RunningTask]:
        if self._victims is None:
            now = self.cycle.now
            self._victims = [t for t in self.cycle.workspace.still_running() if
                             t.checkpointable or t.preemptible and now - t.started_at <= self.max_lost_work_s]
        return self._victims

    def order(self, job: JobSpec) -> Callable[[list[RunningTask]], list[RunningTask]]:
        """A node's victims for `job`: checkpointable tasks first (they lose nothing), each part in the victim
        plugin's order."""
        plugin = self.cycle.plugins.victims
        return lambda tasks: sorted(plugin.order_victims(job, tasks), key=lambda t: not t.checkpointable)

    def place(self, job: JobSpec, stmt: Statement, allowance: int, fenced: frozenset[int]) -> int | None:
        """Moves spent placing `job` in `stmt` (0 when it fits without any), or None if it cannot start."""
        cycle = self.cycle
        placer, table = cycle.plugins.placer, cycle.workspace.table
        spent = 0
        for k, task in enumerate(job.tasks):
            i = placer.choose(table, task.shape, cycle.rng, fenced)
            if i is None:
                if spent == 0:
                    self.attempts -= 1
                made = make_room(cycle, stmt, task.shape, self.victims(), self.order(job), self.may_move(job),
                                 _others_reserved(cycle, job), allowance - spent, fenced=fenced)
                if made is None:
                    return spent if k >= job.min_tasks else None
                i, moves = made
                spent += moves
            stmt.allocate(job, task, i, placer.pick(table, i, task.shape, cycle.rng))
        return spent

    def may_move(self, job: JobSpec) -> Callable[[RunningTask], bool]:
        """Which of the victims `job` may move (`lost_work_within_wait` in the module docstring)."""
        if not self.lost_work_within_wait:
            return _movable
        now = self.cycle.now
        waited = (now - job.submitted_at) * sum(t.shape.total_gpu_milli for t in job.tasks)

        def within_wait(task: RunningTask) -> bool:
            return task.is_movable and (task.checkpointable or
                                        (now - task.started_at) * task.shape.total_gpu_milli <= waited)
        return within_wait


def _movable(task: RunningTask) -> bool:
    return task.is_movable


def _others_reserved(cycle: Cycle, job: JobSpec) -> frozenset[int]:
    """Nodes reserved for jobs other than `job`: a task moved there might outlast the reservation's start."""
    return frozenset(i for r in cycle.reservations if r.job_id != job.id for i in r.nodes)
