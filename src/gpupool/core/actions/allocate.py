"""Allocate: place pending jobs in queue order, each gang all-or-nothing, under quotas, with optional
reservations so that big jobs are not starved (EASY or conservative backfill).

For each job the queue-order plugin hands out, in one Statement:

1. keep off the nodes that earlier reservations hold, unless the job is expected to end before them;
2. place its tasks one by one on the placement engine's best node (a shape that found no node is not
   retried until a node changes);
3. check the job's queues may hold it (limits, borrowing, lending, guarantees);
4. commit, or discard and record why; a blocked job that qualifies gets a reservation.

Why a job did not start is told at the end of the pass, on the nodes as the pass leaves them (reservations
alone, or why no node fits, counted once per (shape, fence)): allocating only fills nodes, so a shape that
fitted nowhere still fits nowhere, and the reason a job shows is the one that holds after the cycle. Only a
job about to get a reservation is checked at once, since a job held off by reservations alone gets none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.core.actions.reservations import ReservationPlan
from gpupool.core.diagnostics import PendingKind, PendingReason, iso_utc, no_node_fits
from gpupool.core.framework import Action, Reservation
from gpupool.core.model import JobSpec, TaskShape
from gpupool.core.statement import Statement

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle

BACKFILL_MODES = ("none", "easy", "conservative")
#: the (shape, fence) pairs no node took on the committed nodes; they stay failed for the rest of the pass, since
#: allocating only fills nodes
Failed = set[tuple[TaskShape, frozenset[int]]]
#: the reason given to jobs that reservations alone hold off, per reservation holder
Told = dict[str, PendingReason]
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Stuck:
    """A job no node set could take: its first unplaced task's index and shape, and the nodes it was kept off."""

    task_index: int
    shape: TaskShape
    fenced: frozenset[int]


class AllocateAction(Action):
    name = "allocate"

    def __init__(self, backfill: str = "none", max_reservations: int = 1, reserve_after_s: float | None = None,
                 window_s: float = 7 * DAY_S) -> None:
        if backfill not in BACKFILL_MODES:
            raise ValueError(f"allocate: backfill must be one of {', '.join(BACKFILL_MODES)}")
        if max_reservations < 0 or window_s <= 0:
            raise ValueError("allocate: max_reservations must be >= 0 and window_s > 0")
        self.backfill = backfill
        self.max_reservations = max_reservations
        self.reserve_after_s = reserve_after_s
        self.window_s = window_s

    def execute(self, cycle: Cycle) -> None:
        plan = None
        if self.backfill != "none" or self.reserve_after_s is not None:
            plan = ReservationPlan(cycle, self.backfill, self.max_reservations, self.reserve_after_s, self.window_s)
        failed: Failed = set()
        stuck: dict[str, tuple[JobSpec, Stuck]] = {}
        told: Told = {}
        for job in cycle.pending_order():
            blockers, fenced = plan.fence(job) if plan else ([], frozenset[int]())
            reason = _try(cycle, job, fenced, failed)
            if reason is None:
                continue
            if isinstance(reason, Stuck):
                if plan is not None and plan.qualifies(job):  # held off by reservations only: no reservation
                    if reason.fenced and _fits_unfenced(cycle, job, failed):
                        cycle.block(job, _reserved_for(blockers, told))
                        continue
                    reservation = plan.reserve(job)
                    if reservation is not None:
                        cycle.block(job, _waiting_for(cycle, reservation))
                        continue
                stuck[job.id] = (job, reason)
                continue
            cycle.block(job, reason)
        _explain(cycle, stuck.values(), plan, told)


def _try(cycle: Cycle, job: JobSpec, fenced: frozenset[int], failed: Failed) -> PendingReason | Stuck | None:
    """Start `job` now if it fits off the `fenced` nodes (held by blocking reservations) and under quota; else why
    not (`Stuck`: no node set takes it, explained at the end of the pass)."""
    precheck = cycle.quota_precheck(job)
    if precheck:
        return PendingReason(PendingKind.OVER_QUOTA, precheck)
    if (job.tasks[0].shape, fenced) in failed:  # what placing would find (min_tasks >= 1), without a statement
        return Stuck(0, job.tasks[0].shape, fenced)
    before = cycle.usage_mark(job.queue)
    with cycle.statement() as stmt:
        stuck = place_gang(cycle, job, stmt, failed, fenced)
        if stuck is None:
            quota = cycle.quota_reason(job, before)
            if quota:
                return PendingReason(PendingKind.OVER_QUOTA, quota)
            cycle.emit(job, stmt.commit())
            return None
    return stuck


def _reserved_for(blockers: list[Reservation], told: Told) -> PendingReason:
    """Why a job held off by `blockers` alone waits: the soonest of them (one reason per holder, shared)."""
    holder = min(blockers, key=lambda r: r.start)
    reason = told.get(holder.job_id)
    if reason is None:
        reason = told[holder.job_id] = PendingReason(
            PendingKind.RESERVED_FOR, f"the nodes it fits on are reserved for job {holder.job_id} from "
                                      f"{iso_utc(holder.start)}", at=holder.start, holder=holder.job_id)
    return reason


