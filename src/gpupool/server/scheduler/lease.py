"""One active scheduler, and fencing of every scheduler write (RELIABILITY.md §2.1 I9, T5).

On SQLite: an exclusive file lock next to the database (one process per data directory). On PostgreSQL
(active/passive): a lease row with a fencing epoch that grows at every takeover, client-go style:

* the leader holds the row for `lease_s` (measured on the database's clock, so two hosts never compare
  their own clocks) and renews it at most every `retry_s`; a process that is not the leader tries to
  take the row over every `retry_s` once it has expired;
* the leader counts itself deposed when it could not renew for `renew_s` (< `lease_s`), on its monotonic
  clock, so a paused leader (SIGSTOP, a long GC) knows it may have lost the lease the moment it resumes;
* that local belief is only a shortcut: every scheduler write calls `fence(session, epoch)` first in its
  own transaction. It locks the lease row (FOR SHARE) until the transaction ends, so a takeover cannot
  commit in between, and refuses the write (`Fenced`) unless the row still carries the writer's epoch.
  A deposed leader gets no write accepted, however late it wakes up.

Every lease and fenced transaction on PostgreSQL sets `idle_in_transaction_session_timeout` to `lease_s`:
a leader paused inside a transaction holds the row lock, and the database ends its session (rolling the
transaction back) so that the other process can take over. That timeout covers a session waiting for its
next statement only; a leader paused in the middle of one (halfway through a pipelined batch, or blocked on a
lock) keeps the row locked. So a takeover waits for the row at most `CUT_OFF_LEASES` x `lease_s`
(`lock_timeout`); then, if the lease has expired on the database's clock, it ends the sessions that hold the
lease table locked (`pg_terminate_backend`: their transactions roll back) and tries again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

from psycopg.errors import LockNotAvailable
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpupool.server.db.engine import Database
from gpupool.server.db.models import Lease

LEASE_NAME = "scheduler"
#: how many lease durations a takeover waits for the lease row before it cuts off an expired holder's sessions
CUT_OFF_LEASES = 2

log = logging.getLogger(__name__)


class Fenced(RuntimeError):
    """A scheduler write refused: the lease row no longer carries the writer's epoch (a deposed leader)."""


