"""The server end of every agent's outbound channel: registration, orders out, reports in, liveness.

Liveness (RELIABILITY.md §2.2): a node silent for `suspect_after_s` takes no new work; silent for
`lost_after_s` it is lost, its allocations are released (billing ends at its last heartbeat) and its
jobs requeued. The agent fences itself after `fence_s` < `lost_after_s`, so no attempt runs twice.
The control plane does not declare nodes lost while it is itself impaired: within `lost_after_s` of
its own start, or when more than `impaired_silent_share` of its agents went silent at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

from fastapi import HTTPException, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select

from gpupool.core.metrics import cluster_figures
from gpupool.protocol.agent import (
    MAX_FRAME_BYTES,
    Ack,
    AgentFrame,
    Hello,
    Launch,
    LogChunk,
    Registration,
    RegistrationReply,
    Stop,
    TaskStatus,
)
from gpupool.protocol.devices import GpuTelemetry
from gpupool.server.auth import hash_secret, new_token, resolve
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Allocation, ClusterSample, Gpu, JoinToken, Node, Token
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES, node_spec, nodes_with_gpus
from gpupool.server.scheduler.binder import Binder
from gpupool.server.scheduler.cache import ClusterCache, NodeEntry
from gpupool.server.services.lifecycle import Lifecycle
from gpupool.server.services.metering import meter
from gpupool.server.settings import Settings

log = logging.getLogger(__name__)
FRAMES = TypeAdapter(AgentFrame)


class AgentHub:
    def __init__(self, db: Database, cache: ClusterCache, settings: Settings) -> None:
        self.db, self.cache, self.settings = db, cache, settings
        self.queues: dict[str, asyncio.Queue[Launch | Stop | Ack]] = {}
        self.last_seen: dict[str, float] = {}
        self.seqs: dict[str, tuple[str, int]] = {}
        self.telemetry: dict[str, list[GpuTelemetry]] = {}
        self.idle_since: dict[str, float] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started = time.monotonic()
        self.lifecycle: Lifecycle | None = None
        self.binder: Binder | None = None
        self.logs = settings.data_dir / "logs"

    # orders out ------------------------------------------------------------------------------

    def send(self, node_id: str, frame: Launch | Stop | Ack) -> None:
        """Queue a frame for a node (thread-safe); frames for a disconnected node wait for its return."""
        queue = self.queues.setdefault(node_id, asyncio.Queue())
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(queue.put_nowait, frame)
        else:
            queue.put_nowait(frame)

    # registration ----------------------------------------------------------------------------

    def register(self, reg: Registration) -> RegistrationReply:
        """Burn a join token and record the node; the reply's credential is the node's API token."""
        prefix, _, secret = reg.join_token.partition(".")
        with self.db.session() as session:
            row = session.get(JoinToken, prefix, with_for_update=True)
            now = datetime.now(UTC)
            if row is None or not hmac.compare_digest(row.secret_hash, hash_secret(secret)):
                raise HTTPException(401, "unknown join token")
            expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
            if row.used_at is not None or expires <= now:
                raise HTTPException(401, "join token already used or expired")
            row.used_at = now
            node = self._upsert_node(session, reg)
            token_prefix, credential = new_token()
            session.add(Token(prefix=token_prefix, secret_hash=hash_secret(credential), name=f"node {reg.name}",
                              node_id=node.id))
            node_id = node.id
        self.reload_nodes()
        self.last_seen[node_id] = time.monotonic()
        return RegistrationReply(node_id=node_id, credential=credential, heartbeat_s=self.settings.heartbeat_s,
                                 fence_s=self.settings.fence_s, kill_grace_s=self.settings.kill_grace_s)

    def _upsert_node(self, session, reg: Registration) -> Node:  # noqa: ANN001 - a Session
        node = session.scalar(select(Node).where(Node.name == reg.name))
        if node is None:
            node = Node(name=reg.name, cpu_milli=reg.cpu_milli, memory_mib=reg.memory_mib)
            session.add(node)
            session.flush()
        busy = session.scalar(select(Allocation.id).where(Allocation.node_id == node.id,
                                                          Allocation.state.in_(OPEN_ALLOCATION_STATES)).limit(1))
        if busy is not None:
            raise HTTPException(409, f"node {reg.name} is registered and running work; start its agent with "
                                     "its saved credential instead of a new join token")
        node.cpu_milli, node.memory_mib, node.site, node.rack = reg.cpu_milli, reg.memory_mib, reg.site, reg.rack
        node.state, node.boot_id, node.last_seen = "ready", reg.boot_id, datetime.now(UTC)
        for gpu in session.scalars(select(Gpu).where(Gpu.node_id == node.id)):
            session.delete(gpu)
        session.flush()
        for info in reg.gpus:
            session.add(Gpu(node_id=node.id, index=info.index, uuid=info.uuid, model=info.model,
                            memory_mib=info.memory_mib, fake=info.fake))
        return node

    def reload_nodes(self) -> None:
        """Rebuild the cache's node set from the database (after a join or a GPU change)."""
        with self.db.session() as session:
            rows = nodes_with_gpus(session)
            entries = [NodeEntry(n.id, node_spec(n, g), [x.id for x in sorted(g, key=lambda x: x.index)],
                                 n.state == "ready" and not n.cordoned) for n, g in rows]
        self.cache.set_nodes(entries)

    # the channel -----------------------------------------------------------------------------

    async def serve(self, ws: WebSocket) -> None:
        node_id = await self._authenticate(ws)
        if node_id is None:
            return
        await ws.accept()
        queue = self.queues.setdefault(node_id, asyncio.Queue())
        sender = asyncio.create_task(self._pump(ws, queue))
        try:
            while True:
                raw = await ws.receive_text()
                if len(raw) > MAX_FRAME_BYTES:
                    await ws.close(code=1009)
                    return
                await self._handle(node_id, raw)
        except WebSocketDisconnect:
            pass
        finally:
            sender.cancel()

    async def _authenticate(self, ws: WebSocket) -> str | None:
        header = ws.headers.get("authorization", "")
        token = header.partition(" ")[2].strip()
        try:
            with self.db.session() as session:
                principal = resolve(session, token)
        except HTTPException:
            await ws.close(code=4401)
            return None
        if principal.node_id is None:
            await ws.close(code=4403)
            return None
        return principal.node_id

    async def _pump(self, ws: WebSocket, queue: asyncio.Queue[Launch | Stop | Ack]) -> None:
        while True:
            frame = await queue.get()
            try:
                await ws.send_text(frame.model_dump_json())
            except Exception:  # the socket closed: keep the frame for the next connection
                queue.put_nowait(frame)
                return

    async def _handle(self, node_id: str, raw: str) -> None:
        try:
            frame = FRAMES.validate_python(json.loads(raw))
        except (ValidationError, json.JSONDecodeError) as exc:
            log.warning("node %s sent a malformed frame: %s", node_id, str(exc)[:200])
            return
        self.last_seen[node_id] = time.monotonic()
        boot, seq = self.seqs.get(node_id, ("", -1))
        fresh = frame.boot_id != boot or frame.seq > seq
        if fresh:
            self.seqs[node_id] = (frame.boot_id, frame.seq)
            await asyncio.to_thread(self._apply, node_id, frame)
        self.send(node_id, Ack(seq=frame.seq))

    def _apply(self, node_id: str, frame: Hello | TaskStatus | LogChunk | object) -> None:
        if isinstance(frame, Hello):
            self._reconcile(node_id, frame)
        elif isinstance(frame, TaskStatus):
            assert self.lifecycle is not None
            self.lifecycle.on_status(node_id, frame)
        elif isinstance(frame, LogChunk):
            self._append_log(frame)
        else:
            self.telemetry[node_id] = list(getattr(frame, "telemetry", []))
            self._track_idle(node_id, set(getattr(frame, "idle_gpus", [])))
            self._mark_seen(node_id)

    def _track_idle(self, node_id: str, idle_uuids: set[str]) -> None:
        """Remember since when every GPU of each allocation on the node has been reported idle."""
        entry = next((e for e in self.cache.nodes.values() if e.node_id == node_id), None)
        if entry is None:
            return
        with self.cache.lock:
            held = [h for h in self.cache.held.values() if h.task.node == entry.spec.name and h.task.shares]
        for h in held:
            uuids = {entry.spec.gpus[s.index].uuid for s in h.task.shares}
            if uuids <= idle_uuids:
                if h.allocation_id not in self.idle_since:
                    self.idle_since[h.allocation_id] = time.monotonic()
                    assert self.lifecycle is not None
                    self.lifecycle.note_idle(h.allocation_id)
            else:
                self.idle_since.pop(h.allocation_id, None)

    def _mark_seen(self, node_id: str) -> None:
        with self.db.session() as session:
            node = session.get(Node, node_id)
            if node is not None and node.state != "ready":
                node.state = "ready"
                changed = True
            else:
                changed = False
            if node is not None:
                node.last_seen = datetime.now(UTC)
                cordoned = node.cordoned
        if changed:
            self.cache.set_schedulable(node.name, not cordoned)

    def _reconcile(self, node_id: str, hello: Hello) -> None:
        """After a (re)connect: resend launches the agent never got, stop work it should not run."""
        assert self.binder is not None
        reported = {(r.allocation_id, r.attempt) for r in hello.running}
        with self.db.session() as session:
            open_rows = list(session.scalars(select(Allocation).where(
                Allocation.node_id == node_id, Allocation.state.in_(OPEN_ALLOCATION_STATES))))
        known = {(a.id, a.attempt) for a in open_rows}
        for allocation in open_rows:
            if allocation.state == "starting" and (allocation.id, allocation.attempt) not in reported:
                self.send(node_id, self.binder.launch(allocation, allocation.leader_epoch, time.time()))
            if allocation.state == "stopping":
                self.send(node_id, Stop(allocation_id=allocation.id, attempt=allocation.attempt,
                                        grace_s=self.settings.kill_grace_s, reason=allocation.release_reason))
        for allocation_id, attempt in reported - known:
            self.send(node_id, Stop(allocation_id=allocation_id, attempt=attempt, grace_s=0, reason="unknown"))
        self._mark_seen(node_id)

    def _append_log(self, chunk: LogChunk) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.log_path(chunk.allocation_id, chunk.attempt)
        with open(path, "a+b") as handle:
            handle.seek(0, 2)
            if handle.tell() >= chunk.offset:  # idempotent: a re-sent chunk overwrites the same bytes
                handle.truncate(chunk.offset)
                handle.write(chunk.data.encode())

    def log_path(self, allocation_id: str, attempt: int) -> Path:
        return self.logs / f"{allocation_id}-{attempt}.log"

    # liveness --------------------------------------------------------------------------------

    async def monitor(self) -> None:
        """Every second: suspect silent nodes, declare lost ones, end grants past their limit; and every
        `metering_interval_s` write the usage ledger and a cluster sample."""
        last_metered = 0.0
        while True:
            await asyncio.sleep(min(1.0, self.settings.heartbeat_s))
            try:
                await asyncio.to_thread(self.check_liveness, time.monotonic())
                assert self.lifecycle is not None
                await asyncio.to_thread(self.lifecycle.enforce_limits, time.time())
                await asyncio.to_thread(self._reclaim_idle, time.monotonic())
                if time.monotonic() - last_metered >= self.settings.metering_interval_s:
                    await asyncio.to_thread(self.meter_and_sample)
                    last_metered = time.monotonic()
            except Exception:  # a bug: keep monitoring, and say so
                log.exception("monitor pass failed")

    def _reclaim_idle(self, now: float) -> None:
        """Reclaim allocations idle for longer than their queue's `idle_reclaim_s` (queues without one: notify only)."""
        assert self.lifecycle is not None
        for allocation_id, since in list(self.idle_since.items()):
            if allocation_id not in self.cache.held:
                del self.idle_since[allocation_id]
            elif self.lifecycle.reclaim_if_idle(allocation_id, now - since):
                del self.idle_since[allocation_id]

    def meter_and_sample(self) -> None:
        now = datetime.now(UTC)
        with self.db.session() as session:
            meter(session, now, self.settings.metering_period_s)
            with self.cache.lock:
                figures = cluster_figures(self.cache.table)
            used = sum(t.utilization_pct for tele in self.telemetry.values() for t in tele) / 100
            session.merge(ClusterSample(at=now.replace(microsecond=0), gpus=figures.capacity_milli / 1000,
                                        allocated=figures.allocated_milli / 1000, used=used,
                                        fragmented_nodes=figures.fragmented_nodes, gpu_nodes=figures.nodes))

    def check_liveness(self, now: float) -> None:
        silent = {n: now - t for n, t in self.last_seen.items()}
        impaired = now - self.started < self.settings.lost_after_s or (
            len(silent) >= 3 and sum(s > self.settings.suspect_after_s for s in silent.values())
            > self.settings.impaired_silent_share * len(silent))
        for node_id, quiet in silent.items():
            if quiet > self.settings.lost_after_s and not impaired:
                self._set_state(node_id, "lost")
                assert self.lifecycle is not None
                self.lifecycle.node_lost(node_id, time.time() - quiet)
                del self.last_seen[node_id]
            elif quiet > self.settings.suspect_after_s:
                self._set_state(node_id, "suspect")

    def _set_state(self, node_id: str, state: str) -> None:
        with self.db.session() as session:
            node = session.get(Node, node_id)
            if node is None or node.state == state:
                return
            node.state, name = state, node.name
        self.cache.set_schedulable(name, False)
