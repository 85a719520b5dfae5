"""Binder: applies a cycle's decisions — one database transaction, then the cache, then orders to agents.

1. Binds whose GPU slots are still held by an allocation being stopped in the same batch wait for
   the next cycle (pipelined behind their victims); so do binds of jobs no longer pending.
2. In one transaction: evicted allocations become "stopping" and their jobs go back to pending;
   each started job gets one allocation per task, with its GPU slots (the unique open-slot index
   makes double allocation impossible), and becomes "scheduled". A job is claimed by a compare-and-set
   on its state (still pending, at the attempt read), so a cancel that commits while the batch is
   being written wins and its job is simply left out, on SQLite (where the batch's first read runs
   before its write transaction) as on PostgreSQL. The started jobs are written together: one UPDATE
   and one batched INSERT per table for the whole batch, never a round trip per job.
3. Only after the commit: the cache assumes the new allocations, and launch / stop orders go out.
   A failed transaction changes nothing and the jobs are simply retried next cycle.
The transaction starts with `fence(session, epoch)` (SchedulerLease.fence): a deposed leader's batch is
refused whole (RELIABILITY.md I9).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError
from sqlalchemy import case, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.core import Bind, Decision, Evict, JobSpec
from gpupool.core.decisions import Move
from gpupool.protocol.agent import GpuGrant, Launch, Rendezvous, Stop
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Allocation, AllocationSlot, Job, JobEvent, User, new_id, utcnow
from gpupool.server.failpoints import failpoint
from gpupool.server.keyring import Keyring
from gpupool.server.scheduler import gang
from gpupool.server.scheduler.cache import ClusterCache, NodeEntry, running_task
from gpupool.server.scheduler.lease import Fenced

log = logging.getLogger(__name__)

#: the columns of an allocation that `Binder._plan` sets
PLANNED_COLUMNS = ("id", "job_id", "task_index", "attempt", "node_id", "state", "gpu_milli", "cpu_milli", "memory_mib",
                   "shares", "leader_epoch")


class OrderSink(Protocol):
    def send(self, node_id: str, frame: Launch | Stop) -> None: ...


@dataclass
class Planned:
    allocation: Allocation  # as inserted; a plain value, never attached to a session
    slots: tuple[tuple[str, int], ...]
    bind: Bind
    job: JobSpec
    spec: dict[str, Any]  # the job's spec as stored: what its launch order carries


class Binder:
    #: opens jobs' secret variables for their launch orders (create_app sets it)
    keyring: Keyring | None = None

    def __init__(self, db: Database, cache: ClusterCache, orders: OrderSink, launch_ttl_s: float,
                 grace_s: float, fence: Callable[[Session, int], None] | None = None,
                 disconnect_limit: Callable[[float | None], float] | None = None) -> None:
        self.db, self.cache, self.orders = db, cache, orders
        self.launch_ttl_s, self.grace_s = launch_ttl_s, grace_s
        self.fence = fence
        self._user_names: dict[str, str] = {}  # user id -> name, for launch orders (names never change)
        self.disconnect_limit = disconnect_limit  # Settings.disconnect_limit_s: each order says its max_disconnect

    def apply(self, decisions: Sequence[Decision], jobs: dict[str, JobSpec], epoch: int) -> int:
        """Apply decisions; returns the number of jobs started."""
        evictions = [d for d in decisions if isinstance(d, Evict | Move)]
        stopping = {self.cache.by_task[d.task_id] for d in evictions if d.task_id in self.cache.by_task}
        busy = {slot for a in stopping for slot in self.cache.held[a].slots}
        binds: dict[str, list[Bind]] = defaultdict(list)
        for d in decisions:
            if isinstance(d, Bind):
                binds[d.job_id].append(d)
        try:
            with self.db.session() as session:
                if self.fence is not None and (stopping or binds):
                    self.fence(session, epoch)
                stops = self._evict(session, stopping)
                planned = self._bind(session, binds, jobs, busy, epoch) if binds else []
                if planned:
                    failpoint("binder.after_allocation_insert")
        except IntegrityError as exc:
            log.warning("binder: transaction refused, retrying next cycle: %s", exc.orig)
            return 0
        except Fenced:
            return 0
        self._dispatch(planned, stops, epoch)
        return len({p.job.id for p in planned})

    def _evict(self, session: Session, stopping: set[str]) -> list[tuple[str, Stop]]:
        stops = []
        for allocation_id in sorted(stopping):
            row = session.get(Allocation, allocation_id)
            if row is None or row.state not in ("starting", "running"):
                continue
            row.state = "stopping"
            row.release_reason = "preempted"
            if _requeued(session, row.job_id, row.attempt):
                session.add(JobEvent(job_id=row.job_id, kind="preempted", message="evicted to make room; requeued"))
            stops.append((row.node_id, Stop(allocation_id=row.id, attempt=row.attempt, grace_s=self.grace_s,
                                            reason="preempted")))
        return stops

    def _bind(self, session: Session, binds: dict[str, list[Bind]], jobs: dict[str, JobSpec],
              busy: set[tuple[str, int]], epoch: int) -> list[Planned]:
        """Start the bound jobs that are still pending, in a few round trips for the whole batch (not per job): read
        their rows (locked on PostgreSQL), claim them with one compare-and-set UPDATE, then insert every allocation,
        GPU slot and event of the jobs it claimed with one batched INSERT per table (psycopg pipelines the rows)."""
        locked = session.execute(select(Job.id, Job.attempt, Job.spec).where(
            Job.id.in_(list(binds)), Job.state == "pending").order_by(Job.id).with_for_update())
        pending = {row.id: row for row in locked}
        claimed: set[tuple[str, int]] = set()
        planned: list[Planned] = []
        for job_id, group in binds.items():
            if job_id in pending:
                row = pending[job_id]
                planned += self._plan(jobs[job_id], row.attempt + 1, row.spec, group, busy, claimed, epoch)
        won = _claim(session, {p.job.id: p.allocation.attempt for p in planned})
        planned = [p for p in planned if p.job.id in won]
        if not planned:
            return []
        now = utcnow()
        session.execute(insert(Allocation.__table__), [_row(p.allocation, now) for p in planned])
        slots = [{"allocation_id": p.allocation.id, "gpu_id": gpu, "slot": slot} for p in planned
                 for gpu, slot in p.slots]
        if slots:
            session.execute(insert(AllocationSlot.__table__), slots)
        events = [_scheduled(job_id, attempt, binds[job_id], now) for job_id, attempt in won.items()]
        session.execute(insert(JobEvent.__table__), events)
        return planned

    def _plan(self, job: JobSpec, attempt: int, spec: dict[str, Any], group: list[Bind], busy: set[tuple[str, int]],
              claimed: set[tuple[str, int]], epoch: int) -> list[Planned]:
        """One job's allocations and GPU slots (none while a slot it needs is still held by a victim)."""
        mine: set[tuple[str, int]] = set(claimed)
        slots = [self.cache.slots_for(b.node, b.shares, mine) for b in group]
        if any(s in busy for chosen in slots for s in chosen):
            return []
        claimed.update(mine)
        planned = []
        for bind, chosen in zip(group, slots, strict=True):
            allocation = Allocation(id=new_id(), job_id=job.id, task_index=int(bind.task_id.rsplit("/", 1)[1]),
                                    attempt=attempt, node_id=self.cache.nodes[bind.node].node_id,
                                    state="starting", gpu_milli=bind.shape.total_gpu_milli,
                                    cpu_milli=bind.shape.cpu_milli, memory_mib=bind.shape.memory_mib,
                                    leader_epoch=epoch, shares=[[s.index, s.milli, s.memory_mib] for s in bind.shares])
            planned.append(Planned(allocation, chosen, bind, job, spec))
        return planned

    def _dispatch(self, planned: list[Planned], stops: list[tuple[str, Stop]], epoch: int) -> None:
        now = time.time()
        for p in planned:
            task = running_task(p.bind.task_id, p.job, p.bind.node, p.bind.shape, p.bind.shares, now)
            self.cache.assume(p.allocation.id, task, p.slots)
        for node_id, stop in stops:
            self.orders.send(node_id, stop)
        gangs: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for p in planned:
            gangs[p.job.id].append((p.allocation.task_index, p.allocation.node_id))
        for p in planned:
            members = gangs[p.job.id]
            if len(members) > 1 and p.allocation.task_index != 0:
                continue  # launched once task 0's agent has chosen MASTER_PORT (gang.record_port)
            if p.spec.get("secret_env"):
                order = self.launch(p.allocation, epoch, now)  # reads and opens the sealed values
            else:
                together = gang.rendezvous(members, self._addresses(), p.allocation.task_index, 0)
                order = self._order(p.allocation, self.cache.nodes[p.bind.node], p.spec, {}, epoch, now,
                                    self._user_name(p.job.user), together)
            if order is not None:
                self.orders.send(p.allocation.node_id, order)

    def launch(self, allocation: Allocation, epoch: int, now: float) -> Launch | None:
        """The launch order for an allocation (also re-sent when an agent reconnects), addressed to its node; None for
        a task of a gang other than task 0 while task 0's agent has not reported MASTER_PORT. It is signed as it
        leaves (AgentHub.send), so whatever is added to it here (env included) is covered."""
        with self.db.session() as session:
            job = session.get(Job, allocation.job_id)
            assert job is not None
            spec = job.spec
            secret = self.keyring.open_job(session, job) if self.keyring and spec.get("secret_env") else {}
            user_id = job.user_id
            members, port = gang.members(session, allocation)
        if len(members) > 1 and allocation.task_index != 0 and port is None:
            return None
        together = gang.rendezvous(members, self._addresses(), allocation.task_index, port or 0)
        entry = next(e for e in self.cache.nodes.values() if e.node_id == allocation.node_id)
        return self._order(allocation, entry, spec, secret, epoch, now, self._user_name(user_id), together)

    def _addresses(self) -> dict[str, str]:
        """Node id -> where other nodes reach it (its agent's word, else its name)."""
        return {e.node_id: e.address or e.spec.name for e in self.cache.nodes.values()}

    def _user_name(self, user_id: str) -> str:
        """The name of user `user_id` ("" if there is none), which a node running jobs as local users needs."""
        if user_id not in self._user_names:
            with self.db.session() as session:
                self._user_names[user_id] = session.scalar(select(User.name).where(User.id == user_id)) or ""
        return self._user_names[user_id]

    def _order(self, allocation: Allocation, entry: NodeEntry, spec: dict[str, Any], secret: dict[str, str],
               epoch: int, now: float, user: str, rendezvous: Rendezvous | None = None) -> Launch:
        grants = [GpuGrant(uuid=entry.spec.gpus[i].uuid, index=i, milli=m, memory_mib=mem)
                  for i, m, mem in allocation.shares]
        env = {**spec.get("env", {}), **secret, "GPUPOOL_TASK_INDEX": str(allocation.task_index)}
        fields = dict(allocation_id=allocation.id, attempt=allocation.attempt, job_id=allocation.job_id,
                      task_index=allocation.task_index, command=spec["command"], env=env,
                      workdir=spec.get("workdir"), image=spec.get("image"), gpus=grants, epoch=epoch,
                      expires_at=now + self.launch_ttl_s, user=user, node_id=allocation.node_id, rendezvous=rendezvous,
                      max_disconnect_s=self.disconnect_limit(spec.get("max_disconnect_s"))
                      if self.disconnect_limit is not None else None)
        try:
            return Launch(**fields)
        except ValidationError:  # a job stored before the launch rules (protocol.launch): its node answers "failed"
            return Launch.model_construct(**fields)


