"""The API's guard, as ASGI middlewares in front of every route (RELIABILITY.md S5, S6, S10), outermost first.

`AuditLog` (outermost) gives every HTTP request an id (a sane `X-Request-ID` of the client's, else a random one,
echoed in the response) and writes one append-only audit row for every mutating request (POST, PUT, PATCH,
DELETE), whatever its outcome, 401/403/404/413/422/429 included; GETs are never audited. The row is committed
before the response leaves, so a client that saw an answer will find its row. Rows of concurrent requests share
one INSERT and COMMIT, written in a worker thread (services.audit.GroupCommit). Who called comes from
`request.state.principal` (set by auth.principal_from), or from what a route noted with `note()` (the agent
registration names its join token); the route is the matched template (`/api/v1/jobs/{job_id}`), the object the
path's id or the `id` of what the request created.

`RateLimit` (inside it, so a refusal is audited too) guards `/api/*` over HTTP; the agents' WebSocket channel is
not limited (a node's own frames are checked by the hub):
* a token bucket per bearer token (per source address without one): over it, 429 with Retry-After;
* failed authentications (401 to a request that presented a bearer token, or to an agent registration) per
  source address: after `auth_failures_per_min` of them within a minute, every request from that address that
  presents a credential gets 429 with Retry-After until the oldest failure is a minute old, before any lookup.
Limits are per process and kept in memory; the buckets hold at most `MAX_KEYS` keys.

`BodyLimit` (innermost) answers 413 to a body over `max_body_bytes`, declared or streamed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
REGISTER_PATH = "/api/v1/agent/register"
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
TOKEN_PREFIX = re.compile(r"^Bearer gp_([A-Za-z0-9]{1,16})_", re.IGNORECASE)
JOIN_TOKEN_ID = re.compile(r"^[a-z0-9]{1,16}$")
MAX_KEYS = 100_000
MAX_BODY_PEEK = 64 * 1024  # of a mutating response, to find the id of what it created
OBJECT_KEYS = ("id", "node_id", "name", "model")  # never "token" or "credential": those are secrets
Clock = Callable[[], float]


def note(state: Any, **fields: str) -> None:
    """Let a route tell the audit log who called or what it touched (`actor_kind`, `actor`, `object_id`), for
    requests that authenticate otherwise than by bearer token. `state` is `request.state`."""
    noted = getattr(state, "audit", None) or {}
    state.audit = {**noted, **fields}


def join_token_id(token: str) -> str:
    """The public id of a join token `id.secret` ("" when it is not of that shape: it might be a bare secret)."""
    token_id, dot, _ = token.partition(".")
    return token_id if dot and JOIN_TOKEN_ID.match(token_id) else ""


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def _source(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


async def _too_many(send: Send, detail: str, wait_s: float) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(max(1, math.ceil(wait_s))).encode())]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# body size ----------------------------------------------------------------------------------------------------


class BodyLimit:
    """413 for a request body over `limit` bytes: at once when Content-Length says so, and also when a body sent
    without one (chunked) grows past it; the rest of it is then never read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        received, refused = 0, False

        async def counted() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                received += len(message.get("body", b""))
                if received > self.limit:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        try:
            await self.app(scope, counted, unless_refused)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": f"body larger than {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


# rate limits --------------------------------------------------------------------------------------------------


class TokenBuckets:
    """One bucket of `burst` tokens per key, refilled at `rate_per_s`; `take` spends one or says how long to wait."""

    def __init__(self, rate_per_s: float, burst: int, clock: Clock = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate_per_s, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def take(self, key: str) -> float:
        """0 when a token was spent, else the seconds until one will be there."""
        now = self.clock()
        tokens, when = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate)
        if len(self._buckets) >= MAX_KEYS:
            self._prune(now)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        """Forget buckets that are full again (forgetting them changes nothing); all of them if none is."""
        full_after = self.burst / self.rate
        kept = {k: v for k, v in self._buckets.items() if now - v[1] < full_after}
        self._buckets = kept if len(kept) < MAX_KEYS else {}


class FailureWindow:
    """The latest `limit` failure times per key; a key is blocked while `limit` of them fall within `window_s`."""

    def __init__(self, limit: int, window_s: float = 60.0, clock: Clock = time.monotonic) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._failures: dict[str, deque[float]] = {}

    def add(self, key: str) -> None:
        if len(self._failures) >= MAX_KEYS:
            now = self.clock()
            self._failures = {k: v for k, v in self._failures.items() if now - v[-1] < self.window_s}
        self._failures.setdefault(key, deque(maxlen=self.limit)).append(self.clock())

    def blocked_for(self, key: str) -> float:
        """Seconds until `key` may try again (0: it may now)."""
        times = self._failures.get(key)
        if times is None or len(times) < self.limit:
            return 0.0
        return max(0.0, times[0] + self.window_s - self.clock())


class RateLimit:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, rate_per_s: float, burst: int, auth_failures_per_min: int,
                 clock: Clock = time.monotonic) -> None:
        self.app = app
        self.buckets = TokenBuckets(rate_per_s, burst, clock)
        self.failures = FailureWindow(auth_failures_per_min, 60.0, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        source, authorization = _source(scope), _header(scope, b"authorization")
        presents = bool(authorization) or scope["path"] == REGISTER_PATH
        wait = self.failures.blocked_for(source) if presents else 0.0
        if wait:
            await _too_many(send, f"too many failed authentications from {source}; retry in {math.ceil(wait)} s",
                            wait)
            return
        key = "token:" + hashlib.sha256(authorization.encode()).hexdigest() if authorization else "ip:" + source
        wait = self.buckets.take(key)
        if wait:
            limit = f"{self.buckets.rate:g} requests/s, bursts of {self.buckets.burst}"
            await _too_many(send, f"rate limit: {limit} per {'token' if authorization else 'address'}", wait)
            return
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if presents and status == 401:
            self.failures.add(source)


# the audit log ------------------------------------------------------------------------------------------------


def _route(scope: Scope) -> tuple[str, dict[str, Any]]:
    """(route template, path parameters) of the request; the raw path when no route of the app matches it."""
    route = scope.get("route")
    if isinstance(route, Route):
        return route.path_format, dict(scope.get("path_params") or {})
    app = scope.get("app")
    for candidate in getattr(getattr(app, "router", None), "routes", ()):
        if isinstance(candidate, Route):
            match, child = candidate.matches(scope)
            if match != Match.NONE:
                return candidate.path_format, dict(child.get("path_params") or {})
    return scope["path"][:256], {}


def _path_object(params: dict[str, Any]) -> str:
    for key in sorted(params, key=lambda k: not k.endswith("_id")):
        return str(params[key])[:128]
    return ""


def _created_object(status: int, body: bytes) -> str:
    if not 200 <= status < 300 or not body.startswith(b"{"):
        return ""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    found = next((data[k] for k in OBJECT_KEYS if isinstance(data.get(k), str | int)), "")
    return str(found)[:128]


def _actor(scope: Scope) -> dict[str, Any]:
    state = scope.get("state") or {}
    principal = state.get("principal")
    prefix = TOKEN_PREFIX.match(_header(scope, b"authorization"))
    fields: dict[str, Any] = {"actor_kind": "anonymous", "token_prefix": prefix.group(1) if prefix else ""}
    if principal is not None and principal.node_id is not None:
        fields.update(actor_kind="node", actor=principal.node_id)
    elif principal is not None:
        fields.update(actor_kind="user", actor=principal.user_id or "", actor_name=principal.user_name or "",
                      org_id=principal.org_id)
    return fields


class AuditLog:
    """See the module docstring. `await record(entry)` returns once the entry's row is committed."""

    def __init__(self, app: ASGIApp, record: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.app, self.record = app, record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        request_id = given if REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        if scope["method"] not in MUTATING:
            await self.app(scope, receive, _stamped(send, request_id))
            return
        held: list[Message] = []
        peek = bytearray()
        recorded = False

        async def hold(message: Message) -> None:
            nonlocal recorded
            if recorded or message["type"] not in ("http.response.start", "http.response.body"):
                await send(message)
                return
            held.append(_with_id(message, request_id) if message["type"] == "http.response.start" else message)
            if message["type"] == "http.response.body":
                peek.extend(message.get("body", b"")[:MAX_BODY_PEEK])
                if message.get("more_body", False) and len(peek) < MAX_BODY_PEEK:
                    return
                recorded = True
                await self._record(scope, held[0]["status"], bytes(peek))
                for waiting in held:
                    await send(waiting)

        try:
            await self.app(scope, receive, hold)
        except BaseException:
            if not recorded:
                await self._record(scope, 500, b"")
            raise
        if not recorded:  # the app ended without a whole response (a client gone away)
            await self._record(scope, held[0]["status"] if held else 500, bytes(peek))
            for waiting in held:
                await send(waiting)

    async def _record(self, scope: Scope, status: int, body: bytes) -> None:
        template, params = _route(scope)
        noted = (scope.get("state") or {}).get("audit") or {}
        entry = {"request_id": scope["state"]["request_id"], "method": scope["method"][:8], "route": template,
                 "status": status, "source": _source(scope)[:64], **_actor(scope),
                 "object_id": _path_object(params) or _created_object(status, body), **noted}
        entry = {k: v.replace("\x00", "\\x00") if isinstance(v, str) else v for k, v in entry.items()}  # PostgreSQL
        try:
            with anyio.CancelScope(shield=True):  # a client that hangs up does not cancel its audit row
                await self.record(entry)
        except Exception:  # the request is done; the failure is loud in the log, the answer stands
            log.exception("audit: could not record %s %s -> %d", entry["method"], template, status)


def _with_id(message: Message, request_id: str) -> Message:
    return {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}


def _stamped(send: Send, request_id: str) -> Send:
    async def stamped(message: Message) -> None:
        await send(_with_id(message, request_id) if message["type"] == "http.response.start" else message)
    return stamped
