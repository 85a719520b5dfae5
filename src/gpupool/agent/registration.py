"""Registration and finding the channel: `register()` trades a join token (and a CSR) for a node credential and a
client certificate over HTTP; `locate_channel` reads the control plane's TLS 1.3 agent port from `/readyz` before
every connect, and `locate_leader` asks each of a pool's control planes in turn for the one that leads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import ValidationError

from gpupool.protocol.agent import (
    Registration,
    RegistrationReply,
)
from gpupool.protocol.signing import hash_matches, key_hash
from gpupool.protocol.tls import ca_hash, ca_hash_matches

log = logging.getLogger("gpupool.agent.channel")

REGISTER_PATH = "/api/v1/agent/register"
CHANNEL_PATH = "/api/v1/agent/channel"


class RegistrationError(RuntimeError):
    """Registration failed; `retryable` is True for network errors, 5xx and 429, False for other 4xx."""

    def __init__(self, message: str, *, status_code: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retryable = retryable



def endpoint(server_url: str, path: str, *, websocket: bool = False) -> str:
    """`server_url` (http, https, ws or wss) with `path` appended, in the http(s) or ws(s) scheme as asked."""
    parts = urlsplit(server_url)
    secure = parts.scheme in ("https", "wss")
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"bad control-plane URL {server_url!r}: expected http(s)://host[:port]")
    scheme = ("wss" if secure else "ws") if websocket else ("https" if secure else "http")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))



def register(
    server_url: str,
    registration: Registration,
    transport: httpx.BaseTransport | None = None,
    *,
    timeout_s: float = 10.0,
    key_pin: str | None = None,
    ca_pin: str | None = None,
) -> RegistrationReply:
    """POST `registration` to `{server}/api/v1/agent/register` and return the reply.

    Raises `RegistrationError` carrying the server's own message on an HTTP error, and on an unreachable server
    or a malformed reply; also (not retryable) when `key_pin` ("sha256:<hex>", given to the operator by the
    control plane) is not the hash of the order key in the reply, or `ca_pin` not the hash of its agent CA (printed
    by `gpupool join-token create`): that is not our control plane (the join token is spent all the same); and when
    a CSR was sent but no certificate came back. `transport` lets tests answer without a network.
    """
    url = endpoint(server_url, REGISTER_PATH)
    try:
        with httpx.Client(transport=transport, timeout=timeout_s) as client:
            response = client.post(
                url, content=registration.model_dump_json(), headers={"Content-Type": "application/json"}
            )
    except httpx.TransportError as exc:
        raise RegistrationError(f"cannot reach the control plane at {url}: {exc}", retryable=True) from exc
    code = response.status_code
    if code >= 400:
        message = f"registration refused by {url} (HTTP {code}): {server_message(response)}"
        raise RegistrationError(message, status_code=code, retryable=code >= 500 or code == 429)
    try:
        reply = RegistrationReply.model_validate_json(response.content)
    except ValidationError as exc:
        raise RegistrationError(f"malformed registration reply from {url}: {exc}") from exc
    if key_pin and not hash_matches(reply.order_key, key_pin):
        raise RegistrationError(
            f"the control plane at {url} signs with key {_safe_hash(reply.order_key)}, not the pinned {key_pin}: "
            "refusing to join it"
        )
    if ca_pin and not ca_hash_matches(reply.ca_certificate, ca_pin):
        raise RegistrationError(
            f"the control plane at {url} has agent CA {_safe_ca_hash(reply.ca_certificate)}, not the pinned "
            f"{ca_pin}: refusing to join it"
        )
    if registration.csr and not (reply.certificate and reply.ca_certificate):
        raise RegistrationError(f"the control plane at {url} issued no channel certificate")
    return reply



def _safe_ca_hash(ca_pem: str) -> str:
    try:
        return ca_hash(ca_pem)
    except ValueError:
        return "(none or malformed)"



async def locate_channel(server_url: str, transport: httpx.AsyncBaseTransport | None = None,
                         timeout_s: float = 10.0) -> str:
    """The channel's wss URL: the host of `server_url` and the agent port the control plane reports in /readyz.
    Raises httpx.HTTPError or ValueError when it cannot say, or does not lead (a standby admits no agent: the
    caller tries its next control plane, or backs off and retries)."""
    async with httpx.AsyncClient(transport=transport, timeout=timeout_s) as client:
        response = await client.get(endpoint(server_url, "/readyz"))
    response.raise_for_status()
    ready = response.json()
    if ready.get("leader") is False:
        raise ValueError(f"{server_url} is a standby" + (f" ({ready['refusal']})" if ready.get("refusal") else ""))
    port = int(ready.get("agent_port") or 0)
    if not 0 < port < 65536:
        raise ValueError(f"{server_url} reports no agent port yet")
    host = urlsplit(server_url).hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"wss://{host}:{port}{CHANNEL_PATH}"



async def locate_leader(servers: Sequence[str], transport: httpx.AsyncBaseTransport | None = None,
                        timeout_s: float = 5.0) -> str:
    """The channel's wss URL at the first of `servers` (a pool's control planes) that leads; ValueError naming why
    each refused when none does (the caller backs off and retries)."""
    why = []
    for server in servers:
        try:
            return await locate_channel(server, transport, timeout_s)
        except (httpx.HTTPError, ValueError) as exc:
            why.append(f"{server}: {exc}")
    raise ValueError("no control plane leads: " + "; ".join(why))



def _safe_hash(public_key: str) -> str:
    try:
        return key_hash(public_key)
    except ValueError:
        return "(malformed key)"



def server_message(response: httpx.Response) -> str:
    """The human message of an error response: FastAPI's `detail`, a `message`/`error` field, or the body text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "message", "error"):
            if key in body:
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)[:500]
    return json.dumps(body)[:500]
