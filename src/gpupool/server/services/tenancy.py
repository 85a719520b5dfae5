"""Organisations, projects, users, API tokens and join tokens, always scoped to the caller's tenant."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import RANK, Principal, hash_secret, new_token, require
from gpupool.server.db.models import JoinToken, Org, Project, QueueRow, Token, User


def org_for(session: Session, principal: Principal, name: str | None) -> Org:
    """The organisation a request acts in: the caller's own, or any named one for operators."""
    if name is None or name == principal.org_name:
        org = session.get(Org, principal.org_id) if principal.org_id else None
    else:
        if not principal.is_operator:
            raise HTTPException(404, f"organisation {name!r} not found")
        org = session.scalar(select(Org).where(Org.name == name))
    if org is None:
        raise HTTPException(404, f"organisation {name!r} not found")
    return org


def _visible(principal: Principal, org_id: str | None) -> bool:
    return principal.is_operator or org_id == principal.org_id


def create_org(session: Session, principal: Principal, body: api.OrgCreate) -> api.OrgOut:
    require(principal, "operator")
    org = Org(name=body.name)
    session.add(org)
    _flush(session, f"organisation {body.name!r} exists")
    return api.OrgOut(id=org.id, name=org.name)


def list_orgs(session: Session, principal: Principal) -> list[api.OrgOut]:
    rows = session.scalars(select(Org).order_by(Org.name))
    return [api.OrgOut(id=o.id, name=o.name) for o in rows if _visible(principal, o.id)]


def create_project(session: Session, principal: Principal, body: api.ProjectCreate) -> api.ProjectOut:
    require(principal, "tenant-admin")
    org = org_for(session, principal, body.org)
    project = Project(org_id=org.id, name=body.name, cost_centre=body.cost_centre)
    session.add(project)
    _flush(session, f"project {body.name!r} exists")
    return api.ProjectOut(id=project.id, name=project.name, org=org.name, cost_centre=project.cost_centre)


def list_projects(session: Session, principal: Principal) -> list[api.ProjectOut]:
    orgs = {o.id: o.name for o in session.scalars(select(Org))}
    rows = session.scalars(select(Project).order_by(Project.name))
    return [api.ProjectOut(id=p.id, name=p.name, org=orgs[p.org_id], cost_centre=p.cost_centre)
            for p in rows if _visible(principal, p.org_id) and member(principal, p.name)]


def member(principal: Principal, project: str) -> bool:
    """Whether the caller may see and use `project` of its organisation."""
    return principal.at_least("tenant-admin") or project in principal.projects


def create_user(session: Session, principal: Principal, body: api.UserCreate) -> api.UserOut:
    require(principal, "tenant-admin")
    if body.role == "operator" and not principal.is_operator:
        raise HTTPException(403, "only operators create operators")
    org = org_for(session, principal, body.org)
    for name in body.projects:
        if session.scalar(select(Project).where(Project.org_id == org.id, Project.name == name)) is None:
            raise HTTPException(422, f"projects: {name!r} is not a project of {org.name}")
    user = User(org_id=org.id, name=body.name, role=body.role, projects=list(body.projects))
    session.add(user)
    _flush(session, f"user {body.name!r} exists")
    return api.UserOut(id=user.id, name=user.name, org=org.name, role=body.role, projects=body.projects)


def list_users(session: Session, principal: Principal) -> list[api.UserOut]:
    require(principal, "project-admin")
    orgs = {o.id: o.name for o in session.scalars(select(Org))}
    return [api.UserOut(id=u.id, name=u.name, org=orgs[u.org_id], role=u.role, projects=u.projects)  # type: ignore[arg-type]
            for u in session.scalars(select(User).order_by(User.name)) if _visible(principal, u.org_id)]


