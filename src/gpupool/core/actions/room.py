"""Making room on one node for a task that fits nowhere: by moving tasks away (consolidate) or by
evicting whole jobs (preempt, reclaim). Shared by those actions; every change goes through the
caller's Statement, and a candidate node that does not work out is rolled back.

Candidates are the nodes where the task would fit if every victim task on them that `may_take` allows now
were gone: at most `CANDIDATE_NODES` of the first `LOOKED_NODES` nodes that would fit it with all their victims
gone, in order of least victim GPU on them, then name, each tried as soon as it is found. On a candidate, its
victims (in the caller's `order`, asked of that node's victims alone: only the order within a node matters, so no
cycle sorts every running task) are moved or evicted one at a time, each re-checked with `may_take` just before,
until the task fits there. Evicting a task evicts every running task of its job, so no gang is left below its
size; a moved task goes to the best node off the caller's `move_off` nodes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.core.fit import node_fits, without
from gpupool.core.model import TaskShape
from gpupool.core.snapshot import RunningTask
from gpupool.core.statement import Statement

if TYPE_CHECKING:
    from gpupool.core.framework import Cycle

CANDIDATE_NODES = 8
#: nodes that would fit the task with all their victims gone, looked at for candidates (the bound on a search)
LOOKED_NODES = 64


def make_room(cycle: Cycle, stmt: Statement, shape: TaskShape, victims: Sequence[RunningTask],
              order: Callable[[list[RunningTask]], Sequence[RunningTask]], may_take: Callable[[RunningTask], bool],
              move_off: frozenset[int] | None, allowance: int, reason: str = "preempted",
              fenced: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    """(node index, victims used) for a node off `fenced` freed for `shape` within `allowance`; None if none
    works. Victims are moved to the best node off `move_off`, or evicted when `move_off` is None. `victims` are
    tasks as they ran when the caller listed them (from `Workspace.still_running`), in any order; `order` ranks
    the victims of one node (an order that does not depend on theirs, like `VictimPlugin.order_victims`)."""
    by_node, ascending = _by_node(cycle, victims)
    # Each candidate is tried as soon as it is found: a candidate that does not work out is rolled back, which
    # leaves the state the search reads as it was, so the search finds the same nodes as it would all at once.
    for i in _candidates(cycle, shape, by_node, ascending, may_take, fenced):
        checkpoint = stmt.checkpoint()
        used = _free(cycle, stmt, i, shape, order(by_node[i]), may_take, move_off, allowance, reason)
        if used is not None:
            return i, used
        stmt.rollback(checkpoint)
    return None


def _candidates(cycle: Cycle, shape: TaskShape, by_node: dict[int, list[RunningTask]],
                ascending: Iterable[tuple[int, int]], may_take: Callable[[RunningTask], bool],
                fenced: frozenset[int]) -> Iterator[int]:
    """The candidate nodes for `shape`, in order (the module's contract), found one at a time from `ascending`
    (victim GPU, node index) pairs."""
    table = cycle.workspace.table
    found, looked = 0, 0
    for milli, i in ascending:
        kind = table.kinds[i]
        if i in fenced:
            continue
        if not shape.allows_labels(kind.labels) or shape.gpu_count and (
                shape.gpu_count > kind.gpu_count or not shape.allows_model(kind.model)):
            continue
        state = table.states[i]
        if state.gpu_idle + milli < shape.total_gpu_milli:  # too little GPU even with every victim gone
            continue
        if not state.schedulable or node_fits(kind, without(state, ((t.shape, t.shares) for t in by_node[i])), shape):
            continue
        looked += 1
        # victims `may_take` refuses now stay: it only grows stricter as victims go
        if not node_fits(kind, without(state, ((t.shape, t.shares) for t in by_node[i] if may_take(t))), shape):
            found += 1
            yield i
        if found == CANDIDATE_NODES or looked == LOOKED_NODES:
            return


def _by_node(cycle: Cycle, victims: Sequence[RunningTask]) -> tuple[dict[int, list[RunningTask]],
                                                                     Iterable[tuple[int, int]]]:
    """The victims as they run now (`Workspace.running`: earlier changes may have moved or evicted some), by node
    index, and (GPU they hold, node index) for those nodes in ascending order. The grouping and order of the list
    as given are kept on the cycle (callers reuse one list for many jobs); only nodes with a victim changed in this
    cycle are regrouped, and merged into the kept order (a search mostly reads only its first few nodes)."""
    listed = _listed(cycle, victims)
    overlay = cycle.workspace.overlay
    changed = {listed.node_of[t] for t in overlay if t in listed.node_of}
    if not changed:
        return listed.by_node, listed.ascending
    by_node, regrouped = dict(listed.by_node), []
    for i in changed:
        now = [c for t in listed.by_node[i] if (c := overlay.get(t.task_id, t)) is not None and c.node == t.node]
        if now:
            by_node[i] = now
            regrouped.append((sum(t.shape.total_gpu_milli for t in now), i))
        else:
            del by_node[i]
    kept = (entry for entry in listed.ascending if entry[1] not in changed)
    return by_node, heapq.merge(kept, sorted(regrouped))


@dataclass(frozen=True, slots=True)
class _Listed:
    victims: Sequence[RunningTask]
    by_node: dict[int, list[RunningTask]]
    #: (GPU the victims hold, node index) per node, ascending
    ascending: list[tuple[int, int]]
    node_of: dict[str, int]


def _listed(cycle: Cycle, victims: Sequence[RunningTask]) -> _Listed:
    """`victims` grouped by node, kept in `cycle.memo` per list (the memo holds the list, so its id
    names no other list while it is there)."""
    memo = cycle.memo.setdefault(_listed, {})
    assert isinstance(memo, dict)
    found = memo.get(id(victims))
    if isinstance(found, _Listed) and found.victims is victims:
        return found
    index = cycle.workspace.table.index
    by_node: dict[int, list[RunningTask]] = {}
    freed: dict[int, int] = {}
    node_of: dict[str, int] = {}
    for task in victims:
        i = node_of[task.task_id] = index[task.node]
        by_node.setdefault(i, []).append(task)
        freed[i] = freed.get(i, 0) + task.shape.total_gpu_milli
    ascending = sorted((milli, i) for i, milli in freed.items())
    found = memo[id(victims)] = _Listed(victims, by_node, ascending, node_of)
    return found


def _free(cycle: Cycle, stmt: Statement, i: int, shape: TaskShape, tasks: Sequence[RunningTask],
          may_take: Callable[[RunningTask], bool], move_off: frozenset[int] | None, allowance: int,
          reason: str) -> int | None:
    table, ws = cycle.workspace.table, cycle.workspace
    stmt.set_schedulable(i, False)
    used = 0
    for task in tasks:
        current = ws.running(task.task_id)
        if current is None or current.node != task.node or not may_take(current):
            continue
        if used >= allowance:
            return None
        if move_off is None:
            evict_job(cycle, stmt, current.job_id, reason)
        elif not _move(cycle, stmt, current, move_off):
            return None
        used += 1
        if not node_fits(table.kinds[i], table.states[i].with_schedulable(True), shape):
            stmt.set_schedulable(i, True)
            return used
    return None


def _move(cycle: Cycle, stmt: Statement, task: RunningTask, off: frozenset[int]) -> bool:
    placer, table = cycle.plugins.placer, cycle.workspace.table
    target = placer.choose(table, task.shape, cycle.rng, off)
    if target is None:
        return False
    stmt.move(task, target, placer.pick(table, target, task.shape, cycle.rng))
    return True


def evict_job(cycle: Cycle, stmt: Statement, job_id: str, reason: str) -> None:
    """Evict every task of `job_id` still running in this cycle."""
    for task in cycle.workspace.job_tasks(job_id):
        stmt.evict(task, reason)
