"""The server end of every agent's outbound channel: registration, orders out, reports in, liveness.

Liveness (RELIABILITY.md §2.2): silence is not death. A node silent for `suspect_after_s` is *unreachable*: it takes
no new work, and its agent keeps running what it runs for `max_disconnect_s` (or a job's shorter one) without word
from any control plane, then fences it. Its work is requeued only once it can no longer run: `requeue_margin_s` after
the work's own max_disconnect (counted from the later of the last frame heard from the node and the last frame sent to
it, so that an order that reached it is counted), or at once when it is known dead (a new boot of its agent, or an
operator's `node down`). Silent for `lost_after_s` the node is lost: every allocation is released (billing ends at its
last heartbeat) and its jobs requeued. Only the scheduler lease's holder declares nodes lost (fenced by its epoch, like
every scheduler write), never while the control plane is itself impaired (at its start or takeover every node is
given a fresh grace), and at a bounded rate (gpupool.server.scheduler.liveness).

Leadership: only the scheduler lease's holder speaks to agents. A control plane that does not hold the lease admits
no channel and no registration (503: agents try their next control plane), and a leader that loses the lease closes
every channel and acknowledges nothing more, so its agents hear a deposed leader as silence and move to the new one.

Database outage (RELIABILITY.md T7): a report that cannot be applied because the database is unreachable is not
acked, and neither is anything after it (acks are cumulative); every frame still gets an Ack of what was applied,
so the agent keeps hearing from the control plane and does not fence. Once a report applies again, the channel
is closed (1013) and the agent reconnects and re-sends what was not acked, in order.

Channel security (RELIABILITY.md §4.2, S7): every launch and stop order leaves through `send`, which addresses it
to its node and signs it (gpupool.server.order_keys) after it is complete; agents pinned the public key at
registration. A node's reports are applied at most once per (boot_id, seq), only a Hello starts a new boot and a
boot once replaced never comes back (a replayed frame changes nothing, not even the node's liveness), and a report
about an allocation that is not the node's own is answered `Rejected` (403) and logged, with no state change; a task
status about an attempt already closed is answered `Rejected` (409), and a stop order if it says "started". A Hello
of a boot other than the node's recorded one closes what that boot does not run (Lifecycle.node_rebooted).

Transport and identity (mTLS): the channel is served by gpupool.server.agent_listener on its own TLS 1.3 port,
which completes a handshake only with a client certificate of the agent CA (gpupool.server.agent_ca). `admit` then
binds the connection to a node: the node credential must resolve to a node, AND the certificate presented in that
handshake must be one issued to that same node (its SAN names the node, and its serial is listed for the node in
`agent_certificates`, not revoked). `Renew` over a live channel gets a new certificate for the channel's own node, at
most one per RENEW_INTERVAL_S (beyond: `Rejected`, 429). A node holds one channel at a time: a newly admitted
channel closes the node's older ones (4409).

A node's identity is its certificate (issue 41): a join token registers a new node name only; an existing node
reconnects with its certificate and renews it over the channel. `reset_node` (an operator's `gpupool node reset`)
revokes the node's certificates and credential, closes its channels, requeues its open work (Lifecycle.node_lost) and
retires its GPU rows (history keeps naming them); the name is then free for a fresh join token, which takes the same
node row and revives its GPU rows by index. GPU UUIDs are unique across nodes and indices within a registration:
a registration that breaks either is refused naming the field (`gpus[2].uuid`), like one for a taken `name` (409).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from cryptography import x509
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from websockets.exceptions import ConnectionClosed

from gpupool.core.metrics import cluster_figures
from gpupool.protocol.agent import (
    ADDRESS,
    MAX_FRAME_BYTES,
    Ack,
    AgentFrame,
    Certificate,
    Heartbeat,
    Hello,
    Launch,
    LogChunk,
    Registration,
    RegistrationReply,
    Rejected,
    Renew,
    Stop,
    TaskStatus,
)
from gpupool.protocol.devices import GpuInfo, GpuTelemetry
from gpupool.protocol.tls import node_of
from gpupool.server import order_keys
from gpupool.server.agent_ca import AgentCA, CertificateRequestError
from gpupool.server.auth import hash_secret, new_token, resolve
from gpupool.server.db.engine import Database, unreachable
from gpupool.server.db.models import AgentCertificate, Allocation, ClusterSample, Gpu, Job, JoinToken, Node, Token
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES, node_spec, nodes_with_gpus
from gpupool.server.joblogs import JobLogs
from gpupool.server.scheduler import gang
from gpupool.server.scheduler.binder import Binder
from gpupool.server.scheduler.cache import ClusterCache, NodeEntry
from gpupool.server.scheduler.lease import Fenced, SchedulerLease
from gpupool.server.scheduler.liveness import LivenessGuard
from gpupool.server.services.draining import REMOVED, Draining
from gpupool.server.services.draining import clear as clear_drain
from gpupool.server.services.lifecycle import Lifecycle
from gpupool.server.services.metering import meter
from gpupool.server.settings import Settings

log = logging.getLogger(__name__)
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


class AgentHub:
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

    # orders out ------------------------------------------------------------------------------

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

    # registration ----------------------------------------------------------------------------

    def register(self, reg: Registration, peer: str | None = None) -> RegistrationReply:
        """Burn a join token and record a new node (or take the name of a reset one); the reply's credential is the
        node's API token, and with a CSR the reply carries the node's channel certificate. Refused, burning nothing:
        401 for a bad token, 409 naming `name` for a name taken (not reset), 409 naming `gpus[i].uuid` for a GPU of
        another node, 422 naming `gpus[i].index` / `gpus[i].uuid` for one repeated within the registration, 400 for
        a malformed CSR. `peer` is the address the registration came from: where other nodes reach the node until its
        agent says otherwise (`Hello.address`)."""
        _check_unique_gpus(reg.gpus)
        self.require_leader()
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
            node = self._join(session, reg)
            node.address = peer if peer and ADDRESS.fullmatch(peer) else None
            token_prefix, credential = new_token()
            session.add(Token(prefix=token_prefix, secret_hash=hash_secret(credential), name=f"node {reg.name}",
                              node_id=node.id))
            node_id = node.id
            certificate = self._issue(session, reg.csr, node_id) if reg.csr else ""
        self.reset_nodes.discard(node_id)
        self.reload_nodes()
        self.last_seen[node_id] = time.monotonic()
        return RegistrationReply(node_id=node_id, credential=credential, heartbeat_s=self.settings.heartbeat_s,
                                 fence_s=self.settings.max_disconnect_s, kill_grace_s=self.settings.kill_grace_s,
                                 order_key=self.signer.public_key, certificate=certificate,
                                 ca_certificate=self.ca.pem, agent_port=self.agent_port)

    def _issue(self, session: Session, csr: str, node_id: str) -> str:
        """A certificate for `node_id` on the key of `csr`, recorded; 400 for a bad CSR."""
        try:
            issued = self.ca.issue(csr, node_id, self.settings.agent_cert_lifetime_s)
        except CertificateRequestError as exc:
            raise HTTPException(400, str(exc)) from exc
        session.add(AgentCertificate(serial=issued.serial, node_id=node_id, not_after=issued.not_after))
        return issued.pem

    def _join(self, session: Session, reg: Registration) -> Node:
        """The node `reg` joins as, recorded with its GPUs: a new one, or the reset one of that name; 409 naming
        the field when the name or a GPU UUID is taken (also by a registration committed at the same moment)."""
        node = _claimable(session, reg)
        try:
            with session.begin_nested():
                return _record_node(session, reg, node)
        except IntegrityError:
            _claimable(session, reg)  # says what a registration committed meanwhile took, if it can see it
            raise HTTPException(409, "name, gpus: taken by another registration at the same moment") from None

    def reset_node(self, node_id: str, final: str = "reset") -> int:
        """Take `node_id`'s identity back (an operator's `node reset`, or `node remove` with `final` "removed");
        returns the jobs requeued. In order: no new work is placed there; its certificates and credential are
        revoked and its channels closed (their frames still in flight are dropped); its open work is released and
        requeued as for a lost node; then the node is marked `final` (its name is free for a join token) and its GPU
        rows retired."""
        entry = next((e for e in self.cache.nodes.values() if e.node_id == node_id), None)
        if entry is not None:
            self.cache.set_schedulable(entry.spec.name, False)
        self.reset_nodes.add(node_id)
        with self.db.session() as session:
            _revoke_identity(session, node_id, datetime.now(UTC))
        self.close_sessions(node_id, "the node was reset: its certificates are revoked")
        self._forget(node_id)
        assert self.lifecycle is not None
        requeued = self.lifecycle.node_lost(node_id, None)
        with self.db.session() as session:
            _retire(session, node_id, datetime.now(UTC), final)
        self.reload_nodes()
        log.warning("node %s %s: identity revoked, %d job(s) requeued, its name is free", node_id, final, requeued)
        return requeued

    def _forget(self, node_id: str) -> None:
        """Drop what this process keeps of a node's agent: liveness, boots, telemetry and the orders queued for it."""
        for table in (self.last_seen, self.last_sent, self.seqs, self.retired_boots, self.held, self.telemetry,
                      self.renewed_at):
            table.pop(node_id, None)
        self.resync.discard(node_id)
        queue = self.queues.get(node_id)
        if queue is None:
            return

        def drain() -> None:
            while not queue.empty():
                queue.get_nowait()

        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(drain)
        else:
            drain()

    def _close_all(self, reason: str) -> None:
        """Close every open channel (from the event loop): a deposed leader speaks to no agent."""
        for node_id, live in list(self.sessions.items()):
            if live:
                log.warning("closing %d channel(s) of node %s: %s", len(live), node_id, reason)
            for ws in list(live):
                asyncio.ensure_future(ws.close(1013, reason[:120]))

    def close_sessions(self, node_id: str, reason: str) -> None:
        """Close every open channel of `node_id` (thread-safe): after a revocation, the session kill."""
        live = list(self.sessions.get(node_id, {}))
        if not live or self.loop is None:
            return
        log.warning("closing %d channel(s) of node %s: %s", len(live), node_id, reason)
        for ws in live:
            asyncio.run_coroutine_threadsafe(ws.close(4403, reason[:120]), self.loop)

    def reload_nodes(self) -> None:
        """Rebuild the cache's node set from the database (after a join, a GPU change, a node's new address). One
        reload at a time: a reload that read the rows before another's commit must not set its older rows last."""
        with self._reload_lock:
            with self.db.session() as session:
                rows = nodes_with_gpus(session)
                entries = [NodeEntry(n.id, node_spec(n, g), [x.id for x in sorted(g, key=lambda x: x.index)],
                                     n.state == "ready" and not n.cordoned, n.address or n.name) for n, g in rows]
            self.cache.set_nodes(entries)

    # the channel -----------------------------------------------------------------------------

    def leads(self) -> bool:
        """Whether this process holds the scheduler lease (always, without one: tests of the hub alone)."""
        return self.lease is None or self.lease.is_leader()

    def require_leader(self) -> None:
        """HTTP 503 unless this process leads: agents then try their next control plane."""
        if not self.leads():
            raise HTTPException(503, "this control plane is a standby: it does not hold the scheduler lease",
                                headers={"Retry-After": "1"})

    def admit(self, token: str, certificate_der: bytes | None) -> tuple[str, str]:
        """(node_id, serial) of a channel handshake with the node credential `token` and the client certificate
        `certificate_der` (already verified against the CA by TLS). Raises Refused: 503 when this process does not
        lead, 401 for an unknown credential, 403 for a credential that is not a node's, or a certificate that is not
        a live one of that node's."""
        if not self.leads():
            raise Refused(503, "this control plane is a standby: it does not hold the scheduler lease")
        try:
            with self.db.session() as session:
                principal = resolve(session, token)
        except HTTPException as exc:
            raise Refused(401, str(exc.detail)) from None
        if principal.node_id is None:
            raise Refused(403, "not a node credential")
        if certificate_der is None:
            raise Refused(403, "no client certificate")
        cert = x509.load_der_x509_certificate(certificate_der)
        serial = format(cert.serial_number, "x")
        with self.db.session() as session:
            row = session.get(AgentCertificate, serial)
        node_id = principal.node_id
        if node_of(cert) != node_id or row is None or row.node_id != node_id:
            log.warning("channel refused (403): node %s's credential with certificate %s issued to %s", node_id,
                        serial, node_of(cert) or "no node")
            raise Refused(403, "the certificate was not issued to this credential's node")
        if row.revoked_at is not None:
            log.warning("channel refused (403): node %s presented revoked certificate %s", node_id, serial)
            raise Refused(403, "the certificate is revoked")
        return node_id, serial

    def renew(self, node_id: str, frame: Renew) -> Rejected | None:
        """Issue a new certificate for the channel's node (sent as `Certificate`); Rejected: 429 within the renewal
        interval of the node's last renewal (RENEW_INTERVAL_S; a request refused here does not count), 400 for a bad
        CSR."""
        interval = min(RENEW_INTERVAL_S, self.settings.agent_cert_lifetime_s / 10)
        now = time.monotonic()
        wait = self.renewed_at.get(node_id, float("-inf")) + interval - now
        if wait > 0:
            log.warning("node %s asked for a certificate again within %.0f s: rejected (429)", node_id, interval)
            return Rejected(seq=frame.seq, code=429, reason=f"one certificate renewal per {interval:g} s; ask again "
                                                            f"in {wait:.1f} s")
        self.renewed_at[node_id] = now
        try:
            with self.db.session() as session:
                pem = self._issue(session, frame.csr, node_id)
        except HTTPException as exc:
            return Rejected(seq=frame.seq, code=400, reason=str(exc.detail)[:2000])
        self.send(node_id, Certificate(certificate=pem))
        return None

    async def serve(self, node_id: str, serial: str, ws: AgentSocket) -> None:
        """Serve one admitted channel of `node_id` until it closes (see the module docstring)."""
        queue = self.queues.setdefault(node_id, asyncio.Queue())
        self.held.pop(node_id, None)
        self.resync.discard(node_id)
        live = self.sessions.setdefault(node_id, {})
        self._replace(node_id, serial, live)
        sender = live[ws] = asyncio.create_task(self._pump(node_id, ws, queue))
        try:
            while True:
                raw = await ws.recv()
                if not isinstance(raw, str):  # a binary frame: not part of the protocol
                    await ws.close(code=1003)
                    return
                if len(raw) > MAX_FRAME_BYTES:
                    await ws.close(code=1009)
                    return
                if not self.leads():  # deposed: acknowledge nothing, so the agent hears silence and moves on
                    await ws.close(code=1013, reason="not the leader")
                    return
                await self._handle(node_id, raw)
                if node_id in self.resync:  # the database is back: re-sent reports come on the next connection
                    await ws.close(code=1013)
                    return
        except ConnectionClosed:
            pass
        finally:
            sender.cancel()
            live.pop(ws, None)

    def _replace(self, node_id: str, serial: str, live: dict[AgentSocket, asyncio.Task[None]]) -> None:
        """Close the node's older channels (one with certificate `serial` was admitted): their pumps stop at once, so
        no order leaves by a connection that may be dead (an agent reconnects after a network cut before the old
        one times out), and one node never holds more than one channel's worth of the listener."""
        for old, pump in list(live.items()):
            pump.cancel()
            del live[old]
            log.info("node %s: a channel with certificate %s replaces an open one (closed %d)", node_id, serial,
                     REPLACED)
            task = asyncio.create_task(old.close(REPLACED, "replaced by a newer channel of this node"))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _pump(self, node_id: str, ws: AgentSocket, queue: asyncio.Queue[ServerFrameOut]) -> None:
        while True:
            frame = await queue.get()
            try:
                await ws.send(frame.model_dump_json())
            except Exception:  # the socket closed: keep the frame for the next connection
                queue.put_nowait(frame)
                return
            self.last_sent[node_id] = time.monotonic()  # it may have reached the agent: its silence counts from here

    async def _handle(self, node_id: str, raw: str) -> None:
        if node_id in self.reset_nodes:
            return  # a channel the reset is closing: nothing it says counts any more
        try:
            frame = FRAMES.validate_json(raw)
        except (ValidationError, ValueError, RecursionError) as exc:
            log.warning("node %s sent a malformed frame: %s", node_id, str(exc)[:200])
            return
        boot, seq = self.seqs.get(node_id, ("", -1))
        if frame.boot_id != boot and not self._new_boot(node_id, boot, frame):
            return  # not acked: a live agent sends Hello first on every connection and then re-sends
        if frame.boot_id != boot or frame.seq > seq:
            self.last_seen[node_id] = time.monotonic()
            self.seqs[node_id] = (frame.boot_id, frame.seq)
            rejected = await asyncio.to_thread(self._apply_held, node_id, frame)
            if rejected is not None:
                self.send(node_id, rejected)
                return
        self.send(node_id, Ack(seq=min(frame.seq, self.held.get(node_id, frame.seq))))

    def _new_boot(self, node_id: str, boot: str, frame: Hello | Heartbeat | TaskStatus | LogChunk | Renew) -> bool:
        """May `frame` start a new boot of the node's agent? Only a Hello of a boot never replaced may; the boot it
        replaces is retired (a replayed frame of a former boot is then dropped, whatever its seq)."""
        retired = self.retired_boots.setdefault(node_id, [])
        if not isinstance(frame, Hello) or frame.boot_id in retired:
            log.warning("node %s: dropping a %s frame of boot %s (current boot %s)", node_id, frame.type,
                        frame.boot_id, boot or "none yet")
            return False
        if boot:
            retired.append(boot)
            del retired[:-RETIRED_BOOTS]
        return True

    def _apply_held(self, node_id: str, frame: Hello | Heartbeat | TaskStatus | LogChunk | Renew) -> Rejected | None:
        """`_apply`, surviving a database outage (see the module docstring): a report that fails for an unreachable
        database caps the node's acks below it; later reports wait unapplied (re-sent after the resync); a frame
        that applies while reports wait schedules the resync."""
        waiting = node_id in self.held
        if waiting and isinstance(frame, TaskStatus | LogChunk):
            return None
        try:
            rejected = self._apply(node_id, frame)
        except Exception as exc:
            if not unreachable(exc):
                raise
            if not isinstance(frame, Heartbeat | Renew):  # a Hello's own seq is never kept by the agent: ackable
                cap = frame.seq if isinstance(frame, Hello) else frame.seq - 1
                self.held[node_id] = min(cap, self.held.get(node_id, cap))
            self._warn_unreachable(exc)
            return None
        if waiting:
            self.resync.add(node_id)
        return rejected

    def _warn_unreachable(self, exc: BaseException) -> None:
        if time.monotonic() - self._warned_at > 10:
            self._warned_at = time.monotonic()
            log.warning("database unreachable; agents' reports wait: %s", str(exc).splitlines()[0][:200])

    def _foreign(self, node_id: str, frame: TaskStatus | LogChunk) -> Rejected | None:
        """A 403 rejection when `frame` reports on an allocation that is not open or past on `node_id` (another
        node's, or none at all: allocation ids also name log files)."""
        with self.db.session() as session:
            owner = session.scalar(select(Allocation.node_id).where(Allocation.id == frame.allocation_id))
        if owner == node_id:
            return None
        log.warning("node %s reported %s for allocation %s %s: rejected (403)", node_id, frame.type,
                    frame.allocation_id[:64], "of another node" if owner else "that does not exist")
        return Rejected(seq=frame.seq, code=403, reason=f"allocation {frame.allocation_id[:64]} is not this node's")

    def _apply(self, node_id: str, frame: Hello | Heartbeat | TaskStatus | LogChunk | Renew) -> Rejected | None:
        """Apply one fresh frame; a Rejected to answer instead of an Ack when the node may not report it."""
        if isinstance(frame, Renew):
            return self.renew(node_id, frame)
        if isinstance(frame, TaskStatus | LogChunk):
            rejected = self._foreign(node_id, frame)
            if rejected is not None:
                return rejected
        if isinstance(frame, Hello):
            self._vouch(node_id, frame.untrusted_images)
            self._note_jobs_as(node_id, frame.jobs_as)
            self._note_address(node_id, frame.address)
            self._reconcile(node_id, frame)
        elif isinstance(frame, TaskStatus):
            assert self.lifecycle is not None
            stale = self.lifecycle.on_status(node_id, frame)
            if stale is not None:  # changes nothing (I9); the agent drops it like an acked frame
                log.info("node %s reported %s for a closed attempt: rejected (409): %s", node_id, frame.state, stale)
                return Rejected(seq=frame.seq, code=409, reason=stale)
            if frame.state == "started" and frame.rendezvous_port is not None:
                self._rendezvous_ready(frame)
        elif isinstance(frame, LogChunk):
            self._append_log(frame)
        else:
            self.telemetry[node_id] = list(getattr(frame, "telemetry", []))
            self._track_idle(node_id, set(getattr(frame, "idle_gpus", [])))
            self._mark_seen(node_id)
        return None

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
            if node is not None and node.state not in ("ready", "reset", REMOVED):
                node.state = "ready"
                changed = True
            else:
                changed = False
            if node is not None:
                node.last_seen = datetime.now(UTC)
                cordoned = node.cordoned
        if changed:
            self.cache.set_schedulable(node.name, not cordoned)

    def _vouch(self, node_id: str, untrusted_images: bool | None) -> None:
        """Keep the node's container-toolkit verdict as its agent says it on connecting (None: unsaid, kept); the
        scheduler sees a change at once. Running jobs stay where they are."""
        self._note_placing(node_id, "untrusted_images", untrusted_images)

    def _note_jobs_as(self, node_id: str, jobs_as: str | None) -> None:
        """Keep who the node's jobs run as, as its agent says on connecting (None: unsaid, kept); shown only."""
        if jobs_as is not None:
            with self.db.session() as session:
                node = session.get(Node, node_id)
                if node is not None:
                    node.jobs_as = jobs_as

    def _note_address(self, node_id: str, address: str | None) -> None:
        """Keep where other nodes reach the node, as its agent says on connecting (None: unsaid, kept); gangs placed
        from then on name it in MASTER_ADDR and their hostfile."""
        self._note_placing(node_id, "address", address)

    def _note_placing(self, node_id: str, column: str, value: bool | str | None) -> None:
        """Keep a node's `column` (one the scheduler's cache reads) as its agent says it (None: unsaid, kept); the
        cache is reloaded when it changed."""
        if value is None:
            return
        with self.db.session() as session:
            node = session.get(Node, node_id)
            changed = node is not None and getattr(node, column) != value
            if changed:
                setattr(node, column, value)
        if changed:
            self.reload_nodes()

    def _rendezvous_ready(self, status: TaskStatus) -> None:
        """Task 0 of a gang started with the MASTER_PORT its agent chose: record it, and launch the gang's other tasks
        with it (once: a repeated report finds the port recorded; a task whose node was away gets its order when
        the node reconnects, from `_reconcile`)."""
        assert self.binder is not None
        current = self.lease.epoch if self.lease is not None else 0
        with self.db.session() as session:
            siblings = gang.record_port(session, status.allocation_id, status.attempt, status.rendezvous_port)
        for allocation in siblings:
            order = self.binder.launch(allocation, max(allocation.leader_epoch, current), time.time())
            if order is not None:
                self.send(allocation.node_id, order)

    def _reconcile(self, node_id: str, hello: Hello) -> None:
        """After a (re)connect: resend launches the agent never got, stop work it should not run.

        A re-sent launch carries this process's lease epoch when that is newer than the allocation's: the agent may
        already have taken an order of the current epoch, and would refuse the old one as stale (a control plane
        killed between its commit and the launch would otherwise cost the job an attempt)."""
        assert self.binder is not None
        current = self.lease.epoch if self.lease is not None else 0
        reported = {(r.allocation_id, r.attempt) for r in hello.running}
        closed = self.lifecycle.node_rebooted(node_id, hello.boot_id, reported) if self.lifecycle else 0  # T3.3
        if closed:
            log.warning("node %s: boot %s does not run %d allocation(s) of the former boot: closed (node_rebooted)",
                        node_id, hello.boot_id[:64], closed)
        with self.db.session() as session:
            open_rows = list(session.scalars(select(Allocation).where(
                Allocation.node_id == node_id, Allocation.state.in_(OPEN_ALLOCATION_STATES))))
        known = {(a.id, a.attempt) for a in open_rows}
        for allocation in open_rows:
            if allocation.state == "starting" and (allocation.id, allocation.attempt) not in reported:
                epoch = max(allocation.leader_epoch, current)
                order = self.binder.launch(allocation, epoch, time.time())
                if order is not None:  # None: a gang's task waiting for task 0's port
                    self.send(node_id, order)
            if allocation.state == "stopping":
                self.send(node_id, Stop(allocation_id=allocation.id, attempt=allocation.attempt,
                                        grace_s=self.settings.kill_grace_s, reason=allocation.release_reason))
        for allocation_id, attempt in reported - known:
            self.send(node_id, Stop(allocation_id=allocation_id, attempt=attempt, grace_s=0, reason="unknown"))
        self._mark_seen(node_id)

    def _append_log(self, chunk: LogChunk) -> None:
        """Idempotent: a re-sent chunk overwrites the same bytes. The log keeps its last bytes only (joblogs)."""
        self.job_logs.append(chunk.allocation_id, chunk.attempt, chunk.offset, chunk.data.encode())

    # liveness --------------------------------------------------------------------------------

    async def monitor(self) -> None:
        """Every second: suspect silent nodes, declare lost ones, end grants past their limit; and every
        `metering_interval_s` write the usage ledger and a cluster sample."""
        last_metered = 0.0
        while True:
            await asyncio.sleep(min(1.0, self.settings.heartbeat_s))
            if not self.leads():  # the passive process, or a leader cut off from the database: nothing to decide
                self._close_all("this control plane no longer holds the scheduler lease")
                continue
            try:
                await asyncio.to_thread(self.check_liveness, time.monotonic())
                assert self.lifecycle is not None
                await asyncio.to_thread(self.lifecycle.enforce_limits, time.time())
                if self.draining is not None:
                    await asyncio.to_thread(self.draining.enforce, datetime.now(UTC),
                                            self.lease.epoch if self.lease is not None else None)
                await asyncio.to_thread(self._reclaim_idle, time.monotonic())
                if time.monotonic() - last_metered >= self.settings.metering_interval_s:
                    await asyncio.to_thread(self.meter_and_sample)
                    last_metered = time.monotonic()
            except Fenced:
                continue  # deposed during the pass: the lease logged it
            except Exception as exc:  # a bug (or the database is out): keep monitoring, and say so
                if unreachable(exc):
                    self._warn_unreachable(exc)
                else:
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
        """Write the usage ledger and a cluster sample; fenced like every scheduler write (ledger rows, I9)."""
        now = datetime.now(UTC)
        epoch = self.lease.epoch if self.lease is not None else None
        with self.db.session() as session:
            if epoch is not None:
                assert self.lease is not None
                self.lease.fence(session, epoch)
            meter(session, now, self.settings.metering_period_s)
            with self.cache.lock:
                figures = cluster_figures(self.cache.table)
            used = sum(t.utilization_pct for tele in self.telemetry.values() for t in tele) / 100
            session.merge(ClusterSample(at=now.replace(microsecond=0), gpus=figures.capacity_milli / 1000,
                                        allocated=figures.allocated_milli / 1000, used=used,
                                        reserved=self.cache.reserved_milli / 1000,
                                        fragmented_nodes=figures.fragmented_nodes, gpu_nodes=figures.nodes))

    def took_over(self) -> None:
        """This process now leads (start or takeover): the guard holds for G and every node gets a fresh grace."""
        now = time.monotonic()
        self.guard.restart(now)
        self._fresh_grace(now)

    def _fresh_grace(self, now: float) -> None:
        """Count every tracked node's silence from `now` (`last_seen` is the liveness clock; billing reads the
        node's last heartbeat from the database)."""
        for node_id in list(self.last_seen):
            self.last_seen[node_id] = max(self.last_seen[node_id], now)

    def check_liveness(self, now: float) -> None:
        """Mark nodes not heard for `suspect_after_s` unreachable and requeue their work whose own max_disconnect has
        surely passed; declare lost (and requeue everything of) those silent past `lost_after_s`, as the guard allows,
        fenced by the lease epoch this pass started under. Unreachable counts from the node's latest fresh frame; what
        requeues counts from the later of that and the latest frame sent to it (`_silence`). When the guard lifts
        after an outage or a mass silence, every node first gets a fresh grace (as Kubernetes does on leaving a
        zone's full disruption): nodes still silent are judged again from then."""
        epoch = self.lease.epoch if self.lease is not None else None
        before = self.guard.reason
        if self.guard.check(now, self._unheard(now), self.db.unreachable_at):
            log.debug("liveness guard holds: %s", self.guard.reason)
        elif before and before != "starting":
            log.warning("liveness guard lifted (it held for: %s); every node gets a fresh grace", before)
            self._fresh_grace(now)
        unheard, silent = self._unheard(now), self._silence(now)
        for node_id, quiet in silent.items():
            try:
                if quiet > self.settings.lost_after_s and self.guard.allow_lost(now):
                    self._lost(node_id, quiet, epoch)
                elif unheard[node_id] > self.settings.suspect_after_s:
                    self._set_state(node_id, "unreachable")
                    if not self.guard.engaged:
                        self._requeue_overdue(node_id, quiet, epoch)
            except Fenced:
                return

    def _unheard(self, now: float) -> dict[str, float]:
        """Each tracked node's time since its latest fresh frame."""
        return {n: now - t for n, t in self.last_seen.items()}

    def _silence(self, now: float) -> dict[str, float]:
        """Each tracked node's silence: since its latest fresh frame, or the latest frame sent to it if later (an
        order that reached the agent restarted its own count)."""
        return {n: now - max(t, self.last_sent.get(n, t)) for n, t in self.last_seen.items()}

    def _lost(self, node_id: str, quiet: float, epoch: int | None) -> None:
        assert self.lifecycle is not None
        requeued = self.lifecycle.node_lost(node_id, None, epoch)
        log.warning("node %s lost after %.1f s of silence; %d job(s) requeued", node_id, quiet, requeued)
        if self.on_lost is not None:
            self.on_lost(requeued)
        self.last_seen.pop(node_id, None)
        self._drop_launches(node_id)
        self._set_state(node_id, "lost")

    def mark_down(self, node_id: str) -> None:
        """An operator says the node is dead: declare it lost now (its work requeued, billing ended at its last
        heartbeat), fenced by this leader's epoch. HTTP 409 while its agent is connected or heard within
        `suspect_after_s`, 503 on a standby."""
        self.require_leader()
        quiet = self._silence(time.monotonic()).get(node_id)
        if self.sessions.get(node_id) or (quiet is not None and quiet <= self.settings.suspect_after_s):
            raise HTTPException(409, "node: its agent is connected; a node that runs is not down (cordon it to "
                                     "take no new work, or reset it)")
        epoch = self.lease.epoch if self.lease is not None else None
        try:
            self._lost(node_id, quiet or 0.0, epoch)
        except Fenced:
            raise HTTPException(503, "this control plane was deposed meanwhile; ask the leader",
                                headers={"Retry-After": "1"}) from None

    def _requeue_overdue(self, node_id: str, quiet: float, epoch: int | None) -> None:
        """Requeue the work of an unreachable node whose own (shorter than the pool's) max_disconnect has surely
        passed; work under the pool's is requeued when the node is declared lost (at the guard's pace)."""
        margin = self.settings.requeue_margin_s
        with self.db.session() as session:
            rows = session.execute(select(Allocation.id, Job.spec).join(Job, Job.id == Allocation.job_id).where(
                Allocation.node_id == node_id, Allocation.state.in_(OPEN_ALLOCATION_STATES))).all()
        limits = {allocation_id: self.settings.disconnect_limit_s(spec.get("max_disconnect_s"))
                  for allocation_id, spec in rows}
        overdue = [allocation_id for allocation_id, limit in limits.items()  # the pool's own: when the node is lost
                   if limit < self.settings.max_disconnect_s and quiet > limit + margin]
        if overdue:
            assert self.lifecycle is not None
            requeued = self.lifecycle.node_lost(node_id, None, epoch, only=overdue)
            log.warning("node %s unreachable for %.1f s: %d job(s) past their max_disconnect requeued", node_id,
                        quiet, requeued)

    def _drop_launches(self, node_id: str) -> None:
        """Forget the launch orders still queued for a node just declared lost (thread-safe): their allocations are
        released and their jobs requeued, so none may start when the node comes back (T2.b: no attempt twice)."""
        queue = self.queues.get(node_id)
        if queue is None:
            return

        def drop() -> None:
            kept = [f for f in (queue.get_nowait() for _ in range(queue.qsize())) if not isinstance(f, Launch)]
            for frame in kept:
                queue.put_nowait(frame)

        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(drop)
        else:
            drop()

    def _set_state(self, node_id: str, state: str) -> None:
        with self.db.session() as session:
            node = session.get(Node, node_id)
            if node is None or node.state in ("reset", REMOVED):
                return
            changed, node.state, name = node.state != state, state, node.name
        if changed or state == "lost":  # node_lost wrote "lost" itself: take the node out of the cache here
            self.cache.set_schedulable(name, False)


