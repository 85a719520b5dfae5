"""The agent channel's own listener (RELIABILITY.md §4.2): TLS 1.3 only, a client certificate of the agent CA
required, the WebSocket `/api/v1/agent/channel` and nothing else. It runs in the control plane's event loop,
beside the API (uvicorn), and is started and stopped by the app's lifespan.

It is the `websockets` library's server rather than a second uvicorn because the handshake must be bound to a node:
uvicorn does not show the peer certificate to the application, while here `_admit` reads it from the TLS
connection itself and hands it, with the credential, to `AgentHub.admit`. A TLS handshake without a certificate of
the CA never reaches HTTP; a refused admission is answered 401 or 403 before the upgrade.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from gpupool.protocol.agent import MAX_FRAME_BYTES
from gpupool.server.agents import AgentHub, Refused
from gpupool.server.settings import Settings

log = logging.getLogger(__name__)
CHANNEL_PATH = "/api/v1/agent/channel"
#: how long the listener gives an opening handshake (TLS, HTTP upgrade, admission) before dropping it; a loaded
#: control plane finishes a handshake it has begun rather than making the agent start again
HANDSHAKE_S = 30
#: an admission slower than this is logged with the database pool's state
SLOW_ADMISSION_S = 2.0


class AgentListener:
    """`start()` listens on `settings.channel_port` (0: a free port; `port` then says which), `stop()` closes the
    listener and every channel."""

    def __init__(self, hub: AgentHub, settings: Settings) -> None:
        self.hub, self.settings = hub, settings
        self.port = 0
        self._server: Server | None = None
        self._admitted: weakref.WeakKeyDictionary[ServerConnection, tuple[str, str]] = weakref.WeakKeyDictionary()
        # admissions read the database on threads of their own: behind the shared default pool (busy with frames
        # and the monitor's passes), a reconnecting agent's handshake could outwait its timeout
        self._admitter = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpupool-admit")

    async def start(self) -> int:
        settings = self.settings
        context = await asyncio.to_thread(self.hub.ca.server_context, settings.host, settings.agent_tls_names)
        self._server = await serve(self._serve, settings.host, settings.channel_port, ssl=context,
                                   process_request=self._admit, max_size=MAX_FRAME_BYTES, ping_interval=20,
                                   ping_timeout=20, server_header=None, open_timeout=HANDSHAKE_S)
        self.port = self.hub.agent_port = self._server.sockets[0].getsockname()[1]
        log.info("agent channel on wss://%s:%d%s (CA %s)", settings.host, self.port, CHANNEL_PATH, self.hub.ca.hash)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._admitter.shutdown(wait=False)

    async def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        if urlsplit(request.path).path != CHANNEL_PATH:
            return connection.respond(404, "not found\n")
        tls = connection.transport.get_extra_info("ssl_object")
        certificate = tls.getpeercert(binary_form=True) if tls is not None else None
        token = request.headers.get("Authorization", "").partition(" ")[2].strip()
        began = time.monotonic()
        try:
            self._admitted[connection] = await asyncio.get_running_loop().run_in_executor(
                self._admitter, self.hub.admit, token, certificate)
        except Refused as refused:
            return connection.respond(refused.status, refused.reason + "\n")
        finally:
            if (took := time.monotonic() - began) > SLOW_ADMISSION_S:
                log.warning("channel admission took %.1f s (database pool: %s)", took, self.hub.db.engine.pool.status())
        return None

    async def _serve(self, connection: ServerConnection) -> None:
        node_id, serial = self._admitted.pop(connection)
        await self.hub.serve(node_id, serial, connection)
