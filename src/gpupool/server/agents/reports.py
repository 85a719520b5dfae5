"""Reports in: applying an agent's fresh frames (Hello, Heartbeat, TaskStatus, LogChunk, Renew) to the database and
the scheduler's cache, and reconciling a node's work after it (re)connects.

A report about an allocation that is not the node's own is answered `Rejected` (403) and logged, with no state
change; a task status about an attempt already closed is answered `Rejected` (409), and a stop order if it says
"started". A Hello of a boot other than the node's recorded one closes what that boot does not run
(Lifecycle.node_rebooted).

Database outage (RELIABILITY.md T7): a report that cannot be applied because the database is unreachable is not
acked, and neither is anything after it (acks are cumulative); every frame still gets an Ack of what was applied,
so the agent keeps hearing from the control plane and does not fence. Once a report applies again, the channel
is closed (1013) and the agent reconnects and re-sends what was not acked, in order.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import select

from gpupool.protocol.agent import (
    Heartbeat,
    Hello,
    LogChunk,
    Rejected,
    Renew,
    Stop,
    TaskStatus,
)
from gpupool.server.agents.base import log
from gpupool.server.agents.identity import Identity
from gpupool.server.db.engine import unreachable
from gpupool.server.db.models import Allocation, Node
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES
from gpupool.server.scheduler import gang
from gpupool.server.services.draining import REMOVED


class Reports(Identity):
    """Frame application (see the module docstring)."""

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
