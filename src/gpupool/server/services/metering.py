"""Metering: allocation intervals -> an append-only, idempotent ledger; usage reports; budgets.

Every `interval`, each allocation that has started is metered from where the ledger left it
(`metered_until`, else its confirmed start) to the earliest of now, its release, and its node's last
heartbeat — so a lost node's attempt is never billed past the last sign of life (RELIABILITY.md I8).
Entries never cross a metering period boundary (`period_s`: an hour by default, aligned to the epoch),
and an allocation still running is metered only up to the last whole period, so a job costs one row per
period. Each entry's `source_key` is (allocation, attempt, interval start): re-running the meter cannot bill
twice (I7). A meter and a release racing on an allocation agree whichever commits first: the meter
advances only an allocation not released before its new end, and a release is never before what was billed.
Amounts are integers: milli-GPU-seconds, milli-CPU-seconds and MiB-seconds of what the allocation holds, and
micro-cents at the GPU model's price, the price of a CPU-core-hour and of a GiB-hour (ResourcePrice), summed.
"""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any, cast

from fastapi import HTTPException
from sqlalchemy import CursorResult, Select, func, or_, select, update
from sqlalchemy.orm import Session

from gpupool.protocol.csvsafe import SafeDictWriter
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import (
    Allocation,
    Budget,
    Gpu,
    Job,
    LedgerEntry,
    Node,
    Price,
    Project,
    ResourcePrice,
    User,
)
from gpupool.server.db.repositories import QueueIndex, find_queue
from gpupool.server.failpoints import failpoint
from gpupool.server.services import rollup

DEFAULT_CENTS_PER_GPU_HOUR = 100
#: cents per CPU-core-hour and per GiB-hour of memory until an operator sets them (PUT /resource-prices)
DEFAULT_RESOURCE_CENTS = {"cpu": 4, "memory": 1}
MIB_PER_GIB = 1024
GROUPS = ("project", "user", "queue", "model", "job")
#: a statement's amounts per line, as `usage_by_job` names them
STATEMENT_AMOUNTS = ("gpu_hours", "cpu_hours", "memory_gib_hours", "cost")


def aware(moment: datetime) -> datetime:
    """The moment in UTC, cut to whole milliseconds: ledger intervals are exact integer milliseconds."""
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def milliseconds(start: datetime, end: datetime) -> int:
    return (end - start) // timedelta(milliseconds=1)


def cost_micro_cents(gpu_milli_seconds: int, cents_per_gpu_hour: int) -> int:
    """Exact integer price of milli-GPU-seconds: x cents/GPU-hour / (1000 milli x 3600 s) x 10^6 micro (of
    milli-CPU-seconds at cents per CPU-core-hour alike)."""
    return gpu_milli_seconds * cents_per_gpu_hour * 1_000_000 // 3_600_000


def memory_cost_micro_cents(mib_seconds: int, cents_per_gib_hour: int) -> int:
    """Exact integer price of MiB-seconds: x cents/GiB-hour / (1024 MiB x 3600 s) x 10^6 micro."""
    return mib_seconds * cents_per_gib_hour * 1_000_000 // (MIB_PER_GIB * 3600)


def resource_prices(session: Session) -> dict[str, int]:
    """Cents per CPU-core-hour ("cpu") and per GiB-hour ("memory"): the operator's, else the defaults."""
    return DEFAULT_RESOURCE_CENTS | {p.resource: p.cents_per_hour for p in session.scalars(select(ResourcePrice))}


def meter(session: Session, now: datetime, period_s: int = 3600) -> int:
    """Write ledger entries for every started allocation up to what is billable now; returns entries written."""
    prices = {p.model: p.cents_per_gpu_hour for p in session.scalars(select(Price))}
    per_resource = resource_prices(session)
    nodes = {n.id: n for n in session.scalars(select(Node))}
    models = {(node, index): model for node, index, model in session.execute(select(Gpu.node_id, Gpu.index, Gpu.model))}
    written: list[LedgerEntry] = []
    rows = session.scalars(select(Allocation).where(Allocation.started_at.is_not(None), or_(
        Allocation.released_at.is_(None), Allocation.metered_until.is_(None),
        Allocation.metered_until < Allocation.released_at)))
    for allocation in rows:
        end = aware(_billable_end(allocation, nodes.get(allocation.node_id), now))
        if allocation.released_at is None:
            end = _period_floor(end, period_s)  # running: whole periods only
        start = aware(allocation.metered_until or allocation.started_at)  # type: ignore[arg-type]
        if end <= start:
            continue
        failpoint("metering.before_advance")
        if not _advanced(session, allocation.id, end):
            continue  # released before `end` since it was read: the next pass bills it to its release
        job = session.get(Job, allocation.job_id)
        assert job is not None
        model = allocation.gpu_model or (  # a pod's (no gpupool node): its Kubernetes node's, as recorded
            models.get((allocation.node_id, allocation.shares[0][0]), "") if allocation.shares else "")
        price = prices.get(model, DEFAULT_CENTS_PER_GPU_HOUR)
        for piece_start, piece_end in _period_pieces(start, end, period_s):
            entry = LedgerEntry(
                source_key=f"{allocation.id}:{allocation.attempt}:{piece_start.isoformat()}", org_id=job.org_id,
                project_id=job.project_id, user_id=job.user_id, queue=job.queue, job_id=job.id,
                allocation_id=allocation.id, model=model, tags=job.tags, start=piece_start, end=piece_end,
                gpu_milli=allocation.gpu_milli, cpu_milli=allocation.cpu_milli, memory_mib=allocation.memory_mib)
            _amounts(entry, milliseconds(piece_start, piece_end), price, per_resource)
            session.add(entry)
            written.append(entry)
        failpoint("metering.mid_ledger_batch")
    rollup.add(session, written)
    return len(written)