def create_token(session: Session, principal: Principal, body: api.TokenCreate) -> api.TokenOut:
    """A new API token for the caller, or (admins) for a user of their organisation; the secret shows once."""
    if principal.role == "agent":
        raise HTTPException(403, "agents cannot create tokens")
    user_id, user_name = principal.user_id, principal.user_name
    if body.user is not None and (body.user != principal.user_name or body.org not in (None, principal.org_name)):
        require(principal, "tenant-admin")
        org = org_for(session, principal, body.org)
        user = session.scalar(select(User).where(User.org_id == org.id, User.name == body.user))
        if user is None:
            raise HTTPException(404, f"user {body.user!r} not found")
        _not_above(principal, user)
        user_id, user_name = user.id, user.name
    prefix, secret = new_token()
    expires = datetime.now(UTC) + timedelta(seconds=body.ttl_s) if body.ttl_s else None
    row = Token(prefix=prefix, secret_hash=hash_secret(secret), name=body.name, user_id=user_id, expires_at=expires)
    session.add(row)
    session.flush()
    return api.TokenOut(id=row.id, prefix=prefix, name=body.name, user=user_name, expires_at=expires,
                        revoked_at=None, token=secret)


def list_tokens(session: Session, principal: Principal) -> list[api.TokenOut]:
    users = {u.id: u for u in session.scalars(select(User))}
    out = []
    for t in session.scalars(select(Token).where(Token.user_id.is_not(None)).order_by(Token.created_at)):
        owner = users.get(t.user_id or "")
        if owner is None or not (t.user_id == principal.user_id or (
                principal.at_least("tenant-admin") and _visible(principal, owner.org_id))):
            continue
        out.append(api.TokenOut(id=t.id, prefix=t.prefix, name=t.name, user=owner.name, expires_at=t.expires_at,
                                revoked_at=t.revoked_at))
    return out


def revoke_token(session: Session, principal: Principal, token_id: str) -> None:
    row = session.get(Token, token_id)
    owner = session.get(User, row.user_id) if row is not None and row.user_id else None
    allowed = owner is not None and (row.user_id == principal.user_id or (  # type: ignore[union-attr]
        principal.at_least("tenant-admin") and _visible(principal, owner.org_id)))
    if row is None or not allowed:
        raise HTTPException(404, "token not found")
    _not_above(principal, owner)  # type: ignore[arg-type]
    row.revoked_at = row.revoked_at or datetime.now(UTC)


def _not_above(principal: Principal, user: User) -> None:
    """403 when `user` outranks the caller: a tenant admin must not mint or revoke an operator's tokens."""
    if RANK.get(user.role, len(RANK)) > RANK[principal.role]:
        raise HTTPException(403, f"user {user.name!r} holds a higher role than yours")


#: Join tokens are `id.secret` (kubeadm style): a public id of 64 random bits (hex, the row's key and what the audit
#: log names) and a secret of 256 random bits (hex), stored only as its SHA-256 hash and compared in constant time.
JOIN_TOKEN_ID_BYTES, JOIN_TOKEN_SECRET_BYTES = 8, 32


def create_join_token(session: Session, principal: Principal, body: api.JoinTokenCreate) -> api.JoinTokenOut:
    """A single-use token that lets one agent register (`id.secret`, see JOIN_TOKEN_SECRET_BYTES)."""
    require(principal, "operator")
    token_id, secret = secrets.token_hex(JOIN_TOKEN_ID_BYTES), secrets.token_hex(JOIN_TOKEN_SECRET_BYTES)
    expires = datetime.now(UTC) + timedelta(seconds=body.ttl_s)
    session.add(JoinToken(id=token_id, secret_hash=hash_secret(secret), expires_at=expires))
    return api.JoinTokenOut(token=f"{token_id}.{secret}", expires_at=expires)


def bootstrap(session: Session) -> str | None:
    """On a fresh database: organisation, project and queue "default", an operator "admin", and its token."""
    if session.scalar(select(Org).limit(1)) is not None:
        return None
    org = Org(name="default")
    session.add(org)
    session.flush()
    session.add(Project(org_id=org.id, name="default"))
    session.add(QueueRow(name="default", org_id=org.id, guaranteed={}))
    admin = User(org_id=org.id, name="admin", role="operator", projects=["default"])
    session.add(admin)
    session.flush()
    prefix, secret = new_token()
    session.add(Token(prefix=prefix, secret_hash=hash_secret(secret), name="bootstrap", user_id=admin.id))
    return secret


def _flush(session: Session, conflict: str) -> None:
    try:
        session.flush()
    except IntegrityError:
        raise HTTPException(409, conflict) from None
