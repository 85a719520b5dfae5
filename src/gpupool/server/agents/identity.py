"""A node's identity: registration with a join token, channel admission, certificate renewal and reset.

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

import hmac
import time
from datetime import UTC, datetime

from cryptography import x509
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.protocol.agent import (
    ADDRESS,
    Certificate,
    Registration,
    RegistrationReply,
    Rejected,
    Renew,
)
from gpupool.protocol.devices import GpuInfo
from gpupool.protocol.tls import node_of
from gpupool.server.agent_ca import CertificateRequestError
from gpupool.server.agents.base import NAME_TAKEN, RENEW_INTERVAL_S, HubState, Refused, log
from gpupool.server.auth import hash_secret, new_token, resolve
from gpupool.server.db.models import AgentCertificate, Gpu, JoinToken, Node, Token
from gpupool.server.services.draining import REMOVED
from gpupool.server.services.draining import clear as clear_drain


class Identity(HubState):
    """Registration, admission, renewal and reset of a node's identity (see the module docstring)."""

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
