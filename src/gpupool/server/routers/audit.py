"""`GET /api/v1/audit`: the audit log, for operators (every mutating request made with a verified identity,
whatever its outcome, and a bounded sample of those refused without one: gpupool.server.guard.AuditLog)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, principal_from
from gpupool.server.services import audit

router = APIRouter(prefix="/api/v1", tags=["audit"])
Caller = Annotated[Principal, Depends(principal_from)]


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.db.session() as session:
        yield session


Db = Annotated[Session, Depends(_session, scope="function")]


@router.get("/audit", response_model=api.AuditPage)
def audit_log(who: Caller, db: Db, actor: Annotated[str | None, Query(max_length=64)] = None,
              org: Annotated[str | None, Query(max_length=64)] = None,
              method: Annotated[str | None, Query(pattern="^(POST|PUT|PATCH|DELETE)$")] = None,
              route: Annotated[str | None, Query(max_length=256)] = None,
              object_id: Annotated[str | None, Query(alias="object", max_length=128)] = None,
              status: Annotated[int | None, Query(ge=100, le=599)] = None,
              since: Annotated[str | None, Query(max_length=40)] = None,
              until: Annotated[str | None, Query(max_length=40)] = None,
              cursor: Annotated[str | None, Query(max_length=64)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 100) -> api.AuditPage:
    """Newest first. `actor` is a user or node id, `org` an organisation name, `route` a route template such as
    `/api/v1/jobs/{job_id}/cancel`, `object` the id the request named or created."""
    filters = {"actor": actor, "org": org, "method": method, "route": route, "object_id": object_id,
               "status": status, "since": since, "until": until}
    return audit.page(db, who, filters, cursor, limit)
