"""Liveness (RELIABILITY.md §2.2): silence is not death.

A node silent for `suspect_after_s` is *unreachable*: it takes no new work, and its agent keeps running what it runs
for `max_disconnect_s` (or a job's shorter one) without word from any control plane, then fences it. Its work is
requeued only once it can no longer run: `requeue_margin_s` after the work's own max_disconnect (counted from the
later of the last frame heard from the node and the last frame sent to it, so that an order that reached it is
counted), or at once when it is known dead (a new boot of its agent, or an operator's `node down`). Silent for
`lost_after_s` the node is lost: every allocation is released (billing ends at its last heartbeat) and its jobs
requeued. Only the scheduler lease's holder declares nodes lost (fenced by its epoch, like every scheduler write),
never while the control plane is itself impaired (at its start or takeover every node is given a fresh grace), and
at a bounded rate (gpupool.server.scheduler.liveness).

The monitor also ends grants past their limit, reclaims idle allocations, and writes the usage ledger and cluster
samples.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from fastapi import HTTPException
from sqlalchemy import select

from gpupool.core.metrics import cluster_figures
from gpupool.protocol.agent import (
    Launch,
)
from gpupool.server.agents.base import HubState, log
from gpupool.server.db.engine import unreachable
from gpupool.server.db.models import Allocation, ClusterSample, Job, Node
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES
from gpupool.server.scheduler.lease import Fenced
from gpupool.server.services.draining import REMOVED
from gpupool.server.services.metering import meter


class Liveness(HubState):
    """The leader's monitor of nodes' silence (see the module docstring)."""

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
