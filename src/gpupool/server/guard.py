"""The API's guard, as ASGI middlewares in front of every route (RELIABILITY.md S5, S6, S10), outermost first.

`ClientAddress` makes `scope["client"]` the request's real client: the peer, or, only when the peer is one of the
configured trusted proxies, the right-most address of the configured header (X-Forwarded-For by default) that is
not itself a trusted proxy (uvicorn's ProxyHeadersMiddleware walks the hops). Everything below keys on it.

`AuditLog` gives every HTTP request the server's own id (echoed as `X-Request-ID`; a sane `X-Request-ID` of the
client's is kept apart as `client_request_id`) and writes one append-only audit row for every mutating request
(POST, PUT, PATCH, DELETE) made with a verified identity, whatever its outcome (403/404/409/422/429 included); GETs
are never audited. Mutating requests without one (no credential, a bad one, refused before authentication) are
counted in /metrics by route template and status, and at most `sample_per_min` of them per route and minute are
written as rows too, so that no anonymous flood can fill the table. A row is committed before the response leaves,
so a client that saw an answer will find its row. Rows of concurrent requests share one INSERT and COMMIT, written
in a worker thread (services.audit.GroupCommit). Who called comes only from verified identity:
`request.state.principal` (set by auth.principal_from) with its token's prefix, or what a route noted with `note()`
after verifying another credential (the agent registration, its join token); the route is the matched template
(`/api/v1/jobs/{job_id}`), the object the path's id or the `id` of what the request created.

`RateLimit` (inside it, so a refusal is counted too) guards `/api/*` and `/metrics` over HTTP; the agents' WebSocket
channel is not limited (a node's own frames are checked by the hub):
* a token bucket per bearer token, whatever the case of the scheme or the blanks around the token (per client
  without one): over it, 429 with Retry-After;
* failed authentications (401 to a request that presented a credential, or to an agent registration) per client:
  after `auth_failures_per_min` of them within a minute the client is locked out until the oldest failure is a
  minute old. A locked-out client's requests still reach authentication, so a valid credential is answered as
  always; a failed one gets 429 with Retry-After instead of 401.
Limits are per process and kept in memory; the buckets hold at most `MAX_KEYS` keys.

`BodyLimit` (innermost) answers 413 to a body over `max_body_bytes`, declared or streamed, and 408 (closing the
connection) to a body that has not fully arrived `timeout_s` after the request began.
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
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

log = logging.getLogger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
REGISTER_PATH = "/api/v1/agent/register"
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
JOIN_TOKEN_ID = re.compile(r"^[a-z0-9]{1,16}$")
FORWARDED_FOR = b"x-forwarded-for"
#: the sampler's and the counter's route for a path no route of the app matches (raw paths are unbounded)
UNMATCHED = "(unmatched)"
MAX_KEYS = 100_000
MAX_BODY_PEEK = 64 * 1024  # of a mutating response, to find the id of what it created
OBJECT_KEYS = ("id", "node_id", "name", "model")  # never "token" or "credential": those are secrets
Clock = Callable[[], float]


def note(state: Any, **fields: str) -> None:
    """Let a route tell the audit log who called or what it touched (`actor_kind`, `actor`, `object_id`), for
    requests that authenticate otherwise than by bearer token. `state` is `request.state`. Note an actor only once
    its credential verified: a noted actor makes the request an authenticated one."""
    noted = getattr(state, "audit", None) or {}
    state.audit = {**noted, **fields}


def join_token_id(token: str) -> str:
    """The public id of a join token `id.secret` ("" when it is not of that shape: it might be a bare secret)."""
    token_id, dot, _ = token.partition(".")
    return token_id if dot and JOIN_TOKEN_ID.match(token_id) else ""


def bearer_credential(authorization: str) -> str:
    """The credential of an `Authorization` header: what follows the scheme `Bearer` (any case, any blanks around),
    else the whole header; "" for none."""
    scheme, _, rest = authorization.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" else authorization.strip()


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def _source(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _json_response(status: int, detail: str, *headers: tuple[bytes, bytes]) -> tuple[Message, Message]:
    body = json.dumps({"detail": detail}).encode()
    start = {"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]}
    return start, {"type": "http.response.body", "body": body}


async def _too_many(send: Send, detail: str, wait_s: float) -> None:
    await _answer(send, 429, detail, (b"retry-after", str(max(1, math.ceil(wait_s))).encode()))


# the client ---------------------------------------------------------------------------------------------------


class ClientAddress:
    """See the module docstring. With no trusted proxy every header is ignored and the peer is the client."""

    def __init__(self, app: ASGIApp, trusted: list[str], header: str = "X-Forwarded-For") -> None:
        self.app, self.header = app, header.lower().encode("latin-1")
        self.proxied = ProxyHeadersMiddleware(app, trusted_hosts=trusted) if trusted else None  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.proxied is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.header != FORWARDED_FOR:  # the configured header, under the name uvicorn reads
            scope["headers"] = [(FORWARDED_FOR if key == self.header else key, value)
                                for key, value in scope["headers"] if key != FORWARDED_FOR]
        await self.proxied(scope, receive, send)  # type: ignore[arg-type]


# body size and time -------------------------------------------------------------------------------------------


class BodyLimit:
    """413 for a request body over `limit` bytes: at once when Content-Length says so, and also when a body sent
    without one (chunked) grows past it; 408 with `Connection: close` when the body is not whole `timeout_s` after
    the request began (a slow client holds no connection for longer). The rest of such a body is never read."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float, clock: Clock = time.monotonic) -> None:
        self.app, self.limit, self.timeout_s, self.clock = app, limit, timeout_s, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > self.limit:
            await _answer(send, 413, f"body larger than {self.limit} bytes")
            return
        body = _Body(self, receive, send)
        try:
            await self.app(scope, body.receive, body.send)
        except Exception:
            if not body.refused:
                raise


