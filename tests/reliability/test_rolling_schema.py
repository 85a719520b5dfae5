"""A rolling upgrade's first step holds: every schema migration only adds, so a control plane of the previous
version keeps working on a database that an upgraded standby has migrated (docs/operating/high-availability.md,
"Upgrades", step 1).

On a real PostgreSQL each migration is applied one step at a time, and the schema before and after is compared:
no table or column the previous revision had goes away, none becomes NOT NULL, every column added to an existing
table is nullable or has a server default (the previous version's INSERTs do not name it), and no new unique,
foreign-key or check constraint covers only columns the previous version writes (its writes could break it).
Tables a migration creates are free: the previous version never reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from gpupool.devtools.harness import Postgres, free_port
from gpupool.server.db import migrating

pytestmark = pytest.mark.slow

#: the first migration released under the rolling-upgrade rule: 0009 (tenancy) put new unique constraints on
#: existing columns, before a pool could run several control planes (it was applied by a single server's restart)
ROLLING_SINCE = "0010"


@dataclass(frozen=True)
class Column:
    nullable: bool
    has_default: bool


@dataclass(frozen=True)
class Table:
    columns: dict[str, Column]
    #: (kind, columns) of every unique, foreign-key and check constraint (unique indexes count as unique)
    constraints: frozenset[tuple[str, frozenset[str]]] = frozenset()


Schema = dict[str, Table]


def _schema(url: str) -> Schema:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            inspector = inspect(connection)
            return {table: _table_of(inspector, table) for table in inspector.get_table_names()
                    if table != migrating.VERSION_TABLE}
    finally:
        engine.dispose()


def _table_of(inspector: Any, table: str) -> Table:
    columns = {c["name"]: Column(bool(c["nullable"]), c.get("default") is not None)
               for c in inspector.get_columns(table)}
    unique = [("unique", u["column_names"]) for u in inspector.get_unique_constraints(table)]
    unique += [("unique", i["column_names"]) for i in inspector.get_indexes(table) if i["unique"]]
    foreign = [("foreign key", f["constrained_columns"]) for f in inspector.get_foreign_keys(table)]
    # a check's columns are not reported: it counts as covering every column the table has
    checks = [("check", list(columns)) for _ in inspector.get_check_constraints(table)]
    return Table(columns, frozenset((kind, frozenset(names)) for kind, names in [*unique, *foreign, *checks]))


def breaks_older_code(before: Schema, after: Schema) -> list[str]:
    """What in `after` a control plane that knows only `before` could trip on."""
    out = [f"table {t} removed" for t in sorted(set(before) - set(after))]
    for table in sorted(set(before) & set(after)):
        old, new = before[table].columns, after[table].columns
        out += [f"column {table}.{c} removed" for c in sorted(set(old) - set(new))]
        out += [f"column {table}.{c} became NOT NULL" for c in sorted(set(old) & set(new))
                if old[c].nullable and not new[c].nullable]
        out += [f"column {table}.{c} added NOT NULL without a server default" for c in sorted(set(new) - set(old))
                if not new[c].nullable and not new[c].has_default]
        out += [f"{kind} constraint on {table}({', '.join(sorted(names))}) added" for kind, names in
                sorted(after[table].constraints - before[table].constraints, key=lambda c: (c[0], sorted(c[1])))
                if names <= set(old)]
    return out


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(migrating.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def test_every_migration_since_the_rolling_rule_only_adds(postgres: Postgres) -> None:
    url = postgres.create_database(f"rolling_{os.getpid()}_{free_port()}")
    config = migrating.alembic_config(url)
    revisions = _revisions()
    first = revisions.index(ROLLING_SINCE)
    command.upgrade(config, revisions[first - 1])
    before = _schema(url)
    checked: dict[str, list[str]] = {}
    for revision in revisions[first:]:
        command.upgrade(config, revision)
        after = _schema(url)
        checked[revision] = breaks_older_code(before, after)
        before = after
    assert len(checked) >= 6  # 0010 to 0015 at least
    assert checked == {revision: [] for revision in checked}


# units: the comparison itself catches each way a migration breaks the previous version -----------------------

def _table(*constraints: tuple[str, frozenset[str]], **columns: Any) -> Table:
    return Table({name: Column(*flags) for name, flags in columns.items()}, frozenset(constraints))


OLD: Schema = {"jobs": _table(id=(False, False), note=(True, False))}
NOTE, EXTRA = frozenset({"note"}), frozenset({"note", "extra"})


@pytest.mark.parametrize(("after", "found"), [
    ({"jobs": _table(id=(False, False), note=(True, False)), "new_table": _table(id=(False, False))}, []),
    ({"jobs": _table(id=(False, False), note=(True, False), extra=(True, False))}, []),
    ({"jobs": _table(id=(False, False), note=(True, False), flag=(False, True))}, []),
    ({"jobs": _table(id=(False, False), note=(True, False), flag=(False, False))},
     ["column jobs.flag added NOT NULL without a server default"]),
    ({"jobs": _table(id=(False, False))}, ["column jobs.note removed"]),
    ({"jobs": _table(id=(False, False), note=(False, True))}, ["column jobs.note became NOT NULL"]),
    ({}, ["table jobs removed"]),
    ({"jobs": _table(("unique", NOTE), id=(False, False), note=(True, False))},
     ["unique constraint on jobs(note) added"]),
    ({"jobs": _table(("unique", EXTRA), id=(False, False), note=(True, False), extra=(True, False))}, []),
])
def test_breaks_older_code_names_each_break(after: Schema, found: list[str]) -> None:
    assert breaks_older_code(OLD, after) == found
