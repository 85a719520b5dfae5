"""`/api/v1/sessions`: the dashboard's sign-in and "Log out". The dashboard trades the API token a person pastes for a
short-lived session token (the only one it keeps) and revokes that one when the person logs out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, close_session, open_session, principal_from

router = APIRouter(prefix="/api/v1", tags=["auth"])
Caller = Annotated[Principal, Depends(principal_from)]


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.db.session() as session:
        yield session


Db = Annotated[Session, Depends(_session, scope="function")]  # committed before the answer leaves


@router.post("/sessions", response_model=api.TokenOut, status_code=201)
def sign_in(who: Caller, db: Db, request: Request) -> api.TokenOut:
    """A session token for the caller (an API token's holder), valid for GPUPOOL_SESSION_TTL_S (12 h) and never
    past the token presented, which stays valid. The secret shows once."""
    return open_session(db, who, request.app.state.settings.session_ttl_s)


@router.delete("/sessions/current", status_code=204)
def log_out(who: Caller, request: Request) -> Response:
    """Revoke the session token this request presents (404 for an API token)."""
    with request.app.state.db.session() as db:
        close_session(db, who)
    request.app.state.principals.clear()  # committed: this process forgets it now, others within PRINCIPAL_TTL_S
    return Response(status_code=204)