def _claim(session: Session, attempts: dict[str, int]) -> dict[str, int]:
    """Make each job of `attempts` (job id -> the attempt planned for it) "scheduled" at that attempt if it is still
    pending at the attempt before: one compare-and-set UPDATE, evaluated under the write lock (SQLite) or the row
    locks (PostgreSQL) it takes. Returns the jobs it changed, with their attempts; a job cancelled (or placed) since
    it was read is not among them."""
    if not attempts:
        return {}
    jobs = Job.__table__
    changed = session.execute(jobs.update().where(
        tuple_(jobs.c.id, jobs.c.attempt).in_([(job_id, attempt - 1) for job_id, attempt in attempts.items()]),
        jobs.c.state == "pending").values(state="scheduled", reason=None, attempt=jobs.c.attempt + 1).returning(
        jobs.c.id))
    return {job_id: attempts[job_id] for job_id in changed.scalars()}


def _requeued(session: Session, job_id: str, attempt: int) -> bool:
    """Send a preempted job back to pending if it is still scheduled or running at `attempt` (compare-and-set: a job
    cancelled or ended meanwhile stays as it is); True if it went back."""
    jobs = Job.__table__
    result = session.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.attempt == attempt, jobs.c.state.in_(
        ("scheduled", "running"))).values(state="pending", preemptions=jobs.c.preemptions + 1))
    return bool(result.rowcount)


