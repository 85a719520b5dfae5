"""SimCluster: the simulator's cluster state, and the `DecisionSink` that applies cycle decisions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpupool.core import ApplyReport, Bind, ClusterSnapshot, Decision, Evict, JobSpec, NodeSpec, NodeTable, RunningTask
from gpupool.core.decisions import Move


class SimCluster:
    """Nodes, running tasks and allocated milli-GPU; changed only by `apply`."""

    def __init__(self, nodes: Iterable[NodeSpec]) -> None:
        self.table = NodeTable(nodes)
        self.running: dict[str, RunningTask] = {}
        self.capacity_gpu_milli = self.table.total_gpu_milli
        self.allocated_gpu_milli = 0
        self.generation = 0

    def snapshot(self, pending: tuple[JobSpec, ...], now: float,
                 recent_moves: tuple[float, ...] = ()) -> ClusterSnapshot:
        return ClusterSnapshot(self.table, pending, self.running, self.generation, now, recent_moves)

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
        self.table.set_state(i, self.table.states[i].take(bind.shape, bind.shares))
        job = jobs.get(bind.job_id) if jobs else None
        self.running[bind.task_id] = RunningTask(
            bind.task_id, bind.job_id, bind.node, bind.shape, bind.shares,
            job.queue if job else "default", job.priority if job else 0,
            job.preemptible if job else True, now, job.checkpointable if job else False)
        self.allocated_gpu_milli += bind.shape.total_gpu_milli

    def _move(self, move: Move) -> None:
        """The task keeps running (checkpoint and resume) on its new node and devices."""
        task = self.release(move.task_id)
        i = self.table.index[move.node]
        self.table.set_state(i, self.table.states[i].take(move.shape, move.shares))
        self.running[move.task_id] = replace(task, node=move.node, shares=move.shares)
        self.allocated_gpu_milli += move.shape.total_gpu_milli

    def _evict(self, evict: Evict) -> None:
        self.release(evict.task_id)

    def release(self, task_id: str) -> RunningTask:
        """A task ends or is evicted: free its node resources."""
        task = self.running.pop(task_id)
        i = self.table.index[task.node]
        self.table.set_state(i, self.table.states[i].give(task.shape, task.shares))
        self.allocated_gpu_milli -= task.shape.total_gpu_milli
        return task
