"""Engines and sessions. SQLite runs in WAL mode with synchronous=FULL (an acknowledged write survives a
crash), foreign keys on and a busy timeout; PostgreSQL keeps its durable defaults."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def _sqlite_pragmas(dbapi_connection: Any, _: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON", "busy_timeout=10000"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def migrate(url: str) -> None:
    """Bring the database at `url` to the latest schema, all or nothing; raises migrating.SchemaMismatch on a
    half-applied schema (see gpupool.server.db.migrating)."""
    from gpupool.server.db import migrating  # imports engine: loaded on first use

    migrating.upgrade(url)


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the database cannot be reached or used right now (connection refused or lost, server
    shutting down, SQLite locked or failing I/O), as opposed to a refused statement (a constraint, bad data)."""
    return isinstance(exc, OperationalError | InterfaceError | PoolTimeout) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated)


class Database:
    """Engine and sessions for one URL. `unreachable_at` is the monotonic time of the latest failure that
    `unreachable()` recognises (-inf: none yet); the liveness guard reads it (RELIABILITY.md §2.2)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.unreachable_at = float("-inf")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any exception."""
        try:
            with self._sessions() as session, session.begin():
                yield session
        except Exception as exc:
            if unreachable(exc):
                self.unreachable_at = time.monotonic()
            raise
