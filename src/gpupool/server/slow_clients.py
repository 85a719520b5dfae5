"""`HeadDeadline`: uvicorn's HTTP protocol (httptools) with a deadline on each request's head.

uvicorn's own `timeout_keep_alive` closes a connection only when it has sent nothing at all since its previous
response; a new connection that sends nothing, or a request head sent a byte at a time (slowloris), holds its
socket for ever. With this protocol a connection must complete each request line and headers within
`timeout_keep_alive` seconds of opening or of its previous response, or it is closed. (The body has its own
deadline: gpupool.server.guard.BodyLimit.) Passed to uvicorn as `http=HeadDeadline` (gpupool.server.app.server_options).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadDeadline(HttpToolsProtocol):
    """See the module docstring. States per connection: awaiting a head (timer armed) -> head complete (timer off,
    the request runs) -> response complete with nothing pipelined (armed again)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        awaiting_head = not self.pipeline  # a pipelined request's head is already whole
        super().on_response_complete()
        if awaiting_head and not self.transport.is_closing():
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._overdue)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _overdue(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()
