"""SimCluster: the simulator's cluster state, and the `DecisionSink` that applies cycle decisions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction

from gpupool.core import ApplyReport, Bind, ClusterSnapshot, Decision, Evict, JobSpec, NodeSpec, NodeTable, RunningTask
from gpupool.core.decisions import Move
from gpupool.core.queues import QueueTree
from gpupool.core.quota import add_usage
from gpupool.core.resources import ResourceVector


class SimCluster:
    """Nodes, running tasks and allocated milli-GPU; changed only by `apply`."""

    def __init__(self, nodes: Iterable[NodeSpec], queues: QueueTree | None = None) -> None:
        self.table = NodeTable(nodes)
        self.running: dict[str, RunningTask] = {}
        self.capacity_gpu_milli = self.table.total_gpu_milli
        self.allocated_gpu_milli = 0
        self.generation = 0
        self.queues = queues
        #: resources in use per queue (leaf and ancestors), kept in step with every bind and release
        self.usage: dict[str, ResourceVector] = {}

    def snapshot(self, pending: tuple[JobSpec, ...], now: float, recent_moves: tuple[float, ...] = (),
                 usage_history: Mapping[str, Fraction] | None = None) -> ClusterSnapshot:
        return ClusterSnapshot(self.table, pending, self.running, self.generation, now, recent_moves, self.queues,
                               usage_history or {}, self.usage if self.queues else None)

    def _account(self, task: RunningTask, sign: int) -> None:
        if self.queues is None or task.queue not in self.queues.paths:
            return
        model = self.table.kinds[self.table.index[task.node]].model
        add_usage(self.usage, self.queues, task.queue,
                  self.queues.charge(task.shape, task.shares, model, task.preemptible), sign)

    def apply(self, decisions: list[Decision], now: float = 0.0, jobs: dict[str, JobSpec] | None = None) -> ApplyReport:
        """Apply binds and evictions in order. Every decision of a cycle applies (the simulator has no races)."""
        for decision in decisions:
            if isinstance(decision, Bind):
                self._bind(decision, now, jobs)
            elif isinstance(decision, Evict):
                self._evict(decision)
            else:
                self._move(decision)
        self.generation += 1
        return ApplyReport(tuple(decisions))

    def _bind(self, bind: Bind, now: float, jobs: dict[str, JobSpec] | None) -> None:
        i = self.table.index[bind.node]
        self.table.take(i, bind.shape, bind.shares)
        job = jobs.get(bind.job_id) if jobs else None
        estimate = job.estimate_s if job else None
        task = RunningTask(bind.task_id, bind.job_id, bind.node, bind.shape, bind.shares,
                           job.queue if job else "default", job.priority if job else 0,
                           job.preemptible if job else True, now, job.checkpointable if job else False,
                           None if estimate is None else now + estimate, job.submitted_at if job else 0.0)
        self.running[bind.task_id] = task
        self._account(task, +1)
        self.allocated_gpu_milli += bind.shape.total_gpu_milli

    def _move(self, move: Move) -> None:
        """The task keeps running (checkpoint and resume) on its new node and devices."""
        task = self.release(move.task_id)
        i = self.table.index[move.node]
        self.table.take(i, move.shape, move.shares)
        moved = replace(task, node=move.node, shares=move.shares)
        self.running[move.task_id] = moved
        self._account(moved, +1)
        self.allocated_gpu_milli += move.shape.total_gpu_milli

    def _evict(self, evict: Evict) -> None:
        self.release(evict.task_id)

    def release(self, task_id: str) -> RunningTask:
        """A task ends or is evicted: free its node resources."""
        task = self.running.pop(task_id)
        self._account(task, -1)
        i = self.table.index[task.node]
        self.table.set_state(i, self.table.states[i].give(task.shape, task.shares))
        self.allocated_gpu_milli -= task.shape.total_gpu_milli
        return task
