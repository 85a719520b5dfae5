"""The quota tree's rules, checked on every change of a queue (create, update, delete).

1. A child never guarantees more than its parent allows: no more of a resource than the parent's limit of it, and the
   parent's children together no more than the parent guarantees of a resource it guarantees. A queue's own children
   hold it to the same when it shrinks. A break is a 422 naming the field and the figures.
2. Guarantees above the pool's capacity (the GPUs, CPUs and memory of its registered nodes): one queue's, or the
   top-level queues' together. Setting `quota_above_capacity` says what happens: "warn" (the change is made and
   the answer carries the warning with the figures) or "refuse" (a 422 with the same words).

Amounts are compared as the API's decimal strings read them (Decimal), per Resources field: `gpus`, `cpus`,
`memory_mib` and `per_model.<model>`; a resource a queue does not name is not guaranteed (nor limited) by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from fastapi import HTTPException
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.server.db.models import Gpu, Node, QueueRow
from gpupool.server.db.repositories import QueueIndex

WARN, REFUSE = "warn", "refuse"
UNITS = {"gpus": "GPUs", "cpus": "CPUs", "memory_mib": "MiB of memory"}


def amounts(raw: dict[str, Any] | None) -> dict[str, Decimal]:
    """A quota's amounts by field (`gpus`, `cpus`, `memory_mib`, `per_model.H100`); None and absent are left out."""
    out = {key: Decimal(str(value)) for key, value in (raw or {}).items() if key != "per_model" and value is not None}
    out |= {f"per_model.{model}": Decimal(str(v)) for model, v in ((raw or {}).get("per_model") or {}).items()}
    return out


def figure(field: str, amount: Decimal) -> str:
    """`5 GPUs`, `1 GPU`, `8 H100 GPUs`, `0.5 GPU`, `64 CPUs`, `1024 MiB of memory`."""
    unit = UNITS.get(field) or f"{field.removeprefix('per_model.')} GPUs"
    if 0 < amount <= 1 and unit.endswith("s"):
        unit = unit[:-1]
    return f"{amount.normalize():f} {unit}"


def check(session: Session, index: QueueIndex, row: QueueRow, mode: str) -> list[str]:
    """Check `row` as it will be, in `index` (the tree with the change made): 422 for rule 1; rule 2's findings
    are returned as warnings, or raised as a 422 when `mode` is "refuse"."""
    _within_parent(index, row)
    _holds_children(index, row)
    problems = above_capacity(index, row, capacity(session))
    if problems and mode == REFUSE:
        raise HTTPException(422, "; ".join(problems) + " (setting quota_above_capacity=refuse)")
    return problems


def _within_parent(index: QueueIndex, row: QueueRow) -> None:
    parent = index.parent(row)
    if parent is None:
        return
    asked, limit = amounts(row.guaranteed), amounts(parent.limit)
    for field, amount in asked.items():
        if field in limit and amount > limit[field]:
            raise HTTPException(422, f"guaranteed.{field}: {figure(field, amount)} is above the limit of its parent "
                                     f"queue {parent.name!r}, {figure(field, limit[field])}")
    _children_within(parent, index.children(parent), f"guaranteed.{{field}}: queue {row.name!r} would make")


def _holds_children(index: QueueIndex, row: QueueRow) -> None:
    children = index.children(row)
    limit = amounts(row.limit)
    for child in children:
        for field, amount in amounts(child.guaranteed).items():
            if field in limit and amount > limit[field]:
                raise HTTPException(422, f"limit.{field}: {figure(field, limit[field])} is below what its child "
                                         f"queue {child.name!r} guarantees, {figure(field, amount)}")
    _children_within(row, children, "guaranteed.{field}: its child queues make")


def _children_within(parent: QueueRow, children: Iterable[QueueRow], lead: str) -> None:
    """422 when `children` together guarantee more of a resource than `parent` guarantees of it."""
    given = amounts(parent.guaranteed)
    total = _sum(amounts(c.guaranteed) for c in children)
    for field, amount in total.items():
        if field in given and amount > given[field]:
            raise HTTPException(422, f"{lead.format(field=field)} the children of {parent.name!r} guarantee "
                                     f"{figure(field, amount)} together, above its guarantee of "
                                     f"{figure(field, given[field])}")


def _sum(quotas: Iterable[dict[str, Decimal]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for quota in quotas:
        for field, amount in quota.items():
            total[field] = total.get(field, Decimal(0)) + amount
    return total


def capacity(session: Session) -> dict[str, Decimal]:
    """What the pool's registered nodes hold: GPUs in service (all and per model), CPUs and memory."""
    out = {"gpus": Decimal(0)}
    for model, count in session.execute(select(Gpu.model, func.count()).where(Gpu.retired_at.is_(None))
                                        .group_by(Gpu.model)):
        out[f"per_model.{model}"] = Decimal(count)
        out["gpus"] += count
    cpu_milli, memory_mib = session.execute(select(func.coalesce(func.sum(Node.cpu_milli), 0),
                                                   func.coalesce(func.sum(Node.memory_mib), 0))).one()
    return out | {"cpus": Decimal(cpu_milli) / 1000, "memory_mib": Decimal(memory_mib)}


def above_capacity(index: QueueIndex, row: QueueRow, pool: dict[str, Decimal]) -> list[str]:
    """Rule 2 for a change of `row`: its own guarantees above the pool's capacity, and the top-level queues' together
    (for the resources `row` guarantees)."""
    asked = {f: a for f, a in amounts(row.guaranteed).items() if a > 0}
    problems = [f"guaranteed.{f}: queue {row.name!r} guarantees {figure(f, a)}, above the pool's "
                f"{figure(f, pool.get(f, Decimal(0)))}" for f, a in asked.items() if a > pool.get(f, Decimal(0))]
    tops = _sum(amounts(r.guaranteed) for r in index.rows if index.parent(r) is None)
    problems += [f"guaranteed.{f}: the top-level queues guarantee {figure(f, tops[f])} together, above the pool's "
                 f"{figure(f, pool.get(f, Decimal(0)))}" for f in asked
                 if tops.get(f, Decimal(0)) > pool.get(f, Decimal(0)) and not asked[f] > pool.get(f, Decimal(0))]
    return problems
