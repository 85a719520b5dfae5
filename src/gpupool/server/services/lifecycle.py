"""Job and allocation lifecycle after placement: agent reports, cancellation, limits, lost nodes.

Job states: pending_approval -> pending -> scheduled -> running -> succeeded | failed; cancelled and
denied end it early; preemption, fencing and lost nodes send it back to pending (`attempt` only grows).
An allocation is starting -> running -> released, or stopping -> released when told to stop. Reports
about an attempt already closed change nothing and are refused (409; RELIABILITY.md I9); a new boot of a node's agent
closes what it no longer runs (node_rebooted, T3.3).

Every change of a job's state is a compare-and-set on the state it was read in (`_move`), so that two writers racing
(a cancel, the binder, an agent's report, the limit monitor) never overwrite a state one of them did not see, on
SQLite (whose reads run before the write transaction begins) as on PostgreSQL. Cancel is final (`gpupool check` I10):
a cancelled job is never placed, started or billed again. Stop orders and scheduler wake-ups go out only after the
transaction that decided them commits (`after_commit`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from gpupool.protocol.agent import Stop, TaskStatus
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Allocation, Job, JobEvent, Node, utcnow
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES, find_queue
from gpupool.server.scheduler.binder import OrderSink, released_now
from gpupool.server.scheduler.cache import ClusterCache
from gpupool.server.services.metering import aware

TERMINAL = ("succeeded", "failed", "cancelled", "denied")
PLACED = ("scheduled", "running")
NOT_FINAL = ("pending_approval", "pending", *PLACED)


@dataclass(frozen=True)
class Ending:
    """How a job ends before its tasks do: its final state, its event (kind and message), the reason its stop orders
    carry, and the reason the job shows (None: it keeps its own)."""

    state: str
    kind: str
    message: str
    stop_reason: str
    reason: dict[str, object] | None = None


class Lifecycle:
    def __init__(self, db: Database, cache: ClusterCache, orders: OrderSink, wake: Callable[[], None],
                 grace_s: float, fence: Callable[[Session, int], None] | None = None) -> None:
        self.db, self.cache, self.orders, self.wake, self.grace_s = db, cache, orders, wake, grace_s
        self.fence = fence  # SchedulerLease.fence: node_lost's requeues are scheduler writes

    def on_status(self, node_id: str, status: TaskStatus) -> str | None:
        """Apply an agent's task report for an allocation placed on `node_id`. The cache frees an ended
        allocation's GPUs only after the commit: a refused transaction (disk full, database gone) leaves cache
        and database agreeing, and the agent re-sends the report, which it did not get acknowledged.

        Returns why the report is stale (the caller answers it 409), or None: a report about an attempt that is not
        the allocation's, or about an allocation already released (lost, rebooted, requeued, or ended by an earlier
        report), changes nothing (RELIABILITY.md I9); if it says such an attempt "started", the node is ordered to
        stop it at once, since something runs there that no allocation holds (T3.2)."""
        with self.db.session() as session:
            allocation = session.get(Allocation, status.allocation_id)
            if allocation is None or allocation.node_id != node_id:
                return None
            stale = _stale(allocation, status)
            if stale is not None:
                if status.state == "started":
                    self.orders.send(node_id, Stop(allocation_id=status.allocation_id, attempt=status.attempt,
                                                   grace_s=0, reason="stale attempt"))
                return stale
            job = session.get(Job, allocation.job_id, with_for_update=True)  # first, as cancel and the binder lock
            assert job is not None
            if status.state == "started":
                self._started(session, allocation, job)
                return None
            released = self._ended(session, allocation, job, status)
        if released:
            self.cache.release(allocation.id)
            self.wake()
        return None

    def _started(self, session: Session, allocation: Allocation, job: Job) -> None:
        """A confirmed start, decided under the job's lock: its row lock on PostgreSQL (on_status took it) and the
        write lock that the allocation's compare-and-set takes on SQLite, so it is ordered with a cancel either way
        and its time is taken after the lock. A start of an allocation whose job is final (cancelled, ...) or on
        another attempt is stopped at once, with no grace, and never billed: it gets no started_at, so metering
        (billing from a confirmed start to the release) has nothing to bill."""
        won = _allocation_moved(session, allocation, "starting", "running")
        session.refresh(job)  # SQLite: read again under the write lock just taken (on_status read it before)
        if job.state in TERMINAL or job.attempt != allocation.attempt:
            if won:
                allocation.state = "stopping"
                allocation.release_reason = job.state if job.attempt == allocation.attempt else "stale attempt"
            if allocation.started_at is None:
                stop = Stop(allocation_id=allocation.id, attempt=allocation.attempt, grace_s=0,
                            reason=allocation.release_reason or "stale attempt")
                after_commit(session, functools.partial(self.orders.send, allocation.node_id, stop))
            return
        if not won:
            return
        allocation.started_at = utcnow()
        siblings = self._open(session, job.id, allocation.attempt)
        if all(a.state == "running" for a in siblings) and _move(session, job, "running", ("scheduled",),
                                                                  allocation.attempt):
            job.started_at = job.started_at or utcnow()
            session.add(JobEvent(job_id=job.id, kind="running", message=f"attempt {job.attempt} started"))

    def _ended(self, session: Session, allocation: Allocation, job: Job, status: TaskStatus) -> bool:
        """Release the allocation and settle its job; False if it was released already (nothing changed)."""
        if allocation.released_at is not None:
            return False
        reason = {"exited": "exited", "failed": "failed", "fenced": "fenced", "refused": "refused"}[status.state]
        released_now(allocation, reason, status.exit_code, session)
        if job.attempt != allocation.attempt or job.state in TERMINAL:
            return True
        if status.state in ("fenced", "refused") or allocation.release_reason == "preempted":
            self._requeue(session, job, allocation.attempt,
                          f"task {allocation.task_index}: {status.state} {status.message}".strip())
        elif allocation.release_reason == "drained":  # evicted (evict_node): requeued once every task has stopped
            if not self._open(session, job.id, job.attempt):
                self._requeue(session, job, allocation.attempt, "evicted from a drained node; every task stopped")
        elif status.state == "failed" or (status.exit_code or 0) != 0:
            why = f"task {allocation.task_index}: {status.message}" if status.message else ""
            self._finish(session, job, allocation.attempt, "failed", status.exit_code, why)
        elif not self._open(session, job.id, job.attempt):
            self._finish(session, job, allocation.attempt, "succeeded", 0)
        return True

    def _open(self, session: Session, job_id: str, attempt: int) -> list[Allocation]:
        return list(session.scalars(select(Allocation).where(
            Allocation.job_id == job_id, Allocation.attempt == attempt,
            Allocation.state.in_(OPEN_ALLOCATION_STATES))))

    def _finish(self, session: Session, job: Job, attempt: int, state: str, exit_code: int | None,
                why: str = "") -> None:
        """End the job in `state` if it is still placed at `attempt`; `why` (an agent's reason, e.g. a launch that
        failed) goes into its event and its reason, where `job show` shows it."""
        if not _move(session, job, state, PLACED, attempt):
            return  # cancelled, ended or requeued meanwhile: that stands
        job.exit_code, job.finished_at = exit_code, utcnow()
        if why:
            job.reason = {"kind": "task_failed", "message": why, "details": []}
        session.add(JobEvent(job_id=job.id, kind=state, message=f"exit code {exit_code}" + (f"; {why}" if why else "")))
        self._stop_all(session, job, state, attempt)

    def _requeue(self, session: Session, job: Job, attempt: int, why: str) -> None:
        """Send the job back to pending if it is still placed at `attempt`; stop that attempt's other tasks."""
        if _move(session, job, "pending", PLACED, attempt):
            session.add(JobEvent(job_id=job.id, kind="requeued", message=why))
        self._stop_all(session, job, "requeued", attempt)

    def _end(self, session: Session, job: Job, ending: Ending, attempt: int | None = None) -> bool:
        """End a job that is not final yet (at `attempt`, None: at whichever) as `ending` says (compare-and-set),
        with an event at the moment it ended (taken under the job's lock), and stop every open allocation of it;
        False when it was final already (or moved on to another attempt)."""
        if not _move(session, job, ending.state, NOT_FINAL, attempt):
            return False
        job.finished_at = utcnow()
        if ending.reason is not None:
            job.reason = ending.reason
        session.add(JobEvent(job_id=job.id, at=job.finished_at, kind=ending.kind, message=ending.message))
        self._stop_all(session, job, ending.stop_reason)
        return True

    def _stop_all(self, session: Session, job: Job, reason: str, attempt: int | None = None) -> None:
        """Mark every open allocation of the job (of `attempt`, None: of any) stopping; their stop orders go out once
        the transaction commits."""
        query = select(Allocation).where(Allocation.job_id == job.id, Allocation.state.in_(OPEN_ALLOCATION_STATES))
        for allocation in session.scalars(query if attempt is None else query.where(Allocation.attempt == attempt)):
            if allocation.state != "stopping":
                allocation.state, allocation.release_reason = "stopping", reason
                stop = Stop(allocation_id=allocation.id, attempt=allocation.attempt, grace_s=self.grace_s,
                            reason=reason)
                after_commit(session, functools.partial(self.orders.send, allocation.node_id, stop))

    def cancel(self, session: Session, job: Job) -> None:
        """Cancel a job in any state that is not final (a compare-and-set on the state read: never over a state it did
        not see). Every open allocation of it, of a scheduled or running job, gets a stop order once the transaction
        commits; so does the scheduler's wake-up. A job final already is left as it is."""
        if self._end(session, job, Ending("cancelled", "cancelled", "cancelled by request", "cancelled")):
            after_commit(session, self.wake)

    def note_idle(self, allocation_id: str) -> None:
        """The first report that an allocation's GPUs sit idle: tell the job's owner (an event)."""
        with self.db.session() as session:
            allocation = session.get(Allocation, allocation_id)
            if allocation is not None:
                session.add(JobEvent(job_id=allocation.job_id, kind="idle",
                                     message=f"task {allocation.task_index}: its GPUs report no use"))

    def reclaim_if_idle(self, allocation_id: str, idle_s: float) -> bool:
        """Stop the job whose allocation has been idle past its queue's idle_reclaim_s; True if reclaimed."""
        with self.db.session() as session:
            allocation = session.get(Allocation, allocation_id)
            job = session.get(Job, allocation.job_id) if allocation is not None else None
            queue = find_queue(session, job.org_id, job.queue) if job is not None else None
            if job is None or queue is None or queue.idle_reclaim_s is None or idle_s < queue.idle_reclaim_s:
                return False
            self._end(session, job, Ending(
                "cancelled", "reclaimed", f"GPUs idle for {idle_s:.0f} s (queue {queue.name} reclaims after "
                                          f"{queue.idle_reclaim_s:.0f} s)", "idle",
                {"kind": "idle_reclaimed", "message": f"GPUs idle for {idle_s:.0f} s", "details": []}))
        self.wake()
        return True

    def node_rebooted(self, node_id: str, boot_id: str, reported: set[tuple[str, int]]) -> int:
        """A Hello from a boot of the node's agent other than the one on record (RELIABILITY.md T3.3): in one
        transaction, record the boot, and close every running or stopping allocation of the node that the new boot
        does not report (its workload ended with the old boot: the agent re-adopts whatever survived) with reason
        `node_rebooted`, billing ending at the node's last heartbeat (as for a lost node, I8), and requeue their
        jobs; no wait for the lost grace. Starting allocations are left to the reconcile, which sends their launch
        again. Returns allocations closed (0 for the boot on record: a reconnect, or a control plane restart)."""
        closed: list[str] = []
        with self.db.session() as session:
            node = session.get(Node, node_id)
            if node is None or node.boot_id == boot_id:
                return 0
            node.boot_id = boot_id
            last_seen = _utc(node.last_seen) if node.last_seen is not None else None
            for allocation in session.scalars(select(Allocation).where(
                    Allocation.node_id == node_id, Allocation.state.in_(("running", "stopping")))):
                if (allocation.id, allocation.attempt) in reported:
                    continue
                started = _utc(allocation.started_at) if allocation.started_at is not None else None
                at = max(last_seen, started) if last_seen is not None and started is not None else last_seen
                released_now(allocation, "node_rebooted", None, session, at)  # never before its confirmed start
                closed.append(allocation.id)
                job = session.get(Job, allocation.job_id)
                if job is not None and job.attempt == allocation.attempt and job.state in ("scheduled", "running"):
                    self._requeue(session, job, allocation.attempt,
                                  f"node rebooted: task {allocation.task_index} ended with it")
        for allocation_id in closed:  # after the commit, as in node_lost
            self.cache.release(allocation_id)
        if closed:
            self.wake()
        return len(closed)

    def node_lost(self, node_id: str, last_seen: float | None, epoch: int | None = None,
                  only: Collection[str] | None = None) -> int:
        """In one transaction: mark the node lost, release every open allocation of it and requeue its jobs;
        returns jobs requeued. With `epoch` (and a `fence`), the transaction is fenced: `Fenced` is raised and
        nothing changes when this process no longer leads (RELIABILITY.md I9). With `only`, just those allocations
        of the node are released (work whose own max_disconnect has passed on an unreachable node) and the node
        keeps its state.

        Billing of a lost attempt ends at the node's last heartbeat (I8): released_at is set to `last_seen` (Unix
        seconds, the control plane's clock) or, when None, to the last heartbeat any control plane recorded for it.
        """
        requeued, released = 0, []
        with self.db.session() as session:
            if epoch is not None and self.fence is not None:
                self.fence(session, epoch)
            node = session.get(Node, node_id)
            if node is not None:
                if only is None:
                    node.state = "lost"
                if last_seen is None and node.last_seen is not None:
                    last_seen = aware(node.last_seen).timestamp()
            chosen = select(Allocation).where(Allocation.node_id == node_id,
                                              Allocation.state.in_(OPEN_ALLOCATION_STATES))
            if only is not None:
                chosen = chosen.where(Allocation.id.in_(list(only)))
            why = "node lost" if only is None else "node unreachable past the job's max_disconnect"
            for allocation in session.scalars(chosen):
                released_now(allocation, "lost", None, session, _at(last_seen) if last_seen is not None else None)
                released.append(allocation.id)
                job = session.get(Job, allocation.job_id)
                if job is not None and job.attempt == allocation.attempt and job.state in ("scheduled", "running"):
                    self._requeue(session, job, allocation.attempt, why)
                    requeued += 1
        for allocation_id in released:  # after the commit: a refused transaction leaves the cache as it was
            self.cache.release(allocation_id)
        self.wake()
        return requeued

    def evict_node(self, node_id: str, why: str, epoch: int | None = None) -> list[str]:
        """Evict every job with a task starting or running on `node_id` (a drain's deadline, a forced remove): in
        one transaction, fenced by `epoch` like node_lost, each such job placed at that attempt gets an "evicted"
        event saying `why`, and every open task of the attempt, here or on other nodes of its gang, a stop order
        with the pool's kill grace once the transaction commits (reason "drained"). The job goes back to pending
        when its last task of the attempt has reported its exit (`_ended`), so that no two attempts ever run (or
        bill) at once; a node that never reports is declared lost, which requeues it too. Returns the jobs
        evicted, sorted."""
        evicted = []
        with self.db.session() as session:
            if epoch is not None and self.fence is not None:
                self.fence(session, epoch)
            rows = session.execute(select(Allocation.job_id, Allocation.attempt).where(
                Allocation.node_id == node_id, Allocation.state.in_(("starting", "running")))).all()
            for job_id, attempt in sorted(set(rows)):
                job = session.get(Job, job_id, with_for_update=True)
                if job is not None and job.attempt == attempt and job.state in PLACED:
                    session.add(JobEvent(job_id=job.id, kind="evicted", message=f"{why}; requeued once stopped"))
                    self._stop_all(session, job, "drained", attempt)
                    evicted.append(job.id)
        return evicted

    def enforce_limits(self, now: float) -> None:
        """End as failed every placed job whose current attempt has held its grant past the job's runtime limit,
        counted from when the attempt was scheduled (its allocations were made), not from its start: a job that
        never starts (an agent that cannot launch it) holds its GPUs no longer than one that runs."""
        placed_at = select(Allocation.job_id, func.min(Allocation.created_at).label("at")).join(
            Job, Job.id == Allocation.job_id).where(Job.state.in_(PLACED), Allocation.attempt == Job.attempt).group_by(
            Allocation.job_id).subquery()
        with self.db.session() as session:
            rows = list(session.execute(select(Job, placed_at.c.at).join(placed_at, placed_at.c.job_id == Job.id)))
            for job, at in rows:
                limit = job.spec.get("runtime_limit_s")
                if limit and now - aware(at).timestamp() > limit:
                    self._end(session, job, Ending(
                        "failed", "timed_out", f"runtime limit {limit} s", "runtime limit",
                        {"kind": "runtime_limit", "message": f"ran past its {limit} s limit", "details": []}),
                        job.attempt)  # the attempt whose time ran out, not one placed since


