"""Allocate: place pending jobs in queue order, each gang all-or-nothing.

For each job (queue order), in one Statement: place its tasks one by one on the placement engine's
best node; commit when at least `min_tasks` are placed, else discard and record why. Within a
cycle, a shape that found no node is not retried until a node changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.core.diagnostics import PendingReason, no_node_fits
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec, TaskShape
from gpupool.core.statement import Statement

if TYPE_CHECKING:
    from gpupool.core.cycle import Cycle


class AllocateAction(Action):
    name = "allocate"

    def execute(self, cycle: Cycle) -> None:
        failed: dict[TaskShape, tuple[int, PendingReason]] = {}
        for job in cycle.ordered_pending():
            with cycle.statement() as stmt:
                reason = place_gang(cycle, job, stmt, failed)
                if reason is None:
                    cycle.emit(job, stmt.commit())
                else:
                    cycle.block(job, reason)


def place_gang(cycle: Cycle, job: JobSpec, stmt: Statement,
               failed: dict[TaskShape, tuple[int, PendingReason]]) -> PendingReason | None:
    """Place `job`'s tasks in `stmt`; None when at least `min_tasks` are placed, else the reason.

    `failed` remembers shapes that found no node at a table position, to skip identical retries.
    """
    placer, table = cycle.framework.placer, cycle.workspace.table
    for k, task in enumerate(job.tasks):
        known = failed.get(task.shape)
        if known is not None and known[0] == table.seq:
            return None if k >= job.min_tasks else known[1]
        i = placer.choose(table, task.shape, cycle.rng)
        if i is None:
            reason = no_node_fits(len(table), placer.explain(table, task.shape), k, len(job.tasks))
            failed[task.shape] = (table.seq, reason)
            return None if k >= job.min_tasks else reason
        stmt.allocate(job, task, i, placer.pick(table, i, task.shape, cycle.rng))
    return None