class SchedulerLease:
    """See the module docstring. `hold()` is called by the scheduler thread only; `is_leader()`, `epoch` and
    `fence()` from any thread. `refused` counts fenced writes refused in this process; `on_refused` (if set) is
    called once per refusal (a metric). `may_lead` (if set) is asked before every takeover attempt and returns why
    this process must not lead (its keys are not the pool's: gpupool.server.pool_keys), or None; the answer is kept
    in `refusal` (shown by /readyz)."""

    def __init__(self, db: Database, data_dir: Path, holder: str, lease_s: float = 15.0, renew_s: float = 10.0,
                 retry_s: float = 2.0) -> None:
        self.db, self.holder = db, holder
        self.lease_s, self.renew_s, self.retry_s = lease_s, renew_s, retry_s
        self.epoch = 0
        self.refused = 0
        self.on_refused: Callable[[], None] | None = None
        self.may_lead: Callable[[], str | None] | None = None
        self.refusal: str | None = None
        self._renewed_at = float("-inf")  # monotonic start of the latest successful take-over or renewal
        self._tried_at = float("-inf")  # monotonic start of the latest attempt
        self._file: IO[str] | None = None
        self._lock_path = data_dir / "scheduler.lock"
        self.sqlite = db.url.startswith("sqlite")

    def hold(self) -> bool:
        """Acquire or renew (against the database at most every `retry_s`); True while this process leads.
        Raises the database's error when it cannot be reached (leadership then lapses after `renew_s`)."""
        if self.sqlite:
            return self._file is not None or (self._allowed() and self._file_lock())
        started = time.monotonic()
        if self.is_leader() and started - self._renewed_at < self.retry_s:
            return True
        if not self.is_leader() and started - self._tried_at < self.retry_s:
            return False
        self._tried_at = started
        if not self.is_leader() and not self._allowed():
            return False
        try:
            taken = self._row_lease()
        except OperationalError as exc:
            if not isinstance(exc.orig, LockNotAvailable):
                raise
            self._cut_off_expired_holder()
            taken = False
        if taken:
            self._renewed_at = started
            return True
        self._renewed_at = float("-inf")
        return False

    def _allowed(self) -> bool:
        """Ask `may_lead` (before a takeover); log a new refusal once."""
        refusal = self.may_lead() if self.may_lead is not None else None
        if refusal and refusal != self.refusal:
            log.error("%s", refusal)
        self.refusal = refusal
        return refusal is None

    def is_leader(self) -> bool:
        """Whether this process believes it leads: it holds the file lock (SQLite), or renewed the lease row
        less than `renew_s` ago (PostgreSQL). Writes must still pass `fence`."""
        if self.sqlite:
            return self._file is not None
        return time.monotonic() - self._renewed_at < self.renew_s

    def fence(self, session: Session, epoch: int) -> None:
        """Call first in a scheduler write's transaction: hold the lease row against a takeover until the
        transaction ends; raise `Fenced` (the caller's transaction rolls back) unless the row carries `epoch`."""
        self._bound(session)
        current = session.scalar(select(Lease.epoch).where(Lease.name == LEASE_NAME).with_for_update(read=True))
        if current == epoch:
            return
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused()
        log.warning("fenced write refused: this process writes with epoch %d, the lease is at epoch %s", epoch,
                    current)
        raise Fenced(f"epoch {epoch} is not the lease's epoch {current}")

    def _bound(self, session: Session) -> None:
        """PostgreSQL: end this transaction's session if it stays idle for `lease_s` (a paused process)."""
        if not self.sqlite:
            session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {max(1, int(self.lease_s * 1000))}"))

    def _file_lock(self) -> bool:
        if self._file is not None:
            return True
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self._lock_path, "a+")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._file = handle
        self.epoch = self._bump_epoch()
        return True

    def _bump_epoch(self) -> int:
        with self.db.session() as session:
            row = session.get(Lease, LEASE_NAME, with_for_update=True)
            far = datetime.now(UTC) + timedelta(days=3650)
            if row is None:
                row = Lease(name=LEASE_NAME, holder=self.holder, epoch=1, expires_at=far)
                session.add(row)
            else:
                row.holder, row.epoch, row.expires_at = self.holder, row.epoch + 1, far
            return row.epoch

    def _row_lease(self) -> bool:
        """One acquire-or-renew transaction on the lease row, timed by the database's clock; raises the driver's
        LockNotAvailable (in OperationalError) after waiting `CUT_OFF_LEASES` x `lease_s` for the row."""
        with self.db.session() as session:
            self._bound(session)
            session.execute(text(f"SET LOCAL lock_timeout = {max(1, int(CUT_OFF_LEASES * self.lease_s * 1000))}"))
            now = session.scalar(select(func.now()))
            row = session.scalar(select(Lease).where(Lease.name == LEASE_NAME).with_for_update())
            until = now + timedelta(seconds=self.lease_s)
            if row is None:
                session.add(Lease(name=LEASE_NAME, holder=self.holder, epoch=1, expires_at=until))
                self.epoch = 1
                return True
            expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
            if row.holder != self.holder and expires > now:
                return False
            if row.holder != self.holder or row.epoch != self.epoch:
                row.holder, row.epoch = self.holder, row.epoch + 1
                log.warning("scheduler lease taken over by %s: epoch %d", self.holder, row.epoch)
            row.expires_at = until
            self.epoch = row.epoch
            return True

    def _cut_off_expired_holder(self) -> None:
        """The lease row stayed locked past the lock timeout: if the lease has expired, end every other session
        that holds the lease table locked (FOR SHARE or FOR UPDATE: a deposed leader's fenced transaction)."""
        with self.db.session() as session:
            row = session.execute(select(Lease.holder, Lease.expires_at, func.now()).where(
                Lease.name == LEASE_NAME)).first()
            if row is None or row.holder == self.holder:
                return
            expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
            if expires > row[2]:
                return
            ended = session.scalars(text(  # materialised first: SQL does not order a WHERE clause's conditions
                "WITH holders AS MATERIALIZED (SELECT DISTINCT pid FROM pg_locks WHERE relation = 'leases'::regclass "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND mode = 'RowShareLock' AND granted AND pid <> pg_backend_pid()) "
                "SELECT pid FROM holders WHERE pg_terminate_backend(pid)")).all()
        log.warning("scheduler lease: the expired holder %s kept the lease row locked; ended its session(s) %s",
                    row.holder, ended)

    def release(self) -> None:
        """Give the lease up (process shutdown): the file lock, or the row's remaining time."""
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if not self.sqlite and self.is_leader():
            self._renewed_at = float("-inf")
            try:
                with self.db.session() as session:
                    session.execute(Lease.__table__.update().where(
                        Lease.name == LEASE_NAME, Lease.holder == self.holder, Lease.epoch == self.epoch).values(
                        expires_at=func.now()))
            except Exception as exc:  # shutting down: the lease then simply expires
                log.warning("could not release the scheduler lease: %s", exc)


def holder_id() -> str:
    """This process's name in the lease row: host, pid and a random tag (two containers may share both)."""
    return f"{os.uname().nodename[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