def _move(session: Session, job: Job, to: str, allowed: Collection[str], attempt: int | None = None) -> bool:
    """Compare-and-set: move `job` to state `to` if its state is one of `allowed` at `attempt` (None: at whichever),
    as read and as it is in the database when written (`UPDATE ... WHERE state = <read> AND attempt = <read>`); then
    reload it, under the lock the UPDATE took. When the row changed since it was read, read it again under a lock
    (PostgreSQL's row lock; on SQLite the missed UPDATE already holds the write lock) and try once more: nothing can
    move it then. True if the job moved. The job must have no unflushed changes (the reload drops them)."""
    def fits() -> bool:
        return job.state in allowed and attempt in (None, job.attempt)

    if fits() and _job_moved(session, job, to):
        return True
    if job.state in TERMINAL:
        return False  # final states never change: no need to look again
    session.refresh(job, with_for_update=True)
    return fits() and _job_moved(session, job, to)


def _job_moved(session: Session, job: Job, to: str) -> bool:
    jobs = Job.__table__
    result = session.execute(jobs.update().where(jobs.c.id == job.id, jobs.c.state == job.state,
                                                 jobs.c.attempt == job.attempt).values(state=to))
    if result.rowcount != 1:
        return False
    session.refresh(job)
    return True


def _allocation_moved(session: Session, allocation: Allocation, old: str, new: str) -> bool:
    """Compare-and-set an allocation's state from `old` to `new`; reloads it either way (the UPDATE holds the write
    lock on SQLite, the row lock on PostgreSQL: what it reads is current)."""
    table = Allocation.__table__
    result = session.execute(table.update().where(table.c.id == allocation.id, table.c.state == old).values(state=new))
    session.refresh(allocation)
    return result.rowcount == 1


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run `action` once `session`'s transaction has committed, never if it rolls back: an order or a wake-up must
    not announce a change the database may still refuse (the session is discarded with its transaction)."""
    event.listen(session, "after_commit", lambda _: action(), once=True)


def _stale(allocation: Allocation, status: TaskStatus) -> str | None:
    """Why `status` may not change `allocation` (see Lifecycle.on_status), or None."""
    if allocation.attempt != status.attempt:
        return f"stale attempt: allocation {allocation.id} is attempt {allocation.attempt}, not {status.attempt}"
    if allocation.released_at is not None:
        return f"stale attempt: allocation {allocation.id} was released ({allocation.release_reason})"
    return None


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _at(epoch_s: float):  # noqa: ANN202 - a datetime
    from datetime import UTC, datetime
    return datetime.fromtimestamp(epoch_s, UTC)


def now_s() -> float:
    return time.time()
