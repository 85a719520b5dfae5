"""Reclaim (across queues): a pending job of a queue that is under its fair share takes back GPUs
that other queues borrowed (KAI semantics, ALGORITHMS.md §4.4).

A job J of leaf queue R may evict only if R's GPU units plus J's demand stay within R's fair share.
A victim job of queue V qualifies only if, at the level where the paths of R and V part (the two
sibling ancestors), V's side still holds at least its allocatable share min(limit, max(guaranteed,
fair share)) once the whole victim job is gone — re-checked before each eviction.

This is stricter than KAI, which only asks that V's side be above its share *before* each victim goes:
with gangs, that lets one reclaim evict a 4-GPU job to free 1 GPU, pushing V far under its share, and the
next cycle V reclaims back (a reclaim cycle, found by the Hypothesis test). Here, after a reclaim R is
within its fair share and V is not under its own, so neither can take from the other in turn
(property-tested). For 1-GPU victims both rules evict the same jobs (ALGORITHMS.md §4.4 cases 9-11).

`guarantee_deserved_quota=True` adds KAI's second strategy, with the same after-removal check: a job whose
side of the tree stays within its guaranteed quota with it may also take victims whose side keeps its own
guaranteed quota, even below its fair share. Without it a guarantee is not one when idle pieces that no
pending job fits leave every side short of its fair share (on the README's openb replay, inference, within
its guarantee, waited 11.5 h for a 40-GPU gang). The `fair-share` profile turns it on; `drf` does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpupool.core.actions.evicting import Attempts, start_by_evicting
from gpupool.core.framework import Action
from gpupool.core.model import JobSpec
from gpupool.core.queues import GPU_UNITS, QueueTree
from gpupool.core.quota import demand_units
from gpupool.core.resources import EMPTY
from gpupool.core.snapshot import RunningTask

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle


class ReclaimAction(Action):
    name = "reclaim"

    def __init__(self, max_victims: int = 16, max_attempts: int = 8, guarantee_deserved_quota: bool = False) -> None:
        if max_victims < 0 or max_attempts < 0:
            raise ValueError("reclaim: max_victims and max_attempts must be >= 0")
        if not isinstance(guarantee_deserved_quota, bool):
            raise ValueError("reclaim: guarantee_deserved_quota must be true or false")
        self.max_victims = max_victims
        self.max_attempts = max_attempts
        self.guarantee_deserved_quota = guarantee_deserved_quota

    def execute(self, cycle: Cycle) -> None:
        tree = cycle.tree
        if tree is None:
            return
        left, attempts = self.max_victims, Attempts(self.max_attempts)
        # Running tasks, victims and job sizes are gathered when a first job may reclaim (most cycles have none).
        units: _JobUnits | None = None
        # listed for the first job that may reclaim, kept for the whole cycle
        evictable: list[RunningTask] | None = None
        # per reclaiming queue: the evictable tasks of other queues and their queues, listed once; tasks evicted
        # since stay in the list (making room skips what no longer runs), so the list and its grouping are reused
        others: dict[str, tuple[list[RunningTask], frozenset[str]]] = {}
        for job in cycle.pending_order():
            if left <= 0 or attempts.exhausted:
                return
            if job.queue not in tree.specs or attempts.known_to_fail(job) or not _under_share(cycle, job):
                continue
            if evictable is None or units is None:
                units = _JobUnits(cycle)
                evictable = _evictable(cycle, tree)
            listed = others.get(job.queue)
            if listed is None:
                candidates = [t for t in evictable if t.queue != job.queue]
                listed = others[job.queue] = (candidates, frozenset(t.queue for t in candidates))
            candidates, victim_queues = listed
            if any(cycle.workspace.running(t.task_id) is not None for t in candidates):
                may_take = _KeepsShare(cycle, tree, job, units, self.guarantee_deserved_quota)
                if may_take.refuses_all(victim_queues):
                    candidates = []  # no search: it would find no node (the job may still start where it fits)
                evicted = start_by_evicting(cycle, job, candidates, may_take, left, "reclaimed")
                attempts.record(job, evicted)
                left -= evicted


def _under_share(cycle: Cycle, job: JobSpec) -> bool:
    assert cycle.tree is not None
    used, share = cycle.workspace.usage.get(job.queue, EMPTY)[GPU_UNITS], cycle.fair_shares.get(job.queue, 0)
    return used <= share and used + demand_units(job, cycle.tree) <= share  # a demand is never negative


def _evictable(cycle: Cycle, tree: QueueTree) -> list[RunningTask]:
    """The tasks any other queue's job may reclaim: running when the cycle began and still, preemptible, and run
    for their queue's minimum (no minimum outside the tree)."""
    now, least = cycle.now, {name: spec.reclaim_min_runtime_s for name, spec in tree.specs.items()}
    return [t for t in cycle.workspace.still_running()
            if t.preemptible and now - t.started_at >= least.get(t.queue, -math.inf)]


