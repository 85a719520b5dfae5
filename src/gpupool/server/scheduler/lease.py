"""One active scheduler. On SQLite: an exclusive file lock next to the database (one process per data
directory). On PostgreSQL: a lease row with a fencing epoch that grows at every takeover; writes carry
the epoch, so a deposed leader's late writes are recognisable."""

from __future__ import annotations

import fcntl
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

from sqlalchemy import select

from gpupool.server.db.engine import Database
from gpupool.server.db.models import Lease

LEASE_NAME = "scheduler"


class SchedulerLease:
    def __init__(self, db: Database, data_dir: Path, holder: str, lease_s: float = 15.0) -> None:
        self.db, self.holder, self.lease_s = db, holder, lease_s
        self.epoch = 0
        self._file: IO[str] | None = None
        self._lock_path = data_dir / "scheduler.lock"
        self.sqlite = db.url.startswith("sqlite")

    def hold(self) -> bool:
        """Acquire or renew; True while this process is the scheduler."""
        if self.sqlite:
            return self._file_lock()
        return self._row_lease()

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
        now = datetime.now(UTC)
        with self.db.session() as session:
            row = session.scalar(select(Lease).where(Lease.name == LEASE_NAME).with_for_update())
            if row is None:
                session.add(Lease(name=LEASE_NAME, holder=self.holder, epoch=1,
                                  expires_at=now + timedelta(seconds=self.lease_s)))
                self.epoch = 1
                return True
            expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
            if row.holder != self.holder and expires > now:
                return False
            if row.holder != self.holder:
                row.holder, row.epoch = self.holder, row.epoch + 1
            row.expires_at = now + timedelta(seconds=self.lease_s)
            self.epoch = row.epoch
            return True

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def holder_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"
