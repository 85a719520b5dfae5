"""The audit log: one append-only row per mutating request (written by gpupool.server.guard.AuditLog), read by
operators newest first, filtered and cursor-paginated."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.engine import Database
from gpupool.server.db.models import AuditEntry, Org

COLUMNS = frozenset(c.key for c in AuditEntry.__table__.columns) - {"id", "at"}


def writer(db: Database) -> Any:
    """The AuditLog middleware's `write`: one INSERT in its own transaction."""
    def write(entry: dict[str, Any]) -> None:
        with db.session() as session:
            session.add(AuditEntry(**{k: v for k, v in entry.items() if k in COLUMNS}))
    return write


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
    items = [api.AuditOut(id=r.id, at=r.at, request_id=r.request_id, actor_kind=r.actor_kind, actor=r.actor,
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
