"""Preempt (inside a queue): a pending job evicts lower-priority preemptible jobs of its own leaf
queue to start. Victims must have run at least the queue's `preempt_min_runtime_s`, are taken in the
victim plugin's order (least work lost first; listed once per queue and priority in a cycle), never
include tasks placed in this cycle, and a job is evicted whole. The statement commits only if the
preemptor starts, within `max_victims` per cycle.

With `newer_equal_priority` (Kueue's `LowerOrNewerEqualPriority`), a victim may also have the preemptor's
priority if its job was submitted strictly later: jobs that passed a waiting one of the same priority.

No preemption cycles: a victim always has strictly lower priority than its preemptor, or the same priority and a
strictly later submission, so the evicted job can never preempt back the job that evicted it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpupool.core.actions.evicting import Attempts, start_by_evicting
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec
from gpupool.core.snapshot import RunningTask

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle


class PreemptAction(Action):
    name = "preempt"

    def __init__(self, max_victims: int = 16, max_attempts: int = 8, newer_equal_priority: bool = False) -> None:
        if max_victims < 0 or max_attempts < 0:
            raise ValueError("preempt: max_victims and max_attempts must be >= 0")
        if not isinstance(newer_equal_priority, bool):
            raise ValueError("preempt: newer_equal_priority must be true or false")
        self.max_victims = max_victims
        self.max_attempts = max_attempts
        self.newer_equal_priority = newer_equal_priority

    def execute(self, cycle: Cycle) -> None:
        left, attempts = self.max_victims, Attempts(self.max_attempts)
        ceilings = self._ceilings(cycle)
        by_queue = _by_queue(cycle, ceilings)
        if not by_queue:
            return  # no running task ranks below a pending job of its queue (one priority for all, say)
        found: dict[tuple[str, int, float], list[RunningTask]] = {}
        for job in cycle.pending_order():
            if left <= 0 or attempts.exhausted:
                return
            key = (job.queue, job.priority, job.submitted_at if self.newer_equal_priority else 0.0)
            if key not in found:
                found[key] = [t for priority, tasks in by_queue.get(job.queue, {}).items()
                              if self._may_rank_below(job, priority) for t in tasks if self._eligible(cycle, job, t)]
            if not found[key] or attempts.known_to_fail(job):
                continue
            evicted = start_by_evicting(cycle, job, found[key], lambda t: True, left, "preempted")
            attempts.record(job, evicted)
            left -= evicted
            if evicted:
                by_queue, found = _by_queue(cycle, ceilings), {}

    def _ceilings(self, cycle: Cycle) -> dict[str, int]:
        """Per queue, the priority a task must stay below to rank below some pending job of its queue."""
        ceilings: dict[str, int] = {}
        for job in cycle.snapshot.pending:
            ceiling = job.priority + 1 if self.newer_equal_priority else job.priority
            if job.queue not in ceilings or ceiling > ceilings[job.queue]:
                ceilings[job.queue] = ceiling
        return ceilings

    def _may_rank_below(self, job: JobSpec, priority: int) -> bool:
        """Whether a task of `priority` may be a victim of `job` at all."""
        return priority < job.priority or self.newer_equal_priority and priority == job.priority

    def _eligible(self, cycle: Cycle, job: JobSpec, task: RunningTask) -> bool:
        lower = task.priority < job.priority or (
            self.newer_equal_priority and task.priority == job.priority and task.submitted_at > job.submitted_at)
        if task.queue != job.queue or not lower or not task.preemptible:
            return False
        if task.task_id not in cycle.snapshot.running:
            return False  # placed in this cycle
        min_runtime = cycle.tree.specs[task.queue].preempt_min_runtime_s if cycle.tree and task.queue in \
            cycle.tree.specs else 0.0
        return cycle.now - task.started_at >= min_runtime


def _by_queue(cycle: Cycle, ceilings: dict[str, int]) -> dict[str, dict[int, list[RunningTask]]]:
    """The preemptible tasks still running below their queue's ceiling, by queue and priority (a job looks only at
    priorities it may take)."""
    groups: dict[tuple[str, int], list[RunningTask]] = {}
    for task in [t for t in cycle.workspace.still_running()
                 if t.preemptible and t.priority < ceilings.get(t.queue, -math.inf)]:
        key = (task.queue, task.priority)
        group = groups.get(key)
        if group is None:
            groups[key] = [task]
        else:
            group.append(task)
    by_queue: dict[str, dict[int, list[RunningTask]]] = {}
    for (queue, priority), tasks in groups.items():
        by_queue.setdefault(queue, {})[priority] = tasks
    return by_queue
