"""Routes for metering: prices, budgets, usage reports and monthly statements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, principal_from, require
from gpupool.server.db.models import Budget, ClusterSample, Price, Project, ResourcePrice
from gpupool.server.db.repositories import find_queue, upsert
from gpupool.server.services import budgets, metering

router = APIRouter(prefix="/api/v1", tags=["usage"])
Caller = Annotated[Principal, Depends(principal_from)]


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.db.session() as session:
        yield session


Db = Annotated[Session, Depends(_session, scope="function")]


async def _upserted(request: Request, table: Any, values: dict[str, Any], key: str, column: str) -> None:
    """One upsert (repositories.upsert) setting `column`, committed in the worker thread that ran it: the row lock
    it takes is released there (a commit left to a later thread could wait for one behind requests waiting on it)."""
    def work() -> None:
        with request.app.state.db.session() as session:
            upsert(session, table, values, [key], _taking(column))

    await anyio.to_thread.run_sync(work)


@router.put("/prices", response_model=api.PriceSet)
async def set_price(body: api.PriceSet, who: Caller, request: Request) -> api.PriceSet:
    """Set a GPU model's price (one upsert: concurrent first prices of a model each succeed, the last one stays)."""
    require(who, "operator")
    await _upserted(request, Price.__table__, body.model_dump(), "model", "cents_per_gpu_hour")
    return body


@router.get("/resource-prices", response_model=list[api.ResourcePriceSet])
def list_resource_prices(who: Caller, db: Db) -> list[api.ResourcePriceSet]:
    """Cents per CPU-core-hour and per GiB-hour of memory, the defaults where no operator set one."""
    require(who, "viewer")
    return [api.ResourcePriceSet(resource=r, cents_per_hour=c)  # type: ignore[arg-type]
            for r, c in sorted(metering.resource_prices(db).items())]


@router.put("/resource-prices", response_model=api.ResourcePriceSet)
async def set_resource_price(body: api.ResourcePriceSet, who: Caller, request: Request) -> api.ResourcePriceSet:
    require(who, "operator")
    await _upserted(request, ResourcePrice.__table__, body.model_dump(), "resource", "cents_per_hour")
    return body


def _taking(column: str) -> Callable[[Any], dict[str, Any]]:
    """An upsert's change that sets `column` to the value that did not go in."""
    return lambda excluded: {column: excluded[column]}


@router.get("/prices", response_model=list[api.PriceSet])
def list_prices(who: Caller, db: Db) -> list[api.PriceSet]:
    require(who, "viewer")
    return [api.PriceSet(model=p.model, cents_per_gpu_hour=p.cents_per_gpu_hour) for p in db.scalars(select(Price))]


@router.post("/budgets", response_model=api.BudgetOut, status_code=201)
def create_budget(body: api.BudgetCreate, who: Caller, db: Db, request: Request) -> api.BudgetOut:
    require(who, "tenant-admin")
    if (body.gpu_hours is None) == (body.cents is None):
        raise HTTPException(422, "gpu_hours, cents: set exactly one of them")
    if body.scope == "project":
        target = db.scalar(select(Project).where(Project.name == body.name, Project.org_id == who.org_id))
    else:
        target = find_queue(db, who.org_id, body.name)
        if target is not None and not who.is_operator and target.org_id != who.org_id:
            target = None
    if target is None:
        raise HTTPException(404, f"{body.scope} {body.name!r} not found")
    budget = Budget(org_id=who.org_id, scope=body.scope, name=body.name, period=body.period,
                    gpu_hours=body.gpu_hours, cents=body.cents, hard=body.hard)
    db.add(budget)
    try:
        db.flush()
    except IntegrityError:
        raise HTTPException(409, f"{body.scope} {body.name!r} already has a budget") from None
    request.app.state.scheduler.budgets_changed()
    return budgets.budget_out(db, budget, request.app.state.settings.currency)


@router.get("/budgets", response_model=list[api.BudgetOut])
def list_budgets(who: Caller, db: Db, request: Request) -> list[api.BudgetOut]:
    require(who, "viewer")
    rows = db.scalars(select(Budget).order_by(Budget.scope, Budget.name))
    currency = request.app.state.settings.currency
    return [budgets.budget_out(db, b, currency) for b in rows if who.is_operator or b.org_id == who.org_id]


def _window(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    """[from, to) of ISO moments already checked (api.Moment: years 2000-2199, so 30 days back cannot overflow)."""
    to = datetime.fromisoformat(end).replace(tzinfo=UTC) if end else datetime.now(UTC)
    frm = datetime.fromisoformat(start).replace(tzinfo=UTC) if start else to - timedelta(days=30)
    if frm >= to:
        raise HTTPException(422, "from: must be before to")
    return frm, to


@router.get("/usage", response_model=list[api.UsageOut])
def usage(who: Caller, db: Db, request: Request,
          start: Annotated[api.Moment | None, Query(alias="from", max_length=32)] = None,
          end: Annotated[api.Moment | None, Query(alias="to", max_length=32)] = None,
          by: Annotated[str, Query(max_length=70)] = "project") -> list[dict[str, object]]:
    frm, to = _window(start, end)
    currency = request.app.state.settings.currency
    return [row | {"currency": currency} for row in metering.usage(db, who, frm, to, by)]


@router.get("/usage/statement")
def monthly_statement(who: Caller, db: Db, project: Annotated[str, Query(max_length=64)],
                      month: Annotated[api.Month, Query(max_length=7)],
                      format: Annotated[str, Query(pattern="^(csv|html)$")] = "csv") -> Response:
    body, media = metering.statement(db, who, project, month, format)
    return Response(body, media_type=media)


@router.get("/cluster/samples", response_model=list[api.SampleOut], tags=["cluster"])
def cluster_samples(who: Caller, db: Db, start: Annotated[api.Moment | None, Query(alias="from", max_length=32)] = None,
                    end: Annotated[api.Moment | None, Query(alias="to", max_length=32)] = None) -> list[api.SampleOut]:
    """Cluster figures over time (sampled by the control plane): GAR = allocated / GPUs, GFR = share of
    GPU nodes partly allocated, and GPUs actually used (utilisation-weighted)."""
    require(who, "viewer")
    frm, to = _window(start, end)
    rows = list(db.scalars(select(ClusterSample).where(ClusterSample.at >= frm, ClusterSample.at < to)
                           .order_by(ClusterSample.at.desc()).limit(10_000)))[::-1]
    return [api.SampleOut(at=r.at, gpus=r.gpus, allocated=r.allocated, used=r.used, reserved=r.reserved,
                          gar=r.allocated / r.gpus if r.gpus else 0.0,
                          sor=(r.allocated + r.reserved) / r.gpus if r.gpus else 0.0,
                          gfr=r.fragmented_nodes / r.gpu_nodes if r.gpu_nodes else 0.0) for r in rows]
