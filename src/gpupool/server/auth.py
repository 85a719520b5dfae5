"""API tokens and who is calling.

Tokens look like `gp_<prefix>_<secret>`: 256 random bits, stored only as a SHA-256 hash, found by their
prefix (shown in listings), revocable and optionally expiring. Node credentials are tokens bound to a node.
A session token (`open_session`, what the dashboard holds) is a short-lived token opened with an API token: it
dies with that token, and `close_session` revokes it (the dashboard's "Log out").
Roles rank viewer < member < project-admin < tenant-admin < operator; operators see every tenant,
everyone else only their own organisation (another tenant's objects answer 404).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import anyio
from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.protocol.api import ROLES
from gpupool.server.db.models import Node, Org, Token, User
from gpupool.server.guard import bearer_credential

if TYPE_CHECKING:
    from gpupool.server.db.engine import Database

RANK = {role: i for i, role in enumerate(ROLES)}


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(prefix, full token) for a fresh API token."""
    prefix = secrets.token_hex(5)
    return prefix, f"gp_{prefix}_{secrets.token_urlsafe(32)}"


@dataclass(frozen=True)
class Principal:
    role: str
    user_id: str | None = None
    user_name: str | None = None
    org_id: str | None = None
    org_name: str | None = None
    projects: tuple[str, ...] = field(default_factory=tuple)
    node_id: str | None = None
    #: the token the caller presented: its row id, its public prefix, and whether it is a session's
    token_id: str | None = None
    token_prefix: str | None = None
    session: bool = False

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    def at_least(self, role: str) -> bool:
        return RANK.get(self.role, -1) >= RANK[role]


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, value = header.strip().partition(" ")[0], bearer_credential(header)
    if scheme.lower() != "bearer" or not value.startswith("gp_"):
        raise HTTPException(401, "missing or malformed bearer token", headers={"WWW-Authenticate": "Bearer"})
    return value


def resolve(session: Session, token: str) -> Principal:
    """The principal a token stands for; 401 for unknown, revoked or expired tokens."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != "gp":
        raise HTTPException(401, "malformed token")
    row = session.scalar(select(Token).where(Token.prefix == parts[1]))
    now = datetime.now(UTC)
    if row is None or not hmac.compare_digest(row.secret_hash, hash_secret(token)):
        raise HTTPException(401, "unknown token")
    if not _live(row, now):
        raise HTTPException(401, "token revoked or expired")
    if row.session_of is not None and not _live(session.get(Token, row.session_of), now):
        raise HTTPException(401, "the token this session was opened with is revoked or expired")
    presented = {"token_id": row.id, "token_prefix": row.prefix}
    is_session = row.session_of is not None
    if row.node_id is not None:
        node = session.get(Node, row.node_id)
        return Principal(role="agent", node_id=node.id if node else None, session=is_session, **presented)
    user = session.get(User, row.user_id)
    if user is None:
        raise HTTPException(401, "token has no user")
    org = session.get(Org, user.org_id)
    return Principal(user.role, user.id, user.name, user.org_id, org.name if org else None, tuple(user.projects),
                     session=is_session, **presented)


def _live(row: Token | None, now: datetime) -> bool:
    return row is not None and row.revoked_at is None and (row.expires_at is None or _aware(row.expires_at) > now)


SESSION_NAME = "dashboard session"


def open_session(session: Session, principal: Principal, ttl_s: float) -> api.TokenOut:
    """A session token for the caller's user, living `ttl_s` (never past the token it is opened with, with which
    it dies). 403 for a node's credential or a session token: a session never prolongs itself."""
    if principal.role == "agent" or principal.token_id is None:
        raise HTTPException(403, "only a user's API token opens a session")
    if principal.session:
        raise HTTPException(403, "a session token cannot open another session; sign in with an API token")
    opened_with = session.get(Token, principal.token_id)
    expires = datetime.now(UTC) + timedelta(seconds=ttl_s)
    if opened_with is not None and opened_with.expires_at is not None:
        expires = min(expires, _aware(opened_with.expires_at))
    prefix, secret = new_token()
    row = Token(prefix=prefix, secret_hash=hash_secret(secret), name=SESSION_NAME, user_id=principal.user_id,
                expires_at=expires, session_of=principal.token_id)
    session.add(row)
    session.flush()
    return api.TokenOut(id=row.id, prefix=prefix, name=SESSION_NAME, user=principal.user_name, expires_at=expires,
                        revoked_at=None, token=secret)


def close_session(session: Session, principal: Principal) -> None:
    """Revoke the session token the caller presented; 404 when it presented an API token (those are revoked by
    id, DELETE /api/v1/tokens/{id}, never by logging out)."""
    row = session.get(Token, principal.token_id) if principal.session else None
    if row is None:
        raise HTTPException(404, "this token is not a session; revoke an API token with DELETE /api/v1/tokens/{id}")
    row.revoked_at = row.revoked_at or datetime.now(UTC)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


#: How long a resolved token is trusted without another database read (revocation takes effect within it).
PRINCIPAL_TTL_S = 2.0


#: Declares the bearer token in the OpenAPI spec of every route that asks for the caller (schemathesis' ignored_auth
#: check probes those); `_bearer` reads and checks the header itself.
BEARER = HTTPBearer(auto_error=False, scheme_name="bearer", description="an API token, gp_<prefix>_<secret>")


async def principal_from(request: Request,
                         _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None) -> Principal:
    """The caller, also left in `request.state.principal` for the audit log. A cached one is answered on the event
    loop; only a lookup goes to a worker thread."""
    token = _bearer(request)
    cache: dict[str, tuple[float, Principal]] = request.app.state.principals
    hit = cache.get(token)
    now = time.monotonic()
    if hit is not None and now - hit[0] < PRINCIPAL_TTL_S:
        request.state.principal = hit[1]
        return hit[1]
    principal = await anyio.to_thread.run_sync(_lookup, request.app.state.db, token)
    if len(cache) > 10_000:
        cache.clear()
    cache[token] = (now, principal)
    request.state.principal = principal
    return principal


def _lookup(db: Database, token: str) -> Principal:
    with db.session() as session:
        return resolve(session, token)


def require(principal: Principal, role: str) -> None:
    """403 unless the caller holds at least `role` (agents hold no user role)."""
    if principal.role == "agent" or not principal.at_least(role):
        raise HTTPException(403, f"this needs the {role} role")
