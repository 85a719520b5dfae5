"""Tentative changes inside a cycle, with checkpoint, rollback and commit.

`Workspace` is the cycle's mutable view over a snapshot: it changes the snapshot's node table in
place, tracks tasks placed and evicted in this cycle, and journals every change so that `restore()`
returns the snapshot to exactly what the cycle received.

A `Statement` is one transaction on the workspace. State machine::

    OPEN --commit()--> COMMITTED      (its decisions are kept; its changes stay until restore())
    OPEN --discard()-> DISCARDED      (its changes are undone)

Used as a context manager it discards on exit unless committed. Invariant (property-tested): after
`rollback(cp)` the node table and task sets are exactly as they were when `cp` was taken.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from types import TracebackType

from gpupool.core.decisions import Bind, Decision, Evict, Move
from gpupool.core.model import DeviceShare, JobSpec, TaskShape, TaskSpec
from gpupool.core.nodes import NodeState
from gpupool.core.quota import add_usage
from gpupool.core.resources import ResourceVector
from gpupool.core.snapshot import ClusterSnapshot, RunningTask

_NODE, _TASK, _USAGE = 0, 1, 2
_ABSENT = object()


class Workspace:
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.table = snapshot.nodes
        #: task id -> the task as it runs now in this cycle, or None when evicted in this cycle
        self.overlay: dict[str, RunningTask | None] = {}
        self.journal: list[tuple[int, object, object]] = []
        self.tree = snapshot.queues
        self._snapshot_jobs: dict[str, list[str]] | None = None  # job id -> its task ids running at the start
        #: job id -> ids of its tasks ever set in `overlay` in this cycle (a superset: undone entries stay)
        self._overlay_jobs: dict[str, set[str]] = {}
        #: resources in use per queue (leaf and ancestors), kept in step with every change
        self.usage: dict[str, ResourceVector] = {}
        #: bumped by every change to `usage` (undone ones too): equal values mean equal usage
        self.usage_seq = 0
        #: per resource, all the usage ever added in this cycle (never lowered): no queue's admission room
        #: shrinks by more than this grows (`quota.headroom`)
        self.growth: dict[str, int] = {}
        if self.tree is not None and snapshot.queue_usage is not None:
            self.usage = dict(snapshot.queue_usage)
        elif self.tree is not None:
            for task in snapshot.running.values():
                if task.queue in self.tree.paths:
                    add_usage(self.usage, self.tree, task.queue, self.charge_of(task))

    def charge_of(self, task: RunningTask) -> ResourceVector:
        """What a running task counts against its queues (GPU units depend on the node's model)."""
        assert self.tree is not None
        model = self.table.kinds[self.table.index[task.node]].model
        return self.tree.charge(task.shape, task.shares, model, task.preemptible)

    def account(self, task: RunningTask, sign: int) -> None:
        """Add (1) or remove (-1) a task's charge on its queue path, journaled."""
        if self.tree is None or task.queue not in self.tree.paths:
            return
        for name in self.tree.paths[task.queue]:
            self.journal.append((_USAGE, name, self.usage.get(name, _ABSENT)))
        self.usage_seq += 1
        charge = self.charge_of(task)
        add_usage(self.usage, self.tree, task.queue, charge, sign)
        if sign > 0:
            for resource, amount in charge.items():
                self.growth[resource] = self.growth.get(resource, 0) + amount

    def running(self, task_id: str) -> RunningTask | None:
        """A task running as of now in this cycle (placed or moved here, or running and not evicted)."""
        if task_id in self.overlay:
            return self.overlay[task_id]
        return self.snapshot.running.get(task_id)

    def still_running(self) -> list[RunningTask]:
        """Every task that ran when the cycle began and still runs now (as it runs now, moved or not), in the
        snapshot's order: callers that rank tasks must not depend on it."""
        overlay, running = self.overlay, self.snapshot.running
        if not overlay:
            return list(running.values())
        return [t for i, s in running.items() if (t := overlay.get(i, s)) is not None]

    def job_tasks(self, job_id: str) -> list[RunningTask]:
        """Every task of `job_id` running as of now in this cycle, in task-id order."""
        if self._snapshot_jobs is None:
            self._snapshot_jobs = {}
            for task in self.snapshot.running.values():
                self._snapshot_jobs.setdefault(task.job_id, []).append(task.task_id)
        ids = set(self._snapshot_jobs.get(job_id, ()))
        ids.update(self._overlay_jobs.get(job_id, ()))
        return [t for t in (self.running(i) for i in sorted(ids)) if t is not None]

    def set_node(self, i: int, state: NodeState) -> None:
        self._journal_node(i)
        self.table.set_state(i, state)

    def take(self, i: int, shape: TaskShape, shares: tuple[DeviceShare, ...]) -> None:
        """Place a task of `shape` on node i's `shares` (ValueError if it does not fit), journaled."""
        self._journal_node(i)
        self.table.take(i, shape, shares)

    def _journal_node(self, i: int) -> None:
        """Remember node i's state, and its key under the table's numbering now (undo sets it back unnamed)."""
        table = self.table
        self.journal.append((_NODE, i, (table.states[i], table.keys[i], table.numbering)))

    def set_task(self, task_id: str, task: RunningTask | None) -> None:
        self.journal.append((_TASK, task_id, self.overlay.get(task_id, _ABSENT)))
        self.overlay[task_id] = task
        if task is not None:
            self._overlay_jobs.setdefault(task.job_id, set()).add(task_id)

    def undo_to(self, mark: int) -> None:
        """Undo journal entries after position `mark`, newest first."""
        while len(self.journal) > mark:
            kind, key, old = self.journal.pop()
            if kind == _NODE:
                assert isinstance(key, int) and isinstance(old, tuple)
                state, node_key, numbering = old
                self.table.set_state(key, state, node_key if numbering == self.table.numbering else None)
            elif kind == _USAGE:
                self.usage_seq += 1
                if old is _ABSENT:
                    del self.usage[str(key)]
                else:
                    assert isinstance(old, ResourceVector)
                    self.usage[str(key)] = old
            elif old is _ABSENT:
                del self.overlay[str(key)]
            else:
                assert old is None or isinstance(old, RunningTask)
                self.overlay[str(key)] = old

    def restore(self) -> None:
        self.undo_to(0)


class StatementState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    DISCARDED = "discarded"


class Statement:
    def __init__(self, workspace: Workspace, now: float) -> None:
        self.ws = workspace
        self.now = now
        self.state = StatementState.OPEN
        self._start = len(workspace.journal)
        self._ops: list[Decision] = []

    def __enter__(self) -> Statement:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.state is StatementState.OPEN:
            self.discard()

    def allocate(self, job: JobSpec, task: TaskSpec, node: int, shares: tuple[DeviceShare, ...]) -> None:
        """Place `task` on node index `node` with `shares`; raises ValueError if it does not fit."""
        self._check_open()
        self.ws.take(node, task.shape, shares)
        name = self.ws.table.names[node]
        estimate = job.estimate_s
        placed = RunningTask(task.id, job.id, name, task.shape, shares, job.queue, job.priority, job.preemptible,
                             self.now, job.checkpointable, None if estimate is None else self.now + estimate,
                             job.submitted_at)
        self.ws.set_task(task.id, placed)
        self.ws.account(placed, +1)
        self._ops.append(Bind(job.id, task.id, name, task.shape, shares))

    def evict(self, task: RunningTask, reason: str) -> None:
        """Free the resources of a running `task`."""
        self._check_open()
        i = self.ws.table.index[task.node]
        self.ws.set_node(i, self.ws.table.states[i].give(task.shape, task.shares))
        self.ws.account(task, -1)
        self.ws.set_task(task.task_id, None)
        self._ops.append(Evict(task.job_id, task.task_id, task.node, reason))

    def move(self, task: RunningTask, node: int, shares: tuple[DeviceShare, ...]) -> RunningTask:
        """Move a running `task` to node index `node`; returns the task as placed there."""
        self._check_open()
        table = self.ws.table
        old = table.index[task.node]
        self.ws.set_node(old, table.states[old].give(task.shape, task.shares))
        self.ws.take(node, task.shape, shares)
        moved = replace(task, node=table.names[node], shares=shares)
        self.ws.account(task, -1)
        self.ws.set_task(task.task_id, moved)
        self.ws.account(moved, +1)
        self._ops.append(Move(task.job_id, task.task_id, task.node, moved.node, task.shape, shares))
        return moved

    def set_schedulable(self, node: int, schedulable: bool) -> None:
        """Fence a node off (or back on) for the rest of this statement, e.g. while making room on it."""
        self._check_open()
        self.ws.set_node(node, self.ws.table.states[node].with_schedulable(schedulable))

    def checkpoint(self) -> tuple[int, int]:
        return (len(self.ws.journal), len(self._ops))

    def rollback(self, checkpoint: tuple[int, int]) -> None:
        self._check_open()
        self.ws.undo_to(checkpoint[0])
        del self._ops[checkpoint[1]:]

    def commit(self) -> list[Decision]:
        self._check_open()
        self.state = StatementState.COMMITTED
        return list(self._ops)

    def discard(self) -> None:
        self._check_open()
        self.ws.undo_to(self._start)
        self._ops.clear()
        self.state = StatementState.DISCARDED

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return tuple(self._ops)

    def _check_open(self) -> None:
        if self.state is not StatementState.OPEN:
            raise RuntimeError(f"statement is {self.state.value}")
