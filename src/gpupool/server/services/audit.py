"""The audit log: one append-only row per authenticated mutating request and a bounded sample of the others
(recorded by gpupool.server.guard.AuditLog through `GroupCommit`), read by operators newest first, filtered and
cursor-paginated, and kept for the configured retention (`prune_every`)."""

from __future__ import annotations

import asyncio
import base64
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
from fastapi import HTTPException
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.engine import Database, unreachable
from gpupool.server.db.models import AuditEntry, Org

log = logging.getLogger(__name__)

COLUMNS = frozenset(c.key for c in AuditEntry.__table__.columns) - {"id", "at"}
#: each column's value where an entry leaves it out (every row of one multi-row INSERT sets the same columns)
BLANK = {c.key: c.default.arg if c.default is not None else None for c in AuditEntry.__table__.columns
         if c.key in COLUMNS}


def write(db: Database, entries: list[dict[str, Any]]) -> None:
    """Store audit rows in one transaction, one multi-row INSERT."""
    with db.session() as session:
        session.execute(insert(AuditEntry.__table__), [{k: e.get(k, BLANK[k]) for k in COLUMNS} for e in entries])


class GroupCommit:
    """The AuditLog middleware's writer: `await record(entry)` returns once `entry`'s row is committed (or raises
    what refused it). Rows recorded while a batch is being written wait and go together in the next transaction,
    written on a worker thread: one INSERT and one COMMIT (and one thread hop) per batch instead of per request.
    A batch the database refuses is written again row by row, so one bad row costs no other request its row.

    States: idle (nothing to write) -> writing (a drain task runs batches until none is waiting) -> idle."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._waiting: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def record(self, entry: dict[str, Any]) -> None:
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((entry, done))
        if self._drain is None:
            self._drain = asyncio.create_task(self._write_batches())
        await done

    async def _write_batches(self) -> None:
        batch: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                refused = await anyio.to_thread.run_sync(self._write, [entry for entry, _ in batch])
                _settle(batch, refused)
        except BaseException:  # cancelled (shutdown): no request waits for its row forever
            stopped = RuntimeError("the audit writer stopped")
            _settle(batch + self._waiting, [stopped] * (len(batch) + len(self._waiting)))
            self._waiting = []
            raise
        finally:
            self._drain = None

    def _write(self, entries: list[dict[str, Any]]) -> list[Exception | None]:
        """Per entry, None once its row is committed, else the exception that refused it."""
        try:
            write(self.db, entries)
            return [None] * len(entries)
        except Exception as exc:
            if len(entries) == 1 or unreachable(exc):
                return [exc] * len(entries)
        return [self._write([entry])[0] for entry in entries]


#: rows deleted per statement when pruning: short transactions, whatever the backlog
PRUNE_BATCH = 10_000


def prune(db: Database, retention_days: float, now: datetime | None = None) -> int:
    """Delete the rows older than `retention_days` (the database itself refuses to delete younger than a day:
    migration 0007); how many went."""
    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
    pruned = 0
    while True:
        with db.session() as session:
            old = select(AuditEntry.id).where(AuditEntry.at < cutoff).order_by(AuditEntry.id).limit(PRUNE_BATCH)
            gone = session.execute(delete(AuditEntry).where(AuditEntry.id.in_(old))).rowcount  # type: ignore[attr-defined]
        pruned += gone
        if gone < PRUNE_BATCH:
            return pruned


async def prune_every(db: Database, retention_days: float, interval_s: float) -> None:
    """Prune at once and then every `interval_s` until cancelled; a failed pass (the database away) is logged and
    the next one tries again."""
    while True:
        try:
            pruned = await anyio.to_thread.run_sync(prune, db, retention_days)
        except Exception as exc:
            log.warning("audit: pruning rows older than %g days failed, retrying in %g s: %s", retention_days,
                        interval_s, str(exc).splitlines()[0][:200])
        else:
            if pruned:
                log.info("audit: pruned %d rows older than %g days", pruned, retention_days)
        await asyncio.sleep(interval_s)


def _settle(batch: list[tuple[dict[str, Any], asyncio.Future[None]]], refused: list[Exception | None]) -> None:
    for (_, done), exc in zip(batch, refused, strict=True):
        if done.done():
            continue
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)


def page(session: Session, principal: Principal, filters: dict[str, Any], cursor: str | None,
         limit: int) -> api.AuditPage:
    """Rows matching `filters` (actor, org name, method, route, object_id, status, since, until), newest first."""
    require(principal, "operator")
    query = select(AuditEntry).order_by(AuditEntry.id.desc())
    for key in ("actor", "method", "route", "object_id", "status"):
        if filters.get(key) is not None:
            query = query.where(getattr(AuditEntry, key) == filters[key])
    if filters.get("org") is not None:
        query = query.where(AuditEntry.org_id.in_(select(Org.id).where(Org.name == filters["org"])))
    if filters.get("since") is not None:
        query = query.where(AuditEntry.at >= _moment(filters["since"], "since"))
    if filters.get("until") is not None:
        query = query.where(AuditEntry.at < _moment(filters["until"], "until"))
    if cursor:
        query = query.where(AuditEntry.id < _decode_cursor(cursor))
    rows = list(session.scalars(query.limit(limit + 1)))
    more, rows = len(rows) > limit, rows[:limit]
    orgs = {o.id: o.name for o in session.scalars(select(Org).where(Org.id.in_({r.org_id for r in rows})))}
    items = [api.AuditOut(id=r.id, at=r.at, request_id=r.request_id, client_request_id=r.client_request_id,
                          actor_kind=r.actor_kind, actor=r.actor,
                          actor_name=r.actor_name, token_prefix=r.token_prefix, org=orgs.get(r.org_id or ""),
                          method=r.method, route=r.route, object_id=r.object_id, status=r.status, source=r.source)
             for r in rows]
    next_cursor = base64.urlsafe_b64encode(str(rows[-1].id).encode()).decode() if more and rows else None
    return api.AuditPage(items=items, next_cursor=next_cursor)


def _moment(text: str, name: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise HTTPException(422, f"{name}: use an ISO time like 2026-11-01 or 2026-11-01T12:00:00+00:00") from None
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)  # naive: UTC, as /usage


def _decode_cursor(cursor: str) -> int:
    try:
        row_id = int(base64.urlsafe_b64decode(cursor.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        row_id = -1
    if not 0 <= row_id < 1 << 63:
        raise HTTPException(422, "cursor: not a cursor this API returned")
    return row_id
