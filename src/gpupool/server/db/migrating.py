"""Schema upgrades that are all or nothing, and a refusal to run on a half-applied schema (RELIABILITY.md T10).

`upgrade(url)`, run at every control-plane start, in order:

1. read the revision recorded in `alembic_version` (None on a fresh database);
2. verify that the tables and columns present are exactly those that revision defines; otherwise raise
   `SchemaMismatch`, whose message names what is missing or ahead and how to recover (the control plane
   refuses to start);
3. SQLite, when an upgrade is due on a database that has a revision: copy the file first, consistently (the
   SQLite backup API), to `<db>.pre-<revision>.bak` (kept; a later upgrade from the same revision overwrites it);
4. run every pending migration in ONE transaction, DDL included: PostgreSQL's DDL is transactional, and on SQLite
   migrations/env.py makes pysqlite emit BEGIN itself (pysqlite otherwise autocommits DDL) and tells Alembic the
   DDL is transactional. A crash anywhere inside (failpoint `migrate.mid_migration` fires after each step) leaves
   the database at the old revision with the old schema;
5. verify the result against the head revision, as in 2.

What a revision "defines" is learnt by running the migrations up to it on a scratch in-memory SQLite database
and reading back its tables and columns (cached per revision), so the check follows the migrations themselves,
not the ORM models.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, pool
from sqlalchemy.engine import make_url

from gpupool.server.db.engine import MIGRATIONS

Schema = Mapping[str, frozenset[str]]
VERSION_TABLE = "alembic_version"
BATCH_LEFTOVER = "_alembic_tmp_"


class SchemaMismatch(RuntimeError):
    """The database's tables and columns are not those of its recorded revision: a half-applied migration (or a
    hand-edited schema). The control plane must not start on it."""


def alembic_config(url: str, connection: Connection | None = None, scratch: bool = False) -> Config:
    """Alembic's config for gpupool's migrations on `url`; `connection` makes env.py use it as it is, and
    `scratch` keeps the migration failpoint quiet (the schema probes of this module)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes.update(connection=connection, scratch=scratch)
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "no migrations"
    return head


@contextmanager
def _connect(url: str) -> Iterator[Connection]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def current_revision(url: str) -> str | None:
    with _connect(url) as connection:
        return MigrationContext.configure(connection).get_current_revision()


def read_schema(connection: Connection) -> dict[str, frozenset[str]]:
    """{table: column names} of what `connection` sees, without Alembic's version table."""
    inspector = inspect(connection)
    return {table: frozenset(c["name"] for c in inspector.get_columns(table))
            for table in inspector.get_table_names() if table != VERSION_TABLE}


@lru_cache(maxsize=16)
def expected_schema(revision: str | None) -> Schema:
    """The tables and columns that the migrations up to `revision` create (None: none at all)."""
    if revision is None:
        return {}
    engine = create_engine("sqlite://", poolclass=pool.StaticPool)
    with engine.connect() as connection:
        command.upgrade(alembic_config("sqlite://", connection, scratch=True), revision)
        connection.commit()
        return read_schema(connection)


def differences(actual: Schema, expected: Schema, head: Schema) -> list[str]:
    """What makes `actual` not the schema `expected`: missing tables or columns, tables or columns of a later
    revision (in `head` but not in `expected`), and Alembic batch-mode leftovers."""
    out = [f"table {t} is missing" for t in sorted(set(expected) - set(actual))]
    for table in sorted(set(expected) & set(actual)):
        out += [f"column {table}.{c} is missing" for c in sorted(expected[table] - actual[table])]
        out += [f"column {table}.{c} of a later revision is present" for c in
                sorted((actual[table] - expected[table]) & head.get(table, frozenset()))]
    out += [f"table {t} of a later revision is present" for t in sorted(set(actual) - set(expected)) if t in head]
    out += [f"table {t} is left over from an interrupted migration" for t in sorted(actual)
            if t.startswith(BATCH_LEFTOVER)]
    return out


def verify(url: str, revision: str | None) -> None:
    """Raise SchemaMismatch unless the schema at `url` is exactly what `revision` defines."""
    with _connect(url) as connection:
        actual = read_schema(connection)
    problems = differences(actual, expected_schema(revision), expected_schema(head_revision()))
    if problems:
        raise SchemaMismatch(_refusal(url, revision, problems))


def _refusal(url: str, revision: str | None, problems: list[str]) -> str:
    backup = backup_path(url, revision)
    restore = (f"restore the copy taken before the last upgrade ({backup}) over the database file" if backup
               and backup.exists() else "restore the database from a backup")
    return (f"refusing to start: the database schema is half-applied. Its recorded revision is "
            f"{revision or '(none)'}, but {'; '.join(problems[:8])}{' ...' if len(problems) > 8 else ''}. "
            f"A migration was interrupted outside a transaction or the schema was edited by hand; {restore}, "
            f"then start the control plane again.")


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (None for PostgreSQL or an in-memory database)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def backup_path(url: str, revision: str | None) -> Path | None:
    path = sqlite_file(url)
    return path.with_name(f"{path.name}.pre-{revision}.bak") if path is not None and revision else None


def backup_sqlite(url: str, revision: str) -> Path | None:
    """Copy the SQLite database consistently next to itself (written aside, then renamed); None if not SQLite."""
    target = backup_path(url, revision)
    source = sqlite_file(url)
    if target is None or source is None:
        return None
    partial = target.with_name(target.name + ".partial")
    src, dst = sqlite3.connect(source), sqlite3.connect(partial)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    partial.replace(target)
    return target


def upgrade(url: str) -> None:
    """Bring the database at `url` to the head revision, all or nothing (see the module docstring)."""
    revision, head = current_revision(url), head_revision()
    known = {script.revision for script in ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions()}
    if revision is not None and revision not in known:
        raise SchemaMismatch(f"the database is at schema revision {revision}, which this gpupool does not know (its "
                             f"newest is {head}): a newer gpupool migrated it; upgrade this one to that version")
    verify(url, revision)
    if revision == head:
        return
    if revision is not None:
        backup_sqlite(url, revision)
    command.upgrade(alembic_config(url), "head")
    verify(url, head)