def _advanced(session: Session, allocation_id: str, end: datetime) -> bool:
    """Move the allocation's `metered_until` to `end` unless it was released before `end`; True if it moved. One
    UPDATE under the row's write lock, so a release committed since the meter read the allocation is seen (I7)."""
    advance = update(Allocation).where(Allocation.id == allocation_id, or_(
        Allocation.released_at.is_(None), Allocation.released_at >= end)).values(metered_until=end)
    result = session.execute(advance, execution_options={"synchronize_session": False})
    return bool(cast(CursorResult[Any], result).rowcount)


def _amounts(entry: LedgerEntry, ms: int, cents_per_gpu_hour: int, per_resource: dict[str, int]) -> None:
    """Fill in what `entry` holds over `ms` milliseconds, and its cost."""
    entry.gpu_milli_seconds = entry.gpu_milli * ms // 1000
    entry.cpu_milli_seconds = entry.cpu_milli * ms // 1000
    entry.memory_mib_seconds = entry.memory_mib * ms // 1000
    entry.cost_micro_cents = (cost_micro_cents(entry.gpu_milli_seconds, cents_per_gpu_hour)
                              + cost_micro_cents(entry.cpu_milli_seconds, per_resource["cpu"])
                              + memory_cost_micro_cents(entry.memory_mib_seconds, per_resource["memory"]))


def _period_floor(moment: datetime, period_s: int) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + timedelta(seconds=(moment - epoch) // timedelta(seconds=period_s) * period_s)


def _period_pieces(start: datetime, end: datetime, period_s: int) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at every period boundary."""
    pieces = []
    while start < end:
        boundary = min(end, _period_floor(start, period_s) + timedelta(seconds=period_s))
        pieces.append((start, boundary))
        start = boundary
    return pieces


def _billable_end(allocation: Allocation, node: Node | None, now: datetime) -> datetime:
    end = now
    if allocation.released_at is not None:
        end = min(end, aware(allocation.released_at))
    elif node is not None and node.last_seen is not None:
        end = min(end, aware(node.last_seen))
    return end


def usage(session: Session, principal: Principal, start: datetime, end: datetime, by: str) -> list[dict[str, object]]:
    """GPU-hours, CPU-core-hours, GiB-hours of memory and cost per group between `start` and `end` (entries
    attributed by their start)."""
    require(principal, "viewer")
    if by not in GROUPS and not by.startswith("tag:"):
        raise HTTPException(422, f"by: choose from {', '.join(GROUPS)} or tag:<key>")
    projects = {p.id: p.name for p in session.scalars(select(Project))}
    names = {u.id: u.name for u in session.scalars(select(User))} if by == "user" else {}
    visible = None if principal.at_least("tenant-admin") else [
        i for i, name in projects.items() if name in principal.projects]
    org = None if principal.is_operator else principal.org_id
    sums: dict[str, list[int]] = defaultdict(lambda: [0] * 5)
    for project_id, key, *amounts in rollup.totals(session, start, end, by, org, visible):
        label = projects.get(project_id, "") if by == "project" else names.get(key, key)
        for i, v in enumerate(amounts):
            sums[label][i] += v
    return [{"key": k, **_hours(v[0], v[3], v[4]), "cost": round(v[1] / 1e8, 4), "entries": v[2]}
            for k, v in sorted(sums.items())]


def _hours(gpu_milli_seconds: int, cpu_milli_seconds: int, memory_mib_seconds: int) -> dict[str, float]:
    """GPU-hours, CPU-core-hours and GiB-hours, as reports show them."""
    return {"gpu_hours": round(gpu_milli_seconds / 1000 / 3600, 6),
            "cpu_hours": round(cpu_milli_seconds / 1000 / 3600, 6),
            "memory_gib_hours": round(memory_mib_seconds / MIB_PER_GIB / 3600, 6)}


def statement(session: Session, principal: Principal, project: str, month: str, fmt: str) -> tuple[str, str]:
    """A project's monthly statement as CSV or HTML: one line per job and GPU model (GPU-hours, CPU-core-hours,
    GiB-hours of memory, cost), with totals."""
    try:
        first = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise HTTPException(422, "month: use YYYY-MM") from None
    following = (first + timedelta(days=32)).replace(day=1)
    rows = [r for r in usage_by_job(session, principal, first, following) if r["project"] == project]
    totals = {k: round(sum(float(r[k]) for r in rows), 4 if k == "cost" else 6) for k in STATEMENT_AMOUNTS}
    if fmt == "csv":
        out = io.StringIO()
        writer = SafeDictWriter(out, ["project", "job", "model", *STATEMENT_AMOUNTS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        writer.writerow({"project": project, "job": "TOTAL", "model": "", **totals})
        return out.getvalue(), "text/csv"
    lines = "".join(f"<tr><td>{escape(str(r['job']))}</td><td>{escape(str(r['model']))}</td>"
                    + "".join(f"<td>{r[k]}</td>" for k in STATEMENT_AMOUNTS) + "</tr>" for r in rows)
    html = (f"<!doctype html><meta charset=utf-8><title>{escape(project)} {month}</title>"
            f"<h1>Statement: project {escape(project)}, {month}</h1><table border=1><tr><th>job</th><th>model</th>"
            f"<th>GPU-hours</th><th>CPU-core-hours</th><th>memory GiB-hours</th><th>cost</th></tr>{lines}"
            f"<tr><th colspan=2>total</th>{''.join(f'<th>{totals[k]}</th>' for k in STATEMENT_AMOUNTS)}</tr></table>")
    return html, "text/html"


def usage_by_job(session: Session, principal: Principal, start: datetime, end: datetime) -> list[dict[str, object]]:
    require(principal, "viewer")
    query = select(LedgerEntry.project_id, LedgerEntry.job_id, LedgerEntry.model,
                   func.sum(LedgerEntry.gpu_milli_seconds), func.sum(LedgerEntry.cost_micro_cents),
                   func.sum(LedgerEntry.cpu_milli_seconds), func.sum(LedgerEntry.memory_mib_seconds)).where(
        LedgerEntry.start >= start, LedgerEntry.start < end).group_by(
        LedgerEntry.project_id, LedgerEntry.job_id, LedgerEntry.model)
    if not principal.is_operator:
        query = query.where(LedgerEntry.org_id == principal.org_id)
    projects = {p.id: p.name for p in session.scalars(select(Project))}
    return [{"project": projects.get(p, ""), "job": j, "model": m, **_hours(int(s), int(cpu), int(memory)),
             "cost": round(int(c) / 1e8, 4)} for p, j, m, s, c, cpu, memory in session.execute(query)
            if principal.at_least("tenant-admin") or projects.get(p) in principal.projects]


def period_start(period: str, now: datetime) -> datetime:
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return (now - timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_end(period: str, now: datetime) -> datetime:
    """When the period holding `now` ends: the next period's start."""
    start = period_start(period, now)
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    return (start + timedelta(days=32)).replace(day=1)


