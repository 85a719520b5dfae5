"""The hub's state, shared by its rooms (gpupool.server.agents): the orders queued per node and the one door they
leave by (`send`, which signs launch and stop orders: RELIABILITY.md §4.2, S7), the node set as the scheduler's cache
sees it, the open channels, and leadership.

Leadership: only the scheduler lease's holder speaks to agents. A control plane that does not hold the lease admits
no channel and no registration (503: agents try their next control plane), and a leader that loses the lease closes
every channel and acknowledges nothing more, so its agents hear a deposed leader as silence and move to the new one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fastapi import HTTPException
from pydantic import TypeAdapter

from gpupool.protocol.agent import (
    Ack,
    AgentFrame,
    Certificate,
    Launch,
    Rejected,
    Stop,
)
from gpupool.protocol.devices import GpuTelemetry
from gpupool.server import order_keys
from gpupool.server.agent_ca import AgentCA
from gpupool.server.db.engine import Database
from gpupool.server.db.repositories import node_spec, nodes_with_gpus
from gpupool.server.joblogs import JobLogs
from gpupool.server.scheduler.binder import Binder
from gpupool.server.scheduler.cache import ClusterCache, NodeEntry
from gpupool.server.scheduler.lease import SchedulerLease
from gpupool.server.scheduler.liveness import LivenessGuard
from gpupool.server.services.draining import Draining
from gpupool.server.services.lifecycle import Lifecycle
from gpupool.server.settings import Settings

log = logging.getLogger("gpupool.server.agents")
FRAMES = TypeAdapter(AgentFrame)
RETIRED_BOOTS = 16
#: at most one certificate renewal per node per this many seconds (a tenth of the lifetime when that is shorter: the
#: agent asks again that often when a `Certificate` went missing, gpupool.agent.tls.Renewal)
RENEW_INTERVAL_S = 60.0
#: the close code of a channel that a newer channel of the same node replaced
REPLACED = 4409
NAME_TAKEN = ("name: a node of this name is registered; it reconnects with its own certificate, or an operator "
              "resets it (gpupool node reset NAME) so that a new join token may take the name")
ServerFrameOut = Launch | Stop | Ack | Rejected | Certificate


class AgentSocket(Protocol):
    """What the hub needs of an accepted channel connection (websockets' ServerConnection has it)."""

    async def recv(self) -> str | bytes: ...

    async def send(self, message: str) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class Refused(Exception):
    """A channel connection that may not be admitted: `status` is the HTTP answer to its handshake."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class HubState:
    """What every room of the hub reads and writes: per-node tables keyed by node id, the open channels, the
    signer and CA, and the services it drives (set by create_app)."""

    def __init__(self, db: Database, cache: ClusterCache, settings: Settings) -> None:
        self.db, self.cache, self.settings = db, cache, settings
        self.queues: dict[str, asyncio.Queue[ServerFrameOut]] = {}
        self.last_seen: dict[str, float] = {}  # node -> monotonic time of its latest fresh frame
        self.last_sent: dict[str, float] = {}  # node -> monotonic time a frame last left for it
        self.seqs: dict[str, tuple[str, int]] = {}
        self._reload_lock = threading.Lock()
        self.retired_boots: dict[str, list[str]] = {}  # per node, the last RETIRED_BOOTS boots a Hello replaced
        self.signer = order_keys.load_or_create(settings.order_key_path)
        self.ca = AgentCA.load_or_create(settings.data_dir)
        self.agent_port = 0  # the channel listener's port, once it listens
        self.sessions: dict[str, dict[AgentSocket, asyncio.Task[None]]] = {}  # node -> its channel, and its pump
        self.renewed_at: dict[str, float] = {}  # node -> monotonic time of its last renewal
        self.reset_nodes: set[str] = set()  # reset and not joined again: frames still in flight are dropped
        self._closing: set[asyncio.Task[None]] = set()  # closes of replaced channels, kept until done
        self.telemetry: dict[str, list[GpuTelemetry]] = {}
        self.idle_since: dict[str, float] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.guard = LivenessGuard(settings, time.monotonic())
        self.lease: SchedulerLease | None = None  # set by create_app: liveness actions are the leader's
        self.on_lost: Callable[[int], None] | None = None  # called with the jobs requeued, per node declared lost
        self.held: dict[str, int] = {}  # node -> highest seq that may be acked while reports wait (DB outage)
        self.resync: set[str] = set()  # nodes whose channel to close: the database is back, reports wait
        self._warned_at = float("-inf")
        self.lifecycle: Lifecycle | None = None
        self.binder: Binder | None = None
        self.draining: Draining | None = None  # set by create_app: drains' deadlines and removals
        self.job_logs = JobLogs(settings.data_dir / "logs", settings.max_log_bytes_per_job)

    def send(self, node_id: str, frame: ServerFrameOut) -> None:
        """Queue a frame for a node (thread-safe); frames for a disconnected node wait for its return. Launch and
        stop orders are addressed to `node_id` and signed here, the one door every order leaves by, so the
        signature covers the order as sent (env and all)."""
        if isinstance(frame, Launch | Stop):
            frame = self.signer.seal(frame, node_id)
        queue = self.queues.setdefault(node_id, asyncio.Queue())
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(queue.put_nowait, frame)
        else:
            queue.put_nowait(frame)

    def leads(self) -> bool:
        """Whether this process holds the scheduler lease (always, without one: tests of the hub alone)."""
        return self.lease is None or self.lease.is_leader()

    def require_leader(self) -> None:
        """HTTP 503 unless this process leads: agents then try their next control plane."""
        if not self.leads():
            raise HTTPException(503, "this control plane is a standby: it does not hold the scheduler lease",
                                headers={"Retry-After": "1"})

    def reload_nodes(self) -> None:
        """Rebuild the cache's node set from the database (after a join, a GPU change, a node's new address). One
        reload at a time: a reload that read the rows before another's commit must not set its older rows last."""
        with self._reload_lock:
            with self.db.session() as session:
                rows = nodes_with_gpus(session)
                entries = [NodeEntry(n.id, node_spec(n, g), [x.id for x in sorted(g, key=lambda x: x.index)],
                                     n.state == "ready" and not n.cordoned, n.address or n.name) for n, g in rows]
            self.cache.set_nodes(entries)

    def close_sessions(self, node_id: str, reason: str) -> None:
        """Close every open channel of `node_id` (thread-safe): after a revocation, the session kill."""
        live = list(self.sessions.get(node_id, {}))
        if not live or self.loop is None:
            return
        log.warning("closing %d channel(s) of node %s: %s", len(live), node_id, reason)
        for ws in live:
            asyncio.run_coroutine_threadsafe(ws.close(4403, reason[:120]), self.loop)

    def _close_all(self, reason: str) -> None:
        """Close every open channel (from the event loop): a deposed leader speaks to no agent."""
        for node_id, live in list(self.sessions.items()):
            if live:
                log.warning("closing %d channel(s) of node %s: %s", len(live), node_id, reason)
            for ws in list(live):
                asyncio.ensure_future(ws.close(1013, reason[:120]))

    def _warn_unreachable(self, exc: BaseException) -> None:
        if time.monotonic() - self._warned_at > 10:
            self._warned_at = time.monotonic()
            log.warning("database unreachable; agents' reports wait: %s", str(exc).splitlines()[0][:200])
