"""The audit log."""

from __future__ import annotations

from pydantic import Field

from gpupool.protocol.api.common import UtcTime, _Response


class AuditOut(_Response):
    id: int
    at: UtcTime
    request_id: str
    client_request_id: str = Field(default="", description="the client's X-Request-ID, as it sent it")
    actor_kind: str
    actor: str
    actor_name: str
    token_prefix: str
    org: str | None
    method: str
    route: str
    object_id: str
    status: int
    source: str


class AuditPage(_Response):
    items: list[AuditOut]
    next_cursor: str | None = None