def _fits_unfenced(cycle: Cycle, job: JobSpec, failed: Failed) -> bool:
    """Whether `job` would start now off no reservation: a lone task asks the placement engine, a gang is placed
    in a statement that is then discarded."""
    if len(job.tasks) == 1:
        table, key = cycle.workspace.table, (job.tasks[0].shape, frozenset[int]())
        if key in failed:
            return False
        if cycle.plugins.placer.choose(table, key[0], cycle.rng) is not None:
            return True
        failed.add(key)
        return False
    with cycle.statement() as stmt:
        return _place_tasks(cycle, job, stmt, failed, frozenset()) is None


def _waiting_for(cycle: Cycle, reservation: Reservation) -> PendingReason:
    """A job that holds a reservation: from when (a guess that may move later, unless its start is firm), and the
    jobs running on the reserved nodes, whose ends it waits for (the first is the reason's holder)."""
    index = cycle.workspace.table.index
    holders = sorted({t.job_id for t in cycle.workspace.snapshot.running.values()
                      if index[t.node] in reservation.nodes})
    more = f" and {len(holders) - 1} more" if len(holders) > 1 else ""
    waits = f", when job {holders[0]}{more} running there ends" if holders else ""
    guess = "" if reservation.firm else (" (a guess: it waits for tasks of unknown length or past their estimate, "
                                         "so it holds nothing against jobs that fit now)")
    return PendingReason(PendingKind.BACKFILL_WINDOW, f"holds a reservation on {len(reservation.nodes)} node(s) from "
                                                      f"{iso_utc(reservation.start)}{waits}{guess}",
                         at=reservation.start, holder=holders[0] if holders else "")


def place_gang(cycle: Cycle, job: JobSpec, stmt: Statement, failed: Failed,
               fenced: frozenset[int] = frozenset()) -> Stuck | None:
    """Place `job`'s tasks in `stmt` off the `fenced` nodes; None when at least `min_tasks` are placed, else
    where it got stuck.

    `failed` holds the (shape, fence) pairs no node took on the committed nodes, to skip identical retries.
    """
    stuck = _place_tasks(cycle, job, stmt, failed, fenced)
    return None if stuck is None else Stuck(stuck[0], stuck[1], fenced)


def _explain(cycle: Cycle, stuck: Iterable[tuple[JobSpec, Stuck]], plan: ReservationPlan | None,
             told_reserved: Told) -> None:
    """Block each stuck job with why no node takes it, on the nodes now: reservations alone (it fits off them), or
    why no node takes its task, counted once per (shape, fence). Only a job kept off reservations (by `plan`) has
    a fence."""
    placer, table = cycle.plugins.placer, cycle.workspace.table
    why: dict[tuple[TaskShape, frozenset[int]], list[tuple[str, int]]] = {}
    told: dict[tuple[TaskShape, frozenset[int], int, int], PendingReason] = {}  # jobs of one shape share a reason
    fits: dict[tuple[int, tuple[TaskShape, ...]], bool] = {}  # the nodes no longer change: once per gang shape
    for job, s in stuck:
        if s.fenced:
            gang = (job.min_tasks, tuple(task.shape for task in job.tasks))
            if gang not in fits:
                fits[gang] = _fits_unfenced(cycle, job, set())
            if fits[gang]:
                assert plan is not None
                cycle.block(job, _reserved_for(plan.fence(job)[0], told_reserved))
                continue
        key = (s.shape, s.fenced)
        reason = told.get((*key, s.task_index, len(job.tasks)))
        if reason is None:
            if key not in why:
                why[key] = placer.explain(table, s.shape, s.fenced)
            reason = told[(*key, s.task_index, len(job.tasks))] = no_node_fits(len(table), why[key], s.task_index,
                                                                               len(job.tasks))
        cycle.block(job, reason)


def _place_tasks(cycle: Cycle, job: JobSpec, stmt: Statement, failed: Failed,
                 fenced: frozenset[int]) -> tuple[int, TaskShape] | None:
    """None when at least `min_tasks` of the job's tasks are placed, else (index, shape) of the first task that
    no node takes."""
    placer, table = cycle.plugins.placer, cycle.workspace.table
    for k, task in enumerate(job.tasks):
        key = (task.shape, fenced)
        if key not in failed:
            i = placer.choose(table, task.shape, cycle.rng, fenced)
            if i is not None:
                stmt.allocate(job, task, i, placer.pick(table, i, task.shape, cycle.rng))
                continue
            if k == 0:  # on the committed nodes (a later task fails beside its gang's tentative placements)
                failed.add(key)
        return None if k >= job.min_tasks else (k, task.shape)
    return None
