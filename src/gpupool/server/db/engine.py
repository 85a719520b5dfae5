"""Engines and sessions. SQLite runs in WAL mode with synchronous=FULL (an acknowledged write survives a
crash), foreign keys on and a busy timeout; PostgreSQL keeps its durable defaults."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def _sqlite_pragmas(dbapi_connection: Any, _: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON", "busy_timeout=10000"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


#: A pooled PostgreSQL connection idle for longer than this is pinged before it is handed out (a restarted or
#: failed-over server leaves dead connections in the pool). One used more recently is not: a ping on every checkout
#: cost a round trip per transaction, and a connection that broke since is found by its first statement, whose
#: failure (503, RELIABILITY.md §2.2) discards every connection made before it.
PING_IDLE_S = 1.0


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(url, pool_size=10, max_overflow=20)
    event.listen(engine.pool, "checkin", _checked_in)
    event.listen(engine.pool, "checkout", functools.partial(_ping_if_idle, engine.dialect))
    return engine


def _checked_in(_: Any, record: Any) -> None:
    if record is not None:
        record.info["checked_in"] = time.monotonic()


def _ping_if_idle(dialect: Any, dbapi_connection: Any, record: Any, _: Any) -> None:
    """Pool `checkout` hook: ping a connection idle for over PING_IDLE_S; a dead one is replaced (DisconnectionError
    makes the pool connect again)."""
    if time.monotonic() - record.info.get("checked_in", float("inf")) <= PING_IDLE_S:
        return
    try:
        dialect.do_ping(dbapi_connection)
    except Exception as exc:
        raise DisconnectionError(f"pooled connection is dead: {exc}") from exc


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


def failure(exc: BaseException, url: str) -> str:
    """One line for a person: which database could not be used (password hidden), the driver's own first line, and
    what to check (for PostgreSQL: the user, password, host, port and database name of the URL)."""
    shown = make_url(url).render_as_string(hide_password=True)
    cause = getattr(exc, "orig", None) or exc
    first = next((part.strip() for part in str(cause).splitlines() if part.strip()), type(cause).__name__)
    first = first.removeprefix("(psycopg.OperationalError) ")
    check = ("check the URL's user, password, host, port and database name (--database-url or "
             "GPUPOOL_DATABASE_URL), and that PostgreSQL runs there") if shown.startswith("postgresql") else (
        "check that the data dir exists and is writable by this user")
    return f"cannot use the database {shown}: {first}; {check}"


def debug() -> bool:
    """Whether the user asked for tracebacks (`gpupool --debug` sets GPUPOOL_DEBUG=1 for the processes it starts)."""
    return bool(os.environ.get("GPUPOOL_DEBUG"))


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