def budget_use(session: Session, budget: Budget, now: datetime) -> tuple[float, float]:
    """(GPU-hours, cents) spent against a budget in its current period."""
    start, end = period_start(budget.period, now), rollup.day_of(now) + 2 * rollup.DAY
    if budget.scope == "project":
        rows = list(rollup.totals(session, start, end, "project", budget.org_id,
                                  list(session.scalars(_budget_project(budget)))))
    else:  # an organisation's queue: its jobs only (another may have a queue of that name); a shared one: all
        queue = find_queue(session, budget.org_id, budget.name)
        org = queue.org_id if queue is not None else budget.org_id
        rows = [r for r in rollup.totals(session, start, end, "queue", org) if r[1] == budget.name]
    return sum(r[2] for r in rows) / 1000 / 3600, sum(r[3] for r in rows) / 1e6


def exceeded(budget: Budget, used_hours: float, used_cents: float) -> bool:
    return (budget.gpu_hours is not None and used_hours >= budget.gpu_hours) or (
        budget.cents is not None and used_cents >= budget.cents)


def _budget_project(budget: Budget) -> Select[Any]:
    """The project a project budget is for: project names are only unique within an organisation."""
    return select(Project.id).where(Project.org_id == budget.org_id, Project.name == budget.name)


def exhausted_hard_budgets(session: Session, now: datetime) -> dict[tuple[str, str], str]:
    """("queue", the scheduling core's queue key) or ("project", project id) -> why, for every hard budget used up
    in its period."""
    out = {}
    queues = QueueIndex.load(session)
    for budget in session.scalars(select(Budget).where(Budget.hard.is_(True))):
        hours, cents = budget_use(session, budget, now)
        if exceeded(budget, hours, cents):
            limit = f"{budget.gpu_hours} GPU-hours" if budget.gpu_hours is not None else f"{budget.cents} cents"
            target = (queues.key(budget.org_id or "", budget.name) if budget.scope == "queue"
                      else session.scalar(_budget_project(budget)) or "")
            out[(budget.scope, target)] = (f"the {budget.scope} {budget.name!r} used its {budget.period}ly "
                                           f"budget of {limit} (hard limit): no new jobs until the next period")
    return out
