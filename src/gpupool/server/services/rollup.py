"""Usage totals over any window, fast: whole UTC days come from `usage_daily` (the ledger summed per day and
group, kept in step by `add`), and only the partial days at the window's edges are summed from the ledger.

Both tables attribute an entry to the day of its start, so a window [start, end) sums exactly the ledger
entries whose start lies in it, whichever table each part comes from.
"""

from __future__ import annotations

import functools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from gpupool.server.db.models import LedgerEntry, UsageDaily
from gpupool.server.db.repositories import upsert

DAY = timedelta(days=1)
#: project id, group key, milli-GPU-seconds, micro-cents, ledger entries, milli-CPU-seconds, MiB-seconds
Row = tuple[str, str, int, int, int, int, int]
#: the columns of usage_daily's unique group
GROUP = ("day", "org_id", "project_id", "user_id", "queue", "model", "tags_key")


def tags_key(tags: dict[str, Any]) -> str:
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))[:512]


def day_of(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


#: the amounts a day's row sums, as ledger columns
AMOUNTS = ("gpu_milli_seconds", "cost_micro_cents", "cpu_milli_seconds", "memory_mib_seconds")


def add(session: Session, entries: Iterable[LedgerEntry]) -> None:
    """Fold new ledger entries into their days' totals (same transaction as the entries themselves), each day's
    group in one INSERT ... ON CONFLICT that adds to the row another writer may have made meanwhile."""
    sums: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    tags: dict[str, dict[str, Any]] = {}
    for e in entries:
        key = tags_key(e.tags)
        tags[key] = e.tags
        total = sums[(day_of(e.start), e.org_id, e.project_id, e.user_id, e.queue, e.model, key)]
        total.update({amount: getattr(e, amount) or 0 for amount in AMOUNTS})  # or 0: not flushed yet
        total["entries"] += 1
    table = UsageDaily.__table__
    for (day, org, project, user, queue, model, key), total in sums.items():
        values = {"day": day, "org_id": org, "project_id": project, "user_id": user, "queue": queue, "model": model,
                  "tags": tags[key], "tags_key": key, **total}
        upsert(session, table, values, GROUP, functools.partial(_added, table))


def _added(table: Any, excluded: Any) -> dict[str, Any]:
    return {column: table.c[column] + excluded[column] for column in (*AMOUNTS, "entries")}


def _group_column(table: type[LedgerEntry] | type[UsageDaily], by: str) -> ColumnElement[Any]:
    if by.startswith("tag:"):
        return table.tags[by[4:]].as_string()
    if by == "job":
        return LedgerEntry.job_id
    return {"project": table.project_id, "user": table.user_id, "queue": table.queue,
            "model": table.model}[by]


def totals(session: Session, start: datetime, end: datetime, by: str, org_id: str | None = None,
           project_ids: Iterable[str] | None = None) -> Iterator[Row]:
    """Per (project, group) sums of the ledger entries starting in [start, end); `by` is project, user, queue,
    model, job (from the ledger only) or tag:<key>; restricted to one organisation and to some projects."""
    if by == "job":
        yield from _sum(session, LedgerEntry, LedgerEntry.start, start, end, by, org_id, project_ids)
        return
    lo, hi = day_of(start), day_of(end)
    lo = lo if lo == start else lo + DAY
    latest = session.scalar(select(func.max(LedgerEntry.start)))
    if latest is not None and _aware(latest, end) < end:
        hi = day_of(end) + DAY if day_of(end) != end else hi  # nothing metered after `end`: its day is whole
    if lo >= hi:
        yield from _sum(session, LedgerEntry, LedgerEntry.start, start, end, by, org_id, project_ids)
        return
    yield from _sum(session, UsageDaily, UsageDaily.day, lo, hi, by, org_id, project_ids)
    for a, b in ((start, lo), (hi, end)):
        if a < b:
            yield from _sum(session, LedgerEntry, LedgerEntry.start, a, b, by, org_id, project_ids)


def _sum(session: Session, table: type[LedgerEntry] | type[UsageDaily], when: Any, start: datetime,
         end: datetime, by: str, org_id: str | None, project_ids: Iterable[str] | None) -> Iterator[Row]:
    column = _group_column(table, by)
    count = func.sum(UsageDaily.entries) if table is UsageDaily else func.count()
    query = select(table.project_id, column, func.sum(table.gpu_milli_seconds), func.sum(table.cost_micro_cents),
                   count, func.sum(table.cpu_milli_seconds), func.sum(table.memory_mib_seconds)).where(
        when >= start, when < end).group_by(table.project_id, column)
    if org_id is not None:
        query = query.where(table.org_id == org_id)
    if project_ids is not None:
        query = query.where(table.project_id.in_(list(project_ids)))
    for project, key, ms, micro, n, cpu, memory in session.execute(query):
        yield str(project), "" if key is None else str(key), int(ms), int(micro), int(n), int(cpu), int(memory)


def _aware(moment: datetime, like: datetime) -> datetime:
    return moment.replace(tzinfo=like.tzinfo) if moment.tzinfo is None else moment