# identity: registration and reset (see the module docstring) --------------------------------------------------------


def _check_unique_gpus(gpus: list[GpuInfo]) -> None:
    """422 naming the first GPU whose index or UUID repeats an earlier one of the same registration."""
    seen: dict[str, dict[object, int]] = {"index": {}, "uuid": {}}
    for i, gpu in enumerate(gpus):
        for field, value in (("index", gpu.index), ("uuid", gpu.uuid)):
            first = seen[field].setdefault(value, i)
            if first != i:
                raise RequestValidationError([{
                    "type": "value_error", "loc": ("body", "gpus", i, field), "input": value,
                    "msg": f"gpus[{i}].{field}: repeats gpus[{first}].{field}; each GPU of a node has its own"}])


def _claimable(session: Session, reg: Registration) -> Node | None:
    """The reset node `reg` may take (None: the name is new). 409 naming `name` when a node holds the name and was
    not reset (nothing else about it is said), or `gpus[i].uuid` when a GPU in service on another node has it."""
    node = session.scalar(select(Node).where(Node.name == reg.name))
    if node is not None and node.state not in ("reset", REMOVED):
        raise HTTPException(409, NAME_TAKEN)
    uuids = {gpu.uuid: i for i, gpu in enumerate(reg.gpus)}
    taken = session.scalars(select(Gpu.uuid).where(Gpu.uuid.in_(list(uuids)), Gpu.retired_at.is_(None))).all()
    if taken:
        first = min(uuids[uuid] for uuid in taken)
        raise HTTPException(409, f"gpus[{first}].uuid: a GPU with this UUID is registered to another node")
    return node


