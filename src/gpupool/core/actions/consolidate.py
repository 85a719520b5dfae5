"""Consolidate: make room for a pending job by moving movable tasks elsewhere (defragmentation).

For each pending job in queue order, in one Statement, place its tasks; when a task finds no node,
free a node for it by moving movable tasks (preemptible or checkpointable) off it, each to the best
other node by the profile's placement (`gpupool.core.actions.room`). The statement commits only when
all `min_tasks` are placed and the job's queues may hold it, so every move has a new home and
nothing moves for nothing. Budgets: `max_moves_per_cycle`, and `max_moves_per_hour` counted with
the snapshot's `recent_moves`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.core.actions.room import make_room
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import RunningTask
from gpupool.core.statement import Statement

if TYPE_CHECKING:
    from gpupool.core.cycle import Cycle


class ConsolidateAction(Action):
    name = "consolidate"

    def __init__(self, max_moves_per_cycle: int = 8, max_moves_per_hour: int = 60) -> None:
        if max_moves_per_cycle < 0 or max_moves_per_hour < 0:
            raise ValueError("consolidate: move budgets must be >= 0")
        self.per_cycle = max_moves_per_cycle
        self.per_hour = max_moves_per_hour

    def execute(self, cycle: Cycle) -> None:
        recent = sum(1 for t in cycle.snapshot.recent_moves if cycle.now - t < 3600)
        left = min(self.per_cycle, self.per_hour - recent)
        for job in cycle.pending_order():
            if left <= 0:
                return
            with cycle.statement() as stmt:
                spent = _place_with_moves(cycle, job, stmt, left)
                if spent is not None and not cycle.quota_reason(job):
                    left -= spent
                    cycle.emit(job, stmt.commit())


def _movable(task: RunningTask) -> bool:
    return task.is_movable


def _place_with_moves(cycle: Cycle, job: JobSpec, stmt: Statement, allowance: int) -> int | None:
    """Moves spent placing `job` in `stmt` (0 when it fits without any), or None if it cannot start."""
    placer, table = cycle.framework.placer, cycle.workspace.table
    spent = 0
    for k, task in enumerate(job.tasks):
        i = placer.choose(table, task.shape, cycle.rng)
        if i is None:
            victims = sorted((t for t in cycle.workspace.running_tasks() if t.is_movable),
                             key=lambda t: (t.shape.total_gpu_milli, t.shape.cpu_milli, t.task_id))
            made = make_room(cycle, stmt, task.shape, victims, _movable, True, allowance - spent)
            if made is None:
                return spent if k >= job.min_tasks else None
            i, moves = made
            spent += moves
        stmt.allocate(job, task, i, placer.pick(table, i, task.shape, cycle.rng))
    return spent
