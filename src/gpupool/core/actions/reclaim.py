"""Reclaim (across queues): a pending job of a queue that is under its fair share takes back GPUs
that other queues borrowed (KAI semantics, ALGORITHMS.md §4.4).

A job J of leaf queue R may evict only if R's GPU units plus J's demand stay within R's fair share.
A victim of queue V qualifies only while, at the level where the paths of R and V part (the two
sibling ancestors), V's side holds more than its allocatable share min(limit, max(guaranteed,
fair share)) — re-checked before each eviction, so reclaim stops as soon as V is back to its share.
Victims must be preemptible and have run at least V's `reclaim_min_runtime_s`; jobs are evicted whole.

No reclaim cycles: after a reclaim R is within its fair share, so it is not above its allocatable
share and nothing can be reclaimed from it by V in turn (property-tested).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.core.actions.evicting import Attempts, start_by_evicting
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec
from gpupool.core.queues import GPU_UNITS, QueueTree
from gpupool.core.quota import demand_units
from gpupool.core.resources import ResourceVector
from gpupool.core.snapshot import RunningTask

if TYPE_CHECKING:
    from gpupool.core.cycle import Cycle


class ReclaimAction(Action):
    name = "reclaim"

    def __init__(self, max_victims: int = 16, max_attempts: int = 8) -> None:
        if max_victims < 0 or max_attempts < 0:
            raise ValueError("reclaim: max_victims and max_attempts must be >= 0")
        self.max_victims = max_victims
        self.max_attempts = max_attempts

    def execute(self, cycle: Cycle) -> None:
        tree = cycle.tree
        if tree is None:
            return
        left, attempts = self.max_victims, Attempts(self.max_attempts)
        running = cycle.workspace.running_tasks()
        for job in cycle.pending_order():
            if left <= 0 or attempts.exhausted:
                return
            if job.queue not in tree.specs or attempts.known_to_fail(job) or not _under_share(cycle, job):
                continue
            candidates = [t for t in running if _eligible(cycle, tree, job, t)]
            if candidates:
                evicted = start_by_evicting(cycle, job, candidates, _AboveShare(cycle, tree, job), left, "reclaimed")
                attempts.record(job, evicted)
                left -= evicted
                running = cycle.workspace.running_tasks() if evicted else running


def _under_share(cycle: Cycle, job: JobSpec) -> bool:
    assert cycle.tree is not None
    used = cycle.workspace.usage.get(job.queue, ResourceVector())[GPU_UNITS]
    return used + demand_units(job, cycle.tree) <= cycle.fair_shares.get(job.queue, 0)


def _eligible(cycle: Cycle, tree: QueueTree, job: JobSpec, task: RunningTask) -> bool:
    if task.queue == job.queue or not task.preemptible or task.task_id not in cycle.snapshot.running:
        return False
    if task.queue not in tree.specs:
        return True
    return cycle.now - task.started_at >= tree.specs[task.queue].reclaim_min_runtime_s


def diverging_queue(tree: QueueTree, reclaimer: str, victim: str) -> str:
    """The victim's ancestor (or itself) that is a sibling of the reclaimer's side of the tree."""
    mine = set(tree.paths[reclaimer])
    previous = victim
    for name in tree.paths[victim]:
        if name in mine:
            return previous
        previous = name
    return tree.paths[victim][-1]


class _AboveShare:
    """May this victim be taken for `job`: is its side of the tree above its allocatable share right now?"""

    def __init__(self, cycle: Cycle, tree: QueueTree, job: JobSpec) -> None:
        self.cycle, self.tree, self.job = cycle, tree, job

    def __call__(self, task: RunningTask) -> bool:
        if task.queue not in self.tree.specs:
            return True
        side = diverging_queue(self.tree, self.job.queue, task.queue)
        spec = self.tree.specs[side]
        share = max(spec.guaranteed[GPU_UNITS], self.cycle.fair_shares.get(side, 0))
        if spec.limit is not None and GPU_UNITS in spec.limit:
            share = min(share, spec.limit[GPU_UNITS])
        return self.cycle.workspace.usage.get(side, ResourceVector())[GPU_UNITS] > share