def _record_node(session: Session, reg: Registration, node: Node | None) -> Node:
    """Record `reg` as a new node, or on the reset `node` (same id: its history stays), with its GPUs."""
    if node is None:
        node = Node(name=reg.name, cpu_milli=reg.cpu_milli, memory_mib=reg.memory_mib)
        session.add(node)
        session.flush()
    node.cpu_milli, node.memory_mib, node.site, node.rack = reg.cpu_milli, reg.memory_mib, reg.site, reg.rack
    node.untrusted_images, node.jobs_as = reg.untrusted_images, reg.jobs_as
    node.state, node.boot_id, node.last_seen = "ready", reg.boot_id, datetime.now(UTC)
    _record_gpus(session, node.id, reg.gpus)
    return node


def _record_gpus(session: Session, node_id: str, gpus: list[GpuInfo]) -> None:
    """Put `gpus` in service on `node_id`: the node's row of each index is revived with what is there now (its id
    kept), a new index gets a row. Retired rows first give up the UUIDs taken here (see Gpu)."""
    wanted = {gpu.uuid: gpu.index for gpu in gpus}
    for holder in session.scalars(select(Gpu).where(Gpu.uuid.in_(list(wanted)))):
        if (holder.node_id, holder.index) != (node_id, wanted[holder.uuid]):
            holder.uuid = f"retired:{holder.id}"
    session.flush()
    rows = {row.index: row for row in session.scalars(select(Gpu).where(Gpu.node_id == node_id))}
    for info in gpus:
        slot = rows.get(info.index)
        if slot is None:
            session.add(Gpu(node_id=node_id, index=info.index, uuid=info.uuid, model=info.model,
                            memory_mib=info.memory_mib, fake=info.fake))
        else:
            slot.uuid, slot.model, slot.memory_mib, slot.fake = info.uuid, info.model, info.memory_mib, info.fake
            slot.retired_at = None
    session.flush()


def _revoke_identity(session: Session, node_id: str, now: datetime) -> None:
    """Put every certificate of `node_id` on the denylist and revoke its credentials."""
    session.execute(update(AgentCertificate).where(
        AgentCertificate.node_id == node_id, AgentCertificate.revoked_at.is_(None)).values(revoked_at=now))
    session.execute(update(Token).where(Token.node_id == node_id, Token.revoked_at.is_(None)).values(revoked_at=now))


def _retire(session: Session, node_id: str, now: datetime, final: str) -> None:
    """Mark `node_id` `final` (reset or removed: its name free for a join token) and take its GPUs out of service."""
    node = session.get(Node, node_id)
    if node is not None:
        node.state = final
        if final == REMOVED:  # a node that joins again under the name starts afresh
            clear_drain(node)
    session.execute(update(Gpu).where(Gpu.node_id == node_id, Gpu.retired_at.is_(None)).values(retired_at=now))