class _Body:
    """One request's body as BodyLimit lets the app read it. States: reading (size and deadline checked) -> whole
    (receive passes through: a wait for the client's disconnect has no deadline), or -> refused (the app reads a
    disconnect, and what it sends is dropped: the 413 or 408 already went)."""

    def __init__(self, limit: BodyLimit, receive: Receive, send: Send) -> None:
        self.limit, self._receive, self._send = limit, receive, send
        self.deadline = limit.clock() + limit.timeout_s
        self.received, self.refused, self.started, self.whole = 0, False, False, False

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        if self.whole:
            return await self._receive()
        with anyio.move_on_after(max(0.0, self.deadline - self.limit.clock())):
            message = await self._receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                self.whole = not message.get("more_body", False)
                if self.received > self.limit.limit:
                    await self._refuse(413, f"body larger than {self.limit.limit} bytes")
                    return {"type": "http.disconnect"}
            return message
        await self._refuse(408, f"request body not received within {self.limit.timeout_s:g} s",
                           (b"connection", b"close"))
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if not self.refused:
            self.started = True
            await self._send(message)

    async def _refuse(self, status: int, detail: str, *headers: tuple[bytes, bytes]) -> None:
        self.refused = True
        if not self.started:  # else the app's answer is on its way: the connection's end tells the client
            await _answer(self._send, status, detail, *headers)


async def _answer(send: Send, status: int, detail: str, *headers: tuple[bytes, bytes]) -> None:
    for message in _json_response(status, detail, *headers):
        await send(message)


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


def _guarded(path: str) -> bool:
    return path.startswith("/api/") or path == "/metrics"


