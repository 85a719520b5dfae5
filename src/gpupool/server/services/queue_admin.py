"""Changing and deleting queues (PATCH and DELETE /queues/{name}), with the quota tree checked (services.quota_tree)
and a dry run that says what would change without changing it (the router rolls its transaction back).

Who: operators change any queue; tenant admins their organisation's queues, within its ceiling (services.ceilings);
a shared queue is an operator's. A queue another organisation owns is "not found", as one that does not exist."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import Budget, Job, Org, QueueRow
from gpupool.server.db.repositories import QueueIndex
from gpupool.server.services import ceilings, cluster, quota_tree
from gpupool.server.services.tenancy import org_for

#: the fields of api.QueueUpdate that are quotas (shown as `gpus=1 cpus=2`)
QUOTAS = ("guaranteed", "limit", "borrow_limit", "lend_limit")
#: jobs a deleted queue hands to `move_to`: those not yet placed
MOVABLE = ("pending_approval", "pending")


def scoped_queue(session: Session, principal: Principal, name: str, org_name: str | None) -> QueueRow:
    """The queue `name` the caller may change: of organisation `org_name` (operators; default: a shared queue, else
    the only organisation's queue of that name), else of the caller's organisation. 404 when it sees none; 403 when
    a tenant admin names a shared queue."""
    require(principal, "tenant-admin")
    index = QueueIndex.load(session)
    if org_name is not None or not principal.is_operator:
        row = index.find(org_for(session, principal, org_name).id, name)
    else:
        rows = [r for r in index.rows if r.name == name]
        row = next((r for r in rows if r.org_id is None), rows[0] if len(rows) == 1 else None)
        if row is None and rows:
            orgs = ", ".join(sorted(index.orgs.get(r.org_id or "", "") for r in rows))
            raise HTTPException(409, f"org: queue {name!r} exists in several organisations ({orgs}): name one")
    if row is None:
        raise HTTPException(404, f"queue {name!r} not found")
    if row.org_id is None and not principal.is_operator:
        raise HTTPException(403, f"queue {name!r} is a shared queue; only an operator changes it")
    return row


def update_queue(session: Session, principal: Principal, row: QueueRow, body: api.QueueUpdate,
                 mode: str) -> api.QueueChange:
    """Apply the parts of `body` given to `row`; 403 beyond the organisation's ceiling (tenant admins), 422 when
    the quota tree would break (or, mode "refuse", guarantees would pass the pool's capacity)."""
    before, grants = _fields(row), _grants(row)
    for key in body.model_fields_set:
        value = getattr(body, key)
        if key == "approval_above_gpus":
            row.approval_above_milli = None if value is None else api.gpus_to_milli(value)
        elif key in QUOTAS:
            row_value = None if value is None else value.model_dump(exclude_none=True)
            setattr(row, key, row_value if row_value is not None or key != "guaranteed" else {})
        elif value is not None or key == "max_disconnect_s":
            setattr(row, key, value)
    if row.org_id is not None and not principal.is_operator and _raises(grants, _grants(row)):
        _within_ceiling(session, row)
    warnings = _checked(session, row, mode)
    after = _fields(row)
    changes = [f"{k}: {before[k]} -> {after[k]}" for k in after if before[k] != after[k]]
    return api.QueueChange(queue=_out(session, row, warnings), dry_run=False, changes=changes, warnings=warnings)


def _grants(row: QueueRow) -> tuple[dict[str, Any], dict[str, Any] | None, int, int]:
    return quota_tree.amounts(row.guaranteed), None if row.limit is None else quota_tree.amounts(row.limit), \
        row.over_quota_weight, row.priority


def _raises(before: tuple[dict[str, Any], dict[str, Any] | None, int, int],
            after: tuple[dict[str, Any], dict[str, Any] | None, int, int]) -> bool:
    """Whether a change grants more than the queue had (a guarantee, a limit, weight or priority raised): only such
    a change is held to the organisation's ceiling (one made above it by an operator may still be lowered)."""
    (guaranteed, limit, weight, priority), (guaranteed2, limit2, weight2, priority2) = before, after
    if weight2 > weight or priority2 > priority or any(a > guaranteed.get(f, 0) for f, a in guaranteed2.items()):
        return True
    if limit is None:
        return False
    return limit2 is None or any(f not in limit2 or limit2[f] > a for f, a in limit.items())


def _within_ceiling(session: Session, row: QueueRow) -> None:
    """services.ceilings' check of `row` as changed, against the organisation's other queues."""
    org = session.get(Org, row.org_id)
    assert org is not None  # a queue's organisation stays while it has queues
    ceilings.lock(session, org)
    index = QueueIndex.load(session)
    others = QueueIndex([r for r in index.rows if r.id != row.id], index.orgs)
    asked = api.QueueCreate(name=row.name, parent=row.parent, guaranteed=api.Resources(**row.guaranteed),
                            limit=api.Resources(**row.limit) if row.limit else None,
                            over_quota_weight=row.over_quota_weight, priority=row.priority)
    ceilings.check(org, others, asked, index.parent(row))


def _checked(session: Session, row: QueueRow, mode: str) -> list[str]:
    session.flush()
    index = QueueIndex.load(session)
    try:
        index.tree()
    except ValueError as exc:
        raise HTTPException(422, f"queue: {exc}") from None
    return quota_tree.check(session, index, row, mode)


def _fields(row: QueueRow) -> dict[str, str]:
    out = {key: _quota(getattr(row, key)) for key in QUOTAS}
    threshold = row.approval_above_milli
    return out | {"over_quota_weight": str(row.over_quota_weight), "priority": str(row.priority),
                  "approval_above_gpus": "none" if threshold is None else f"{threshold / 1000:g}",
                  "max_disconnect_s": str(row.max_disconnect_s or "the pool's"),
                  "hold_unsatisfiable": "yes" if row.hold_unsatisfiable else "no"}


def _quota(raw: dict[str, Any] | None) -> str:
    shown = " ".join(f"{field}={amount.normalize():f}" for field, amount in quota_tree.amounts(raw).items())
    return shown or "none"


def _out(session: Session, row: QueueRow, warnings: list[str]) -> api.QueueOut:
    return cluster.queue_out(session, row).model_copy(update={"warnings": warnings})


def delete_queue(session: Session, principal: Principal, row: QueueRow, move_to: str | None) -> api.QueueChange:
    """Delete `row` with its budget; its jobs not yet placed move to queue `move_to` (a leaf the caller may use).
    409 while it has child queues, holds placed or running jobs, or holds waiting jobs and `move_to` is not given."""
    index = QueueIndex.load(session)
    if index.children(row):
        names = ", ".join(sorted(c.name for c in index.children(row)))
        raise HTTPException(409, f"queue {row.name!r} has child queues ({names}): delete or change them first")
    jobs = select(Job).where(Job.queue == row.name)
    if row.org_id is not None:  # a shared queue's name is free in every organisation: its jobs are all of that name
        jobs = jobs.where(Job.org_id == row.org_id)
    placed = session.scalar(select(func.count()).select_from(
        jobs.where(Job.state.in_(("scheduled", "running"))).subquery()))
    if placed:
        raise HTTPException(409, f"queue {row.name!r} holds {placed} placed or running jobs: let them end or cancel "
                                 "them first")
    waiting = list(session.scalars(jobs.where(Job.state.in_(MOVABLE)).order_by(Job.seq)))
    if waiting and move_to is None:
        raise HTTPException(409, f"move_to: queue {row.name!r} holds {len(waiting)} waiting jobs; name the queue "
                                 "they move to")
    if waiting:
        _move(session, index, row, waiting, move_to or "")
    out = _out(session, row, [])
    key = index.row_key(row)
    budgets = [b for b in session.scalars(select(Budget).where(Budget.scope == "queue", Budget.name == row.name))
               if index.key(b.org_id or "", b.name) == key]
    for budget in budgets:
        session.delete(budget)
    session.delete(row)
    session.flush()
    changes = [f"deleted queue {row.name}"] + [f"deleted its {b.period}ly budget" for b in budgets]
    changes += [f"moved {len(waiting)} waiting jobs to {move_to}"] if waiting else []
    return api.QueueChange(queue=out, dry_run=False, changes=changes, jobs_moved=[j.id for j in waiting])


def _move(session: Session, index: QueueIndex, row: QueueRow, jobs: list[Job], move_to: str) -> None:
    target = index.find(row.org_id, move_to)
    if target is None or target.id == row.id:
        raise HTTPException(422, f"move_to: queue {move_to!r} not found")
    if index.children(target):
        raise HTTPException(422, f"move_to: queue {move_to!r} has child queues; jobs live in leaf queues")
    for job in jobs:
        job.queue = target.name
