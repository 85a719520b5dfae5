"""Changing and deleting budgets (PATCH and DELETE /budgets/{budget_id}): undoing a hard budget set by mistake.

Who: tenant admins the budgets of their organisation, operators any. A budget of another organisation is "not found",
as one that does not exist. The scheduler reads the hard budgets afresh after a change (SchedulerLoop.budgets_changed).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import HTTPException
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import Budget
from gpupool.server.services import metering


def budget_out(session: Session, budget: Budget, currency: str) -> api.BudgetOut:
    now = datetime.now(UTC)
    hours, cents = metering.budget_use(session, budget, now)
    return api.BudgetOut(id=budget.id, scope=budget.scope, name=budget.name, period=budget.period,
                         gpu_hours=budget.gpu_hours, cents=budget.cents, hard=budget.hard,
                         used_gpu_hours=round(hours, 4), used_cents=round(cents, 2),
                         exceeded=metering.exceeded(budget, hours, cents), currency=currency,
                         period_start=metering.period_start(budget.period, now),
                         period_end=metering.period_end(budget.period, now))


def scoped_budget(session: Session, principal: Principal, budget_id: str) -> Budget:
    """The budget `budget_id` a tenant admin of its organisation (or an operator) may change; 404 otherwise."""
    require(principal, "tenant-admin")
    budget = session.get(Budget, budget_id)
    if budget is None or not (principal.is_operator or budget.org_id == principal.org_id):
        raise HTTPException(404, f"budget {budget_id!r} not found")
    return budget


def _fields(budget: Budget) -> dict[str, str]:
    return {"period": budget.period, "gpu_hours": "none" if budget.gpu_hours is None else f"{budget.gpu_hours:g}",
            "cents": "none" if budget.cents is None else str(budget.cents), "hard": "yes" if budget.hard else "no"}


def update_budget(session: Session, budget: Budget, body: api.BudgetUpdate, currency: str) -> api.BudgetChange:
    """Apply the parts of `body` given; an amount of one kind replaces the other."""
    before = _fields(budget)
    if body.gpu_hours is not None:
        budget.gpu_hours, budget.cents = body.gpu_hours, None
    if body.cents is not None:
        budget.gpu_hours, budget.cents = None, body.cents
    if body.period is not None:
        budget.period = body.period
    if body.hard is not None:
        budget.hard = body.hard
    session.flush()
    after = _fields(budget)
    changes = [f"{k}: {before[k]} -> {after[k]}" for k in after if before[k] != after[k]]
    return api.BudgetChange(budget=budget_out(session, budget, currency), dry_run=False, changes=changes)


def delete_budget(session: Session, budget: Budget, currency: str) -> api.BudgetChange:
    out = budget_out(session, budget, currency)
    session.delete(budget)
    session.flush()
    hard = " (hard: its jobs are no longer held)" if budget.hard else ""
    return api.BudgetChange(budget=out, dry_run=False, changes=[f"deleted the {budget.period}ly budget of "
                                                                f"{budget.scope} {budget.name}{hard}"])
