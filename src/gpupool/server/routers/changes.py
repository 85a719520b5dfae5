"""Routes that change or delete queues and budgets (`PATCH`/`DELETE /api/v1/queues/{name}` and
`/api/v1/budgets/{budget_id}`). With `dry_run=true` each answers what it would do (changes, jobs moved, warnings,
or the refusal a real change would get) and changes nothing: its transaction is rolled back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

import anyio
from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, principal_from
from gpupool.server.db.engine import Database
from gpupool.server.services import budgets, queue_admin

router = APIRouter(prefix="/api/v1")
Caller = Annotated[Principal, Depends(principal_from)]
T = TypeVar("T", api.QueueChange, api.BudgetChange)
DryRun = Annotated[bool, Query(description="say what would change, change nothing")]
OrgName = Annotated[str | None, Query(max_length=64, description="the queue's organisation (operators)")]


class _Undo(Exception):
    """Carries a dry run's answer out of its transaction, which then rolls back."""

    def __init__(self, out: api.QueueChange | api.BudgetChange) -> None:
        self.out = out


async def _apply(db: Database, work: Callable[[Session], T], dry_run: bool) -> T:
    """`work` in one transaction in a worker thread: committed, or with `dry_run` rolled back (its answer marked)."""
    def run() -> T:
        try:
            with db.session() as session:
                out = work(session)
                if dry_run:
                    raise _Undo(out.model_copy(update={"dry_run": True}))
            return out
        except _Undo as undo:
            return undo.out  # type: ignore[return-value]

    return await anyio.to_thread.run_sync(run)


@router.patch("/queues/{name}", response_model=api.QueueChange, tags=["queues"])
async def update_queue(name: str, body: api.QueueUpdate, who: Caller, request: Request, org: OrgName = None,
                       dry_run: DryRun = False) -> api.QueueChange:
    """Change the parts of a queue given; the quota tree is checked as on creation."""
    mode = request.app.state.settings.quota_above_capacity

    def work(session: Session) -> api.QueueChange:
        row = queue_admin.scoped_queue(session, who, name, org)
        return queue_admin.update_queue(session, who, row, body, mode)

    out = await _apply(request.app.state.db, work, dry_run)
    request.app.state.scheduler.wake()
    return out


@router.delete("/queues/{name}", response_model=api.QueueChange, tags=["queues"])
async def delete_queue(name: str, who: Caller, request: Request, org: OrgName = None,
                       move_to: Annotated[str | None, Query(max_length=64)] = None,
                       dry_run: DryRun = False) -> api.QueueChange:
    """Delete a queue without child queues or placed jobs, and its budget; its waiting jobs move to `move_to`."""
    def work(session: Session) -> api.QueueChange:
        return queue_admin.delete_queue(session, who, queue_admin.scoped_queue(session, who, name, org), move_to)

    out = await _apply(request.app.state.db, work, dry_run)
    request.app.state.scheduler.budgets_changed()
    return out


@router.patch("/budgets/{budget_id}", response_model=api.BudgetChange, tags=["usage"])
async def update_budget(budget_id: str, body: api.BudgetUpdate, who: Caller, request: Request,
                        dry_run: DryRun = False) -> api.BudgetChange:
    currency = request.app.state.settings.currency

    def work(session: Session) -> api.BudgetChange:
        return budgets.update_budget(session, budgets.scoped_budget(session, who, budget_id), body, currency)

    out = await _apply(request.app.state.db, work, dry_run)
    request.app.state.scheduler.budgets_changed()
    return out


@router.delete("/budgets/{budget_id}", response_model=api.BudgetChange, tags=["usage"])
async def delete_budget(budget_id: str, who: Caller, request: Request, dry_run: DryRun = False) -> api.BudgetChange:
    currency = request.app.state.settings.currency

    def work(session: Session) -> api.BudgetChange:
        return budgets.delete_budget(session, budgets.scoped_budget(session, who, budget_id), currency)

    out = await _apply(request.app.state.db, work, dry_run)
    request.app.state.scheduler.budgets_changed()
    return out
