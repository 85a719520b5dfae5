"""Organisations, projects, users, tokens, join tokens and `whoami`."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpupool.protocol.api.common import NAME, Resources, Role, UtcTime, _Request, _Response


class OrgCreate(_Request):
    name: str = Field(pattern=NAME)


class OrgOut(_Response):
    id: str
    name: str


class OrgCeiling(_Request):
    """What an organisation's tenant admins may grant its queues; operators set it, and only operators grant beyond
    it. Its top-level queues (those whose parent is not a queue of its own) share the cluster with other
    organisations: their guarantees and over-quota weights add up under the ceiling. The defaults are a new
    organisation's ceiling: no guarantee, any limit, over-quota weight 1, priority at most 0."""

    guaranteed: Resources = Field(default_factory=Resources, description=(
        "the most its top-level queues guarantee together (and any one of its queues)"))
    limit: Resources | None = Field(default=None, description=(
        "every queue's limit must set each of these resources, at most to these amounts; null: no cap"))
    over_quota_weight: int = Field(default=1, ge=0, le=1000, description=(
        "the most its top-level queues' over-quota weights add up to (and any one queue's)"))
    max_priority: int = Field(default=0, ge=-1000, le=1000, description="the highest priority of any of its queues")


class OrgCeilingOut(_Response):
    org: str
    guaranteed: dict[str, Any]
    limit: dict[str, Any] | None
    over_quota_weight: int
    max_priority: int
    granted_guaranteed: dict[str, Any] = Field(description="what its top-level queues guarantee together now")
    granted_over_quota_weight: int = Field(description="their over-quota weights added up")


class ProjectCreate(_Request):
    name: str = Field(pattern=NAME)
    org: str | None = Field(default=None, description="organisation name (operators only)")
    cost_centre: str = Field(default="", max_length=64)


class ProjectOut(_Response):
    id: str
    name: str
    org: str
    cost_centre: str


class UserCreate(_Request):
    name: str = Field(pattern=NAME)
    role: Role = "member"
    projects: list[str] = Field(default_factory=list, max_length=64)
    org: str | None = None


class UserOut(_Response):
    id: str
    name: str
    org: str
    role: Role
    projects: list[str]


class TokenCreate(_Request):
    name: str = Field(default="", max_length=64)
    user: str | None = Field(default=None, description="user name in your organisation (admins only)")
    org: str | None = Field(default=None, description="organisation of `user` (operators only)")
    ttl_s: int | None = Field(default=None, ge=60, le=366 * 86400)


class TokenOut(_Response):
    id: str
    prefix: str
    name: str
    user: str | None
    expires_at: UtcTime | None
    revoked_at: UtcTime | None
    token: str | None = Field(default=None, description="the secret, shown once at creation")


class JoinTokenCreate(_Request):
    ttl_s: int = Field(default=3600, ge=60, le=86400)


class JoinTokenOut(_Response):
    token: str
    expires_at: UtcTime
    ca_hash: str = Field(default="", description="sha256 of the agent CA's public key: `gpupool agent --ca-hash`")


class Whoami(_Response):
    user: str | None
    org: str | None
    role: str
    projects: list[str]
