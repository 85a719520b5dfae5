"""Reservations for blocked jobs (EASY / conservative backfill, gang starvation guard).

A reservation holds whole nodes for a job from its earliest feasible start `start` to
`start + estimate` (ALGORITHMS.md §3.6, node-aware, Slurm-style whole-node holds). Its start is
found on a scratch copy of the node states by releasing running tasks in order of expected end
until the job's mandatory tasks fit, avoiding nodes already held by earlier reservations over the
same interval. Later jobs may use reserved nodes only if they are expected to end by the
reservation's start, so a reservation is never delayed by a backfilled job as long as estimates are
upper bounds. Evicting actions (preempt, reclaim) keep off reserved nodes by the same rule.

A task with no expected end (no estimate, no limit) is planned to run as long again as it has run so
far: the median remaining life of a job that has run for `age` is about `age` (Harchol-Balter &
Downey, 1997). Were it planned never to end, a gang that needs its node would get no reservation and
would starve for as long as such tasks keep landing there.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpupool.core.fit import copies_fit, fitting_gpus, fraction_share, lowest_whole_gpus, node_fits, without
from gpupool.core.framework import Reservation
from gpupool.core.model import DeviceShare, JobSpec, TaskShape
from gpupool.core.nodes import NodeKind, NodeState, NodeTable
from gpupool.core.snapshot import RunningTask

#: the least a task of unknown length is planned to run on
MIN_UNKNOWN_REMAINING_S = 60.0
#: node keys whose copy counts a shape's memo keeps before it starts again
COPIES_MEMO_LIMIT = 100_000
#: shapes (or sets of shapes) a per-table memo keeps before it starts again
SHAPES_MEMO_LIMIT = 256

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle


@dataclass(slots=True)
class _Blocking:
    """`cycle.reservations` indexed by start, for as long as no reservation is added (`size`)."""

    size: int
    #: the reservations' starts, ascending, and their positions in that order (stable)
    starts: list[float]
    by_start: list[int]
    #: per job: the positions of its own reservations
    owned: dict[str, tuple[int, ...]]
    #: answers of `blocking`, per (blocking prefix, own positions, fitting), and nodes per answer
    answers: dict[tuple[int, tuple[int, ...], bool], tuple[int, ...]] = field(default_factory=dict)
    nodes: dict[tuple[int, ...], frozenset[int]] = field(default_factory=dict)


def _blocking_index(cycle: Cycle) -> _Blocking:
    index = cycle.memo.get(_blocking_index)
    reservations = cycle.reservations
    if not isinstance(index, _Blocking) or index.size != len(reservations):
        by_start = sorted(range(len(reservations)), key=lambda k: reservations[k].start)
        owned: dict[str, tuple[int, ...]] = {}
        for k, r in enumerate(reservations):
            owned[r.job_id] = (*owned.get(r.job_id, ()), k)
        index = cycle.memo[_blocking_index] = _Blocking(len(reservations), [reservations[k].start for k in by_start],
                                                        by_start, owned)
    return index


def blocking(cycle: Cycle, job: JobSpec, fitting: bool = False) -> tuple[int, ...]:
    """Positions in `cycle.reservations` (in the order made) of the other jobs' reservations whose nodes `job` must
    keep off if it starts now (`Reservation.blocks`; with `fitting`, `Reservation.blocks_fitting`).

    A reservation blocks a job with an estimate when it starts before now + estimate: those are a prefix of the
    reservations by start, found by one bisection, so the answer is the same for every job of that prefix; it is
    kept until a reservation is added (pending jobs number thousands, reservations a few per queue)."""
    index = _blocking_index(cycle)
    count = index.size if job.estimate_s is None else bisect_left(index.starts, cycle.now + job.estimate_s)
    own = index.owned.get(job.id, ())
    key = (count, own, fitting)
    found = index.answers.get(key)
    if found is None:
        reservations = cycle.reservations
        found = index.answers[key] = tuple(sorted(k for k in index.by_start[:count]
                                                  if k not in own and (reservations[k].firm or not fitting)))
    return found


def held_nodes(cycle: Cycle, job: JobSpec) -> frozenset[int]:
    """The nodes `job` must keep off if it starts now (held by other jobs' blocking reservations)."""
    positions = blocking(cycle, job)
    index = _blocking_index(cycle)
    nodes = index.nodes.get(positions)
    if nodes is None:
        nodes = index.nodes[positions] = frozenset(i for k in positions for i in cycle.reservations[k].nodes)
    return nodes


class ReservationPlan:
    """The reservations of one allocate pass (rebuilt every cycle, so early completions are absorbed).

    They are kept in `cycle.reservations`, where the evicting actions that run later read them.
    """

    def __init__(self, cycle: Cycle, mode: str, max_reservations: int, reserve_after_s: float | None,
                 window_s: float) -> None:
        self.cycle = cycle
        self.mode = mode
        #: regular (head-of-queue) reservations: none without backfill
        self.regular = max_reservations if mode == "easy" else 0
        #: reservations a queue may hold in all, starving jobs included
        self.max_reservations = max(1, max_reservations)
        self.reserve_after_s = reserve_after_s
        self.window_s = window_s
        self.reservations = cycle.reservations
        #: the snapshot's running tasks, their planned ends, and their positions soonest end first (once a cycle)
        self._planned: tuple[list[RunningTask], list[float], list[int]] | None = None
        self._fences: dict[tuple[int, ...], tuple[list[Reservation], frozenset[int]]] = {}

    def fence(self, job: JobSpec) -> tuple[list[Reservation], frozenset[int]]:
        """The reservations `job` must keep off if it starts now, and their schedulable nodes.

        Kept per set of blocking reservations (by position: while allocating, reservations are only added, and no
        node is fenced off, which only evicting actions do), so that each fence's nodes are gathered, and hashed as
        part of `failed` keys, once."""
        reservations = self.reservations
        key = blocking(self.cycle, job, fitting=True)
        found = self._fences.get(key)
        if found is None:
            states = self.cycle.workspace.table.states
            blockers = [reservations[k] for k in key]
            found = self._fences[key] = (blockers, frozenset(i for r in blockers for i in r.nodes
                                                             if states[i].schedulable))
        return found

    def qualifies(self, job: JobSpec) -> bool:
        """EASY: the first blocked jobs up to `max_reservations`; conservative: every blocked job; and any
        job waiting longer than `reserve_after_s` while its queue holds fewer than `max_reservations`."""
        if self.mode == "conservative" or len(self.reservations) < self.regular:
            return True
        waited = self.cycle.now - job.submitted_at
        if self.reserve_after_s is None or waited <= self.reserve_after_s:
            return False
        return sum(1 for r in self.reservations if r.queue == job.queue) < self.max_reservations

    def reserve(self, job: JobSpec) -> Reservation | None:
        """Hold nodes for `job` at its earliest start within the window; None if there is none.

        Tasks are released in order of expected end, only on nodes that could take one of the job's mandatory
        shapes when empty; the exact fit is re-checked only when the number of copies of the job's first shape
        that free nodes could take reaches `min_tasks`.
        """
        estimate = job.estimate_s if job.estimate_s is not None else math.inf
        table, ws, now = self.cycle.workspace.table, self.cycle.workspace, self.cycle.now
        states = list(table.states)
        shape = job.tasks[0].shape
        relevant = _relevant_nodes(table, job)
        copies = _copies(table, relevant, shape)
        total = sum(copies)
        releases = self._releases(relevant)
        upcoming, at, firm = next(releases, None), now, True
        while True:
            released: dict[int, list[tuple[TaskShape, tuple[DeviceShare, ...]]]] = {}
            while upcoming is not None and upcoming[0] <= at:
                task = ws.running(upcoming[1])
                if task is not None:
                    released.setdefault(upcoming[2], []).append((task.shape, task.shares))
                    firm = firm and _ends_as_expected(task, now)
                upcoming = next(releases, None)
            for i, tasks in released.items():  # once per node and time step: many tasks may end at once
                states[i] = without(states[i], tasks)
                fresh = copies_fit(table.kinds[i], states[i], shape)
                total += fresh - copies[i]
                copies[i] = fresh
            if total >= job.min_tasks:
                nodes = self._fit(job, states, copies, self._held(at, at + estimate))
                if nodes is not None:
                    reservation = Reservation(job.id, job.queue, frozenset(nodes), at, at + estimate, firm)
                    self.reservations.append(reservation)
                    return reservation
            if upcoming is None or upcoming[0] - now > self.window_s:
                return None
            at = upcoming[0]

    def _releases(self, relevant: list[bool]) -> Iterator[tuple[float, str, int]]:
        """(planned end, task id, node index) of every task running now on a relevant node, soonest first, read
        lazily: the snapshot's tasks sorted once per cycle, merged with the tasks this cycle placed or moved."""
        ws, now, index = self.cycle.workspace, self.cycle.now, self.cycle.workspace.table.index
        if self._planned is None:  # by planned end only (stable): tasks ending at the same time are released together
            tasks = list(ws.snapshot.running.values())
            ends = [planned_end(t, now) if t.expected_end is None else t.expected_end for t in tasks]
            self._planned = (tasks, ends, np.argsort(np.array(ends, dtype=float), kind="stable").tolist())
        kept = _in_order(*self._planned, relevant, index, ws.overlay)
        overlay = ws.overlay
        fresh = sorted((planned_end(t, now), t.task_id, i) for t in overlay.values()
                       if t is not None and relevant[i := index[t.node]])
        return heapq.merge(kept, fresh) if fresh else kept

    def _held(self, start: float, end: float) -> set[int]:
        return {i for r in self.reservations if r.start < end and start < r.end for i in r.nodes}

    def _fit(self, job: JobSpec, states: list[NodeState], copies: list[int], held: set[int]) -> list[int] | None:
        """Nodes taking the job's mandatory tasks (first fit in name order) on the scratch states; `copies` counts
        the copies of the first task's shape each state could take (when every mandatory task has that shape, only
        nodes with copies can take one)."""
        table = self.cycle.workspace.table
        mandatory = job.tasks[: job.min_tasks]
        if all(task.shape == mandatory[0].shape for task in mandatory):
            candidates: Sequence[int] = [i for i, c in enumerate(copies) if c]
        else:
            candidates = range(len(table))
        scratch: dict[int, NodeState] = {}
        chosen: list[int] = []
        for task in mandatory:
            i = _first_fit(table.kinds, states, candidates, scratch, held, task.shape)
            if i is None:
                return None
            state = scratch.get(i, states[i].with_schedulable(True))
            scratch[i] = state.take(task.shape, _any_shares(state, task.shape))
            chosen.append(i)
        return chosen


def _in_order(tasks: list[RunningTask], ends: list[float], order: list[int], relevant: list[bool],
              index: dict[str, int], overlay: dict[str, RunningTask | None]) -> Iterator[tuple[float, str, int]]:
    """(planned end, task id, node index) of `tasks` in `order`, those on relevant nodes that this cycle has not
    moved or evicted (the overlay's word on them is read separately)."""
    for k in order:
        task = tasks[k]
        i = index[task.node]
        if relevant[i] and task.task_id not in overlay:
            yield ends[k], task.task_id, i


def _copies(table: NodeTable, relevant: list[bool], shape: TaskShape) -> list[int]:
    """Per node: how many copies of `shape` its current state could take (0 on nodes not relevant); counted
    once per table key (a (kind, state) pair) and kept in the table across cycles, since a key never names
    another pair."""
    by_key = _memo(table, _copies).setdefault(shape, {})
    assert isinstance(by_key, dict)
    if len(by_key) > COPIES_MEMO_LIMIT:
        by_key.clear()
    copies = []
    for i, key in enumerate(table.keys):
        if not relevant[i]:
            copies.append(0)
            continue
        count = by_key.get(key)
        if count is None:
            count = by_key[key] = copies_fit(table.kinds[i], table.states[i], shape)
        copies.append(count)
    return copies


def _relevant_nodes(table: NodeTable, job: JobSpec) -> list[bool]:
    """Per node: could it take one of the job's mandatory shapes were it empty? Only these nodes matter. Kept in
    the table per set of shapes (a table's node kinds never change)."""
    shapes = frozenset(task.shape for task in job.tasks[: job.min_tasks])
    memo = _memo(table, _relevant_nodes)
    if shapes not in memo:
        kinds = table.kinds
        by_kind = {kind: any(copies_fit(kind, NodeState.empty(kind), s) for s in shapes) for kind in set(kinds)}
        memo[shapes] = [by_kind[kind] for kind in kinds]
    relevant = memo[shapes]
    assert isinstance(relevant, list)
    return relevant


def _memo(table: NodeTable, owner: object) -> dict[Hashable, object]:
    """`owner`'s memo in the table, per shape or set of shapes, started again past `SHAPES_MEMO_LIMIT` of them."""
    memo = table.derived.setdefault(owner, {})
    assert isinstance(memo, dict)
    if len(memo) > SHAPES_MEMO_LIMIT:
        memo.clear()
    return memo


def planned_end(task: RunningTask, now: float) -> float:
    """When a reservation plans `task` to end: its expected end, else `now` plus its age so far
    (at least `MIN_UNKNOWN_REMAINING_S`)."""
    if task.expected_end is not None:
        return task.expected_end
    return now + max(MIN_UNKNOWN_REMAINING_S, now - task.started_at)


def _ends_as_expected(task: RunningTask, now: float) -> bool:
    """Whether `task`'s planned end is an expected end still ahead (not a guess that moves with its age, nor an
    estimate it has already outrun)."""
    return task.expected_end is not None and task.expected_end > now


def _first_fit(kinds: tuple[NodeKind, ...], states: list[NodeState], candidates: Sequence[int],
               scratch: dict[int, NodeState], held: set[int], shape: TaskShape) -> int | None:
    for i in candidates:
        if i in held or not states[i].schedulable:
            continue
        if not node_fits(kinds[i], scratch.get(i, states[i]), shape):
            return i
    return None


def _any_shares(state: NodeState, shape: TaskShape) -> tuple[DeviceShare, ...]:
    if shape.is_shared:
        return fraction_share(shape, fitting_gpus(state, shape)[0])
    return lowest_whole_gpus(state, shape)