def _row(allocation: Allocation, now: datetime) -> dict[str, Any]:
    """The INSERT values of a planned allocation (a value built by `Binder._plan`; the columns it leaves unset take
    their defaults)."""
    return {**{key: getattr(allocation, key) for key in PLANNED_COLUMNS}, "created_at": now}


def _scheduled(job_id: str, attempt: int, group: list[Bind], now: datetime) -> dict[str, Any]:
    nodes = ", ".join(sorted({b.node for b in group}))
    return {"job_id": job_id, "at": now, "kind": "scheduled", "message": f"attempt {attempt} placed on {nodes}"}


def released_now(allocation: Allocation, reason: str, exit_code: int | None, session: Session,
                 at: datetime | None = None) -> None:
    """Close an allocation and its GPU slots (idempotent), released at `at` (default: now) or at what the meter
    already billed (`metered_until`), whichever is later: one UPDATE reads `metered_until` under the row's write
    lock, so a meter that committed while this transaction waited is never billed past the release (I7)."""
    if allocation.released_at is not None:
        return
    at = utcnow() if at is None else at
    session.flush()  # the refresh below must not drop this transaction's pending changes of the allocation
    closed = update(Allocation).where(Allocation.id == allocation.id, Allocation.released_at.is_(None)).values(
        state="released", exit_code=exit_code,
        released_at=case((Allocation.metered_until > at, Allocation.metered_until), else_=at),
        release_reason=case((Allocation.release_reason == "", reason), else_=Allocation.release_reason))
    released = session.execute(closed.returning(Allocation.released_at),
                               execution_options={"synchronize_session": False}).scalar()
    session.refresh(allocation, ["state", "released_at", "release_reason", "exit_code"])
    if released is None:
        return  # another transaction released it first
    for slot in session.query(AllocationSlot).filter_by(allocation_id=allocation.id, released_at=None):
        slot.released_at = released
