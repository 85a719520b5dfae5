"""Alembic environment: runs migrations for gpupool's metadata on the URL the caller configured."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from gpupool.server.db.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    engine = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