class RateLimit:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, rate_per_s: float, burst: int, auth_failures_per_min: int,
                 clock: Clock = time.monotonic) -> None:
        self.app = app
        self.buckets = TokenBuckets(rate_per_s, burst, clock)
        self.failures = FailureWindow(auth_failures_per_min, 60.0, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        client, credential = _source(scope), bearer_credential(_header(scope, b"authorization"))
        key = "token:" + hashlib.sha256(credential.encode()).hexdigest() if credential else "ip:" + client
        wait = self.buckets.take(key)
        if wait:
            limit = f"{self.buckets.rate:g} requests/s, bursts of {self.buckets.burst}"
            await _too_many(send, f"rate limit: {limit} per {'token' if credential else 'client'}", wait)
            return
        presents = bool(credential) or scope["path"] == REGISTER_PATH
        locked_for = self.failures.blocked_for(client) if presents else 0.0
        status = 0
        refusing = False

        async def watch(message: Message) -> None:
            nonlocal status, refusing
            if message["type"] == "http.response.start":
                status = message["status"]
                refusing = status == 401 and locked_for > 0
                if refusing:  # a locked-out client's failed credential: 429, as the lockout says
                    await _too_many(send, f"too many failed authentications from {client}; retry in "
                                          f"{math.ceil(locked_for)} s", locked_for)
                    return
            if not (refusing and message["type"] == "http.response.body"):
                await send(message)

        await self.app(scope, receive, watch)
        if presents and status == 401:
            self.failures.add(client)


# the audit log ------------------------------------------------------------------------------------------------


def _route(scope: Scope) -> tuple[str, dict[str, Any], bool]:
    """(route template, path parameters, whether a route matched) of the request; the raw path when none did."""
    route = scope.get("route")
    if isinstance(route, Route):
        return route.path_format, dict(scope.get("path_params") or {}), True
    app = scope.get("app")
    for candidate in getattr(getattr(app, "router", None), "routes", ()):
        if isinstance(candidate, Route):
            match, child = candidate.matches(scope)
            if match != Match.NONE:
                return candidate.path_format, dict(child.get("path_params") or {}), True
    return scope["path"][:256], {}, False


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
    """Who called, from verified identity only (the principal authentication left); anonymous without one."""
    principal = (scope.get("state") or {}).get("principal")
    if principal is None:
        return {"actor_kind": "anonymous"}
    fields: dict[str, Any] = {"token_prefix": principal.token_prefix or ""}
    if principal.node_id is not None:
        return {**fields, "actor_kind": "node", "actor": principal.node_id}
    return {**fields, "actor_kind": "user", "actor": principal.user_id or "", "actor_name": principal.user_name or "",
            "org_id": principal.org_id}


class Sampler:
    """At most `per_min` admissions per key in each minute of the clock (whole-minute windows)."""

    def __init__(self, per_min: int, clock: Clock = time.monotonic) -> None:
        self.per_min, self.clock = per_min, clock
        self._window = -1
        self._counts: dict[str, int] = {}

    def admit(self, key: str) -> bool:
        window = int(self.clock() // 60)
        if window != self._window:
            self._window, self._counts = window, {}
        taken = self._counts.get(key, 0)
        if taken >= self.per_min:
            return False
        self._counts[key] = taken + 1
        return True


class AuditLog:
    """See the module docstring. `await record(entry)` returns once the entry's row is committed; `count(route,
    status)` counts a mutating request made without a verified identity, written or not."""

    def __init__(self, app: ASGIApp, record: Callable[[dict[str, Any]], Awaitable[None]],
                 count: Callable[[str, int], None], sample_per_min: int, clock: Clock = time.monotonic) -> None:
        self.app, self.record, self.count = app, record, count
        self.sampler = Sampler(sample_per_min, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        given = _header(scope, b"x-request-id")
        scope.setdefault("state", {}).update(request_id=request_id,
                                             client_request_id=given if REQUEST_ID.match(given) else "")
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
        template, params, matched = _route(scope)
        state = scope.get("state") or {}
        noted = state.get("audit") or {}
        actor = {**_actor(scope), **noted}
        if actor["actor_kind"] == "anonymous":
            self.count(template if matched else UNMATCHED, status)
            if not self.sampler.admit(template if matched else UNMATCHED):
                return
        entry = {"request_id": state["request_id"], "client_request_id": state["client_request_id"],
                 "method": scope["method"][:8], "route": template, "status": status, "source": _source(scope)[:64],
                 **actor, "object_id": _path_object(params) or _created_object(status, body)}
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