def diverging_queue(tree: QueueTree, reclaimer: str, victim: str) -> str:
    """The victim's ancestor (or itself) that is a sibling of the reclaimer's side of the tree."""
    mine = set(tree.paths[reclaimer])
    previous = victim
    for name in tree.paths[victim]:
        if name in mine:
            return previous
        previous = name
    return tree.paths[victim][-1]


class _KeepsShare:
    """May this victim be taken for `job`? Judged on the two sibling sides where the reclaimer's and the
    victim's paths part, once the whole victim job is gone, by KAI's MaintainFairShare (the victim's side keeps
    its allocatable share min(limit, max(guaranteed, fair share))) or, if `guarantee`, its
    GuaranteeDeservedQuota (the reclaimer's side stays within its guaranteed quota with the job, and the
    victim's side keeps its own)."""

    def __init__(self, cycle: Cycle, tree: QueueTree, job: JobSpec, units: _JobUnits, guarantee: bool) -> None:
        self.cycle, self.tree, self.job, self.units, self.guarantee = cycle, tree, job, units, guarantee
        # the reclaimer's side as it stands before the job: its own tasks placed while room is made are its demand
        demand = demand_units(job, tree) if guarantee else 0
        self.with_job = {q: self._used(q) + demand for q in tree.paths[job.queue]} if guarantee else {}
        self.floors: dict[str, tuple[str, int]] = {}

    def __call__(self, task: RunningTask) -> bool:
        if task.queue not in self.tree.specs:
            return True
        slack = self._slack(task.queue)
        return slack >= 0 and self.units(task.job_id) <= slack

    def refuses_all(self, queues: Iterable[str]) -> bool:
        """Whether every task of `queues` is refused whatever its job holds (it stays so as victims go)."""
        return all(q in self.tree.specs and self._slack(q) < 0 for q in queues)

    def _slack(self, victim_queue: str) -> int:
        """The most GPU units a victim job of `victim_queue` may hold: what its side holds above the least it
        must keep (negative when it must keep more than it holds)."""
        floor = self.floors.get(victim_queue)
        if floor is None:
            floor = self.floors[victim_queue] = self._floor(victim_queue)
        side, least = floor
        return self._used(side) - least

    def _floor(self, victim_queue: str) -> tuple[str, int]:
        """(the victim's side, the least it must keep: its share by MaintainFairShare, or its guaranteed quota
        where GuaranteeDeservedQuota applies and that is less), fixed for the job within the cycle."""
        side = diverging_queue(self.tree, self.job.queue, victim_queue)
        spec = self.tree.specs[side]
        guaranteed = spec.guaranteed[GPU_UNITS]
        share = max(guaranteed, self.cycle.fair_shares.get(side, 0))
        if spec.limit is not None and GPU_UNITS in spec.limit:
            share = min(share, spec.limit[GPU_UNITS])
        mine = diverging_queue(self.tree, victim_queue, self.job.queue)
        within = self.guarantee and self.with_job[mine] <= self.tree.specs[mine].guaranteed[GPU_UNITS]
        return side, min(share, guaranteed) if within else share

    def _used(self, queue: str) -> int:
        used = self.cycle.workspace.usage.get(queue)
        return 0 if used is None else used[GPU_UNITS]


class _JobUnits:
    """GPU units each running job holds (victims are evicted whole), computed when first asked: a job's
    running tasks do not change within the cycle except by eviction, after which it is never asked again."""

    def __init__(self, cycle: Cycle) -> None:
        self.workspace = cycle.workspace
        self.memo: dict[str, int] = {}

    def __call__(self, job_id: str) -> int:
        if job_id not in self.memo:
            ws = self.workspace
            self.memo[job_id] = sum(ws.charge_of(t)[GPU_UNITS] for t in ws.job_tasks(job_id))
        return self.memo[job_id]
