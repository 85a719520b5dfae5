"""Consolidate: make room for a pending job by moving movable tasks elsewhere (defragmentation).

For each pending job in queue order, in one Statement, place its tasks; when a task finds no node:

1. candidate nodes are those where the task would fit if every movable task (preemptible or
   checkpointable) on them were gone; fewest GPU milli to move first, then node name;
2. on a candidate, fence the node off and move its movable tasks away one at a time (smallest
   first), each to the best other node by the profile's placement, until the task fits;
3. a candidate whose tasks cannot all be re-placed, or that needs more moves than the budget left,
   is rolled back and the next one is tried.

The job's statement commits only when all its `min_tasks` are placed, so every move it contains
has a new home and nothing is evicted for nothing. Budgets: `max_moves_per_cycle`, and
`max_moves_per_hour` counted with the snapshot's `recent_moves`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.core.fit import node_fits
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec, TaskShape
from gpupool.core.snapshot import RunningTask
from gpupool.core.statement import Statement

if TYPE_CHECKING:
    from gpupool.core.cycle import Cycle

CANDIDATES = 8


@dataclass
class _Budget:
    left: int


class ConsolidateAction(Action):
    name = "consolidate"

    def __init__(self, max_moves_per_cycle: int = 8, max_moves_per_hour: int = 60) -> None:
        if max_moves_per_cycle < 0 or max_moves_per_hour < 0:
            raise ValueError("consolidate: move budgets must be >= 0")
        self.per_cycle = max_moves_per_cycle
        self.per_hour = max_moves_per_hour

    def execute(self, cycle: Cycle) -> None:
        recent = sum(1 for t in cycle.snapshot.recent_moves if cycle.now - t < 3600)
        budget = _Budget(min(self.per_cycle, self.per_hour - recent))
        for job in cycle.ordered_pending():
            if budget.left <= 0:
                return
            with cycle.statement() as stmt:
                spent = _place_with_moves(cycle, job, stmt, budget.left)
                if spent is not None:
                    budget.left -= spent
                    cycle.emit(job, stmt.commit())


def _place_with_moves(cycle: Cycle, job: JobSpec, stmt: Statement, allowance: int) -> int | None:
    """Moves spent placing `job` in `stmt` (0 when it fits without any), or None if it cannot start."""
    placer, table = cycle.framework.placer, cycle.workspace.table
    spent = 0
    for k, task in enumerate(job.tasks):
        i = placer.choose(table, task.shape, cycle.rng)
        if i is None:
            made = _make_room(cycle, stmt, task.shape, allowance - spent)
            if made is None:
                return spent if k >= job.min_tasks and spent else None
            i, moves = made
            spent += moves
        stmt.allocate(job, task, i, placer.pick(table, i, task.shape, cycle.rng))
    return spent


def _make_room(cycle: Cycle, stmt: Statement, shape: TaskShape, allowance: int) -> tuple[int, int] | None:
    """(node index, moves made) for a node freed for `shape` within `allowance` moves, else None."""
    table = cycle.workspace.table
    by_node: dict[str, list[RunningTask]] = defaultdict(list)
    for task in cycle.workspace.running_tasks():
        if task.is_movable:
            by_node[task.node].append(task)
    candidates = []
    for name, tasks in by_node.items():
        i = table.index[name]
        state = table.states[i]
        for task in tasks:
            state = state.give(task.shape, task.shares)
        if not node_fits(table.kinds[i], state, shape):
            candidates.append((sum(t.shape.total_gpu_milli for t in tasks), name, i))
    for _, name, i in sorted(candidates)[:CANDIDATES]:
        checkpoint = stmt.checkpoint()
        moves = _vacate(cycle, stmt, i, shape, sorted(by_node[name], key=_smallest_first), allowance)
        if moves is not None:
            return i, moves
        stmt.rollback(checkpoint)
    return None


def _smallest_first(task: RunningTask) -> tuple[int, int, str]:
    return (task.shape.total_gpu_milli, task.shape.cpu_milli, task.task_id)


def _vacate(cycle: Cycle, stmt: Statement, i: int, shape: TaskShape, movable: list[RunningTask],
            allowance: int) -> int | None:
    """Move tasks off node `i` until `shape` fits there; the number of moves, or None."""
    placer, table = cycle.framework.placer, cycle.workspace.table
    stmt.set_schedulable(i, False)
    moves = 0
    for task in movable:
        if moves >= allowance:
            return None
        target = placer.choose(table, task.shape, cycle.rng)
        if target is None:
            return None
        stmt.move(task, target, placer.pick(table, target, task.shape, cycle.rng))
        moves += 1
        if not node_fits(table.kinds[i], table.states[i].with_schedulable(True), shape):
            stmt.set_schedulable(i, True)
            return moves
    return None
