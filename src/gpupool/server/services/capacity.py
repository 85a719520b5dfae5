"""Whether a job could ever start on the pool: the admission check at submission (issue 43, Kueue's and Slurm's
"requested node configuration is not available").

The pool is every registered node that has not been reset (`REMOVED_STATES`): nodes that are unreachable, lost,
cordoned or draining count, since they may come back; a node reset (or removed) does not. Its GPUs are those not
retired. A job that no node could hold even with every node empty is refused with a 422 naming the field to change,
the largest fit and the models present, unless its queue holds such jobs (`hold_unsatisfiable`) for operators who
add capacity on demand. A pool with no node yet refuses nothing: there is nothing to judge by. Whether a node runs
jobs with an image is not judged here: its agent says it again on every connection (a toolkit upgraded), so such a
job waits, and `why` says no node takes images yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.core.fit import copies_fit
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.server.db.models import Gpu, Node

#: node states that are no longer part of the pool
REMOVED_STATES = ("reset", "removed")


@dataclass(frozen=True)
class PoolKind:
    """Nodes of one kind: how many, and the first of them by name (named in messages)."""

    name: str
    count: int
    kind: NodeKind


def pool_kinds(session: Session) -> list[PoolKind]:
    """The pool's node kinds, largest GPU count first (one query, grouped per node then per kind)."""
    per_node = (select(Node.name, Node.cpu_milli, Node.memory_mib, Node.untrusted_images,
                       func.count(Gpu.id).label("gpus"), func.coalesce(func.min(Gpu.model), "").label("model"),
                       func.coalesce(func.max(Gpu.memory_mib), 0).label("gpu_memory"))
                .outerjoin(Gpu, (Gpu.node_id == Node.id) & Gpu.retired_at.is_(None))
                .where(Node.state.notin_(REMOVED_STATES)).group_by(Node.id).subquery())
    c = per_node.c
    keys = (c.model, c.gpus, c.cpu_milli, c.memory_mib, c.gpu_memory, c.untrusted_images)
    rows = session.execute(select(*keys, func.count(), func.min(c.name)).group_by(*keys)).all()
    kinds = [PoolKind(name, count, NodeKind(model, cpu, memory, gpus, (gpu_memory,) * gpus, bool(untrusted)))
             for model, gpus, cpu, memory, gpu_memory, untrusted, count, name in rows]
    return sorted(kinds, key=lambda p: (-p.kind.gpu_count, -p.kind.cpu_milli, p.name))


def never_fits(kinds: Sequence[PoolKind], shape: TaskShape, tasks: int) -> tuple[str, str] | None:
    """(field, message) when `tasks` tasks of `shape` could never run at once on nodes of `kinds`, every node
    empty; None when they could (or the pool has no node). The field is the first request, in the order a user
    reads them, that no node meets among those meeting the ones before it."""
    if not kinds:
        return None
    left = list(kinds)
    for check in (_models, _gpus, _cpus, _memory, _gpu_memory):
        found = check(left, shape)
        if isinstance(found, tuple):
            return found
        left = found
    ignoring_images = replace(shape, has_image=False)
    room = sum(copies_fit(p.kind, NodeState.empty(p.kind), ignoring_images) * p.count for p in left)
    if room < tasks:
        return "tasks", (f"{tasks} tasks must run at once, but even with every node empty the pool holds at most "
                         f"{room} of them; ask for at most {room} tasks, or less per task")
    return None


Found = list[PoolKind] | tuple[str, str]


def _models(left: list[PoolKind], shape: TaskShape) -> Found:
    if not shape.gpu_count or not shape.gpu_models:
        return left
    kept = [p for p in left if p.kind.gpu_count and shape.allows_model(p.kind.model)]
    return kept or ("gpu_models", f"no node of the pool has a GPU of model {', '.join(shape.gpu_models)}; "
                                  f"models present: {models_present(left)}")


def _gpus(left: list[PoolKind], shape: TaskShape) -> Found:
    if not shape.gpu_count:
        return left
    kept = [p for p in left if p.kind.gpu_count >= shape.gpu_count]
    if kept:
        return kept
    largest = left[0]  # kinds come largest GPU count first
    return "gpus", (f"{shape.gpu_count} GPUs per task, but the largest node, {largest.name}, has "
                    f"{largest.kind.gpu_count} ({_gpu_phrase(largest.kind)}); ask for at most "
                    f"{largest.kind.gpu_count} GPUs per task (models present: {models_present(left)})")


def _cpus(left: list[PoolKind], shape: TaskShape) -> Found:
    return _at_least(left, "cpus", shape.cpu_milli, lambda k: k.cpu_milli, lambda milli: f"{milli / 1000:g} CPUs")


def _memory(left: list[PoolKind], shape: TaskShape) -> Found:
    return _at_least(left, "memory_mib", shape.memory_mib, lambda k: k.memory_mib, lambda mib: f"{mib} MiB of memory")


def _at_least(left: list[PoolKind], field: str, asked: int, has: Callable[[NodeKind], int],
              amount: Callable[[int], str]) -> Found:
    """The kinds that have at least `asked` (as `has` reads a kind), or the field and why none has."""
    kept = [p for p in left if has(p.kind) >= asked]
    if kept:
        return kept
    largest = max(left, key=lambda p: has(p.kind))
    return field, (f"{amount(asked)} per task, but the largest node that meets the rest, {largest.name}, has "
                   f"{amount(has(largest.kind))}")


def _gpu_memory(left: list[PoolKind], shape: TaskShape) -> Found:
    if not shape.is_shared or not shape.gpu_memory_mib:  # whole GPUs bring all their memory
        return left
    kept = [p for p in left if max(p.kind.gpu_memory_mib, default=0) >= shape.gpu_memory_mib]
    if kept:
        return kept
    largest = max(left, key=lambda p: max(p.kind.gpu_memory_mib, default=0))
    return "gpu_memory_mib", (f"{shape.gpu_memory_mib} MiB of GPU memory on a shared GPU, but the largest GPU, on "
                              f"{largest.name}, has {max(largest.kind.gpu_memory_mib, default=0)} MiB")


def models_present(kinds: Sequence[PoolKind]) -> str:
    """"A100 (3 nodes), H100 (1 node)", or "none (no node has a GPU)"."""
    counts: dict[str, int] = {}
    for p in kinds:
        if p.kind.gpu_count:
            counts[p.kind.model] = counts.get(p.kind.model, 0) + p.count
    if not counts:
        return "none (no node has a GPU)"
    return ", ".join(f"{m} ({n} node{'s' if n != 1 else ''})" for m, n in sorted(counts.items()))


def _gpu_phrase(kind: NodeKind) -> str:
    return f"{kind.gpu_count} x {kind.model}" if kind.gpu_count else "no GPU"
