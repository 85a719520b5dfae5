"""Speaking for a node by hand on the mTLS agent channel, for tests: a key and its CSR to register with, the client
context for the certificate that comes back, the channel's wss URL, and opening the channel."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from gpupool.agent.tls import ChannelTls, csr_for, new_key
from gpupool.devtools.harness import Server

CHANNEL_PATH = "/api/v1/agent/channel"


class HandTls:
    """One node's key (made here); `csr(name)` goes in the registration, `context(reply)` opens the channel."""

    def __init__(self) -> None:
        self.key = new_key()

    def csr(self, name: str = "node") -> str:
        return csr_for(self.key, name)

    def context(self, reply: Mapping[str, Any]) -> ssl.SSLContext:
        return ChannelTls(self.key, reply["certificate"], reply["ca_certificate"]).context()


def channel_url(server_url: str) -> str:
    """wss://127.0.0.1:<agent port>/api/v1/agent/channel of the control plane at `server_url` (from /readyz)."""
    port = httpx.get(f"{server_url}/readyz", timeout=30).json()["agent_port"]
    return f"wss://127.0.0.1:{port}{CHANNEL_PATH}"


def open_channel(server: Server, context: ssl.SSLContext, credential: str, **options: Any) -> ClientConnection:
    """The node's channel on `server`, opened as an agent does; `options` go to websockets' `connect` (open_timeout
    defaults to 30 s). A TLS 1.3 client learns that the server refused its certificate only when it reads the
    upgrade's answer, so a refused handshake raises `InvalidMessage` here, as a handshake left unanswered would."""
    options.setdefault("open_timeout", 30)
    return connect(channel_url(server.url), proxy=None, ssl=context,
                   additional_headers={"Authorization": f"Bearer {credential}"}, **options)
