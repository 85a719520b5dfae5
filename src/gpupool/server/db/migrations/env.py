"""Alembic environment: runs migrations for gpupool's metadata on the URL the caller configured.

All pending migrations run in ONE transaction, DDL included (gpupool.server.db.migrating relies on it). PostgreSQL
has transactional DDL; on SQLite, pysqlite would autocommit each DDL statement, so its own transaction handling is
switched off and SQLAlchemy's `begin` emits `BEGIN IMMEDIATE` instead (SQLite itself rolls DDL back). After each
step the failpoint `migrate.mid_migration` is reached, unless the caller marked the run as a scratch probe. A caller
may hand over an open connection in `config.attributes["connection"]`.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Engine, engine_from_config, event, pool

from gpupool.server.db.models import Base
from gpupool.server.failpoints import failpoint

config = context.config
target_metadata = Base.metadata


def _sqlite_transactional_ddl(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _no_pysqlite_transactions(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _after_step(**_: Any) -> None:
    if not config.attributes.get("scratch"):
        failpoint("migrate.mid_migration")


def _migrate(connection: Any) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                      transactional_ddl=True, transaction_per_migration=False, on_version_apply=_after_step)
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _migrate(given)
        return
    engine = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    if engine.dialect.name == "sqlite":
        _sqlite_transactional_ddl(engine)
    with engine.connect() as connection:
        _migrate(connection)


run()
