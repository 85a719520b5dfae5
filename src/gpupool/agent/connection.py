"""The channel's transport: a WebSocket to the control plane's agent port (mTLS, the CA pinned at registration),
behind the `Connection` and `Connector` seams that tests replace.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from gpupool.protocol.agent import (
    ADDRESS,
    MAX_FRAME_BYTES,
)


class CredentialRejected(RuntimeError):
    """The control plane refused the node credential (HTTP 401/403 on the channel handshake)."""



def local_host(conn: object) -> str | None:
    """The local IP address of a connection (websockets' `local_address`), None when it has none: the address of
    the interface that reaches the control plane, which other nodes of the pool most likely reach too."""
    address = getattr(conn, "local_address", None)
    host = address[0] if isinstance(address, tuple) and address else None
    return host if isinstance(host, str) and ADDRESS.fullmatch(host) else None



class Connection(Protocol):
    """What the channel needs of a WebSocket connection (websockets' ClientConnection has it)."""

    async def send(self, message: str) -> None: ...

    async def recv(self) -> str | bytes: ...


Connector = Callable[[str, dict[str, str]], AbstractAsyncContextManager[Connection]]



def websocket_connector(*, open_timeout_s: float = 10.0, ping_s: float = 10.0,
                        tls: Callable[[], ssl.SSLContext] | None = None) -> Connector:
    """The real connector: `websockets` (imported on first use), frames capped at MAX_FRAME_BYTES, keepalive pings
    every `ping_s` and a close handshake bounded by `ping_s`, so a dead TCP connection is noticed and left within
    about 3 * ping_s; HTTP 401/403 on the handshake raise CredentialRejected. `tls` gives the client context for
    each connection (the node certificate may have been renewed since the last)."""

    @asynccontextmanager
    async def connect(url: str, headers: dict[str, str]) -> AsyncIterator[Connection]:
        from websockets.asyncio.client import connect as ws_connect
        from websockets.exceptions import InvalidStatus

        try:
            async with ws_connect(
                url,
                ssl=tls() if tls is not None else None,
                additional_headers=headers,
                open_timeout=open_timeout_s,
                ping_interval=ping_s,
                ping_timeout=ping_s,
                close_timeout=ping_s,
                max_size=MAX_FRAME_BYTES,
            ) as ws:
                yield ws
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                raise CredentialRejected(f"the control plane refused this node's credential ({exc})") from exc
            raise

    return connect
