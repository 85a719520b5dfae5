"""T10 (RELIABILITY.md §3.1): schema upgrades killed mid-way, and a control plane that refuses a half-applied
schema; on SQLite and on PostgreSQL.

1. fresh database: the control plane is killed (failpoint `migrate.mid_migration=crash@K`, kill -9 after the K-th
   Alembic step, inside the migration's transaction); the database must be fully old (no tables), and the next
   start migrates it fully;
2. populated database at revision 0001 (made by a real control plane and the API, then downgraded): the same
   kill; it must still be at 0001 with every row, with (SQLite) a backup copy beside it; the next start upgrades
   it and the API still shows every job;
3. half-applied schemas made by hand (a later revision's table present, a table missing at head, an Alembic
   batch leftover): the control plane refuses to start, with a message that says so, and changes nothing.

PR tier: one kill point per case (fresh: the first step; populated: the last, when every statement has run and
only the commit is missing). GPUPOOL_SOAK=1: every step.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, pool, text

from gpupool.devtools.figures import figure, soak
from gpupool.devtools.harness import (
    Postgres,
    free_port,
    server_log,
    spawn_server,
    start_server,
    stop_server,
    wait_ready,
)
from gpupool.server.db import migrating
from gpupool.server.db.migrating import SchemaMismatch, differences, expected_schema, read_schema, verify

pytestmark = pytest.mark.slow
FIRST = "0001"


def revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory.from_config(migrating.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


@dataclass
class Tally:
    migrations: int = 0
    killed_mid: int = 0
    partial: list[str] = field(default_factory=list)
    refusals: int = 0
    refusal_cases: int = 0


# one database per case -----------------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    new_url: Callable[[str], str]


def sqlite_backend(root: Path) -> Backend:
    def new(tag: str) -> str:
        (root / tag).mkdir(parents=True)
        return f"sqlite:///{root / tag / 'cp' / 'gpupool.db'}"
    return Backend("sqlite", new)


def pg_backend(pg: Postgres) -> Backend:
    return Backend("pg", lambda tag: pg.create_database(f"t10_{tag}_{os.getpid()}_{free_port()}"))


def data_dir(root: Path, url: str, tag: str) -> Path:
    path = migrating.sqlite_file(url)
    return path.parent if path is not None else root / tag / "cp"


def database_arg(url: str) -> str | None:
    return None if url.startswith("sqlite") else url


def run_until_exit(data: Path, url: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str]:
    """Start a control plane that is expected to die during start-up; its exit status and log."""
    port = free_port()
    process = spawn_server(data, port, database_arg(url), env)
    try:
        status = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"the control plane did not die: {server_log(data, port).read_text()[-2000:]}") from None
    return status, server_log(data, port).read_text(errors="replace")


def start_normally(data: Path, url: str) -> None:
    """A control plane starts on `url` and becomes ready (migrating what is due), then stops."""
    port = free_port()
    process = spawn_server(data, port, database_arg(url))
    try:
        wait_ready(f"http://127.0.0.1:{port}", process, server_log(data, port))
    finally:
        process.terminate()
        process.wait(timeout=30)


def row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return {t: int(connection.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one())
                    for t in sorted(set(read_schema(connection)) | {"alembic_version"})
                    if t in inspect(connection).get_table_names()}
    finally:
        engine.dispose()


def schema_state(url: str) -> str:
    """"old:REV" / "new:REV" when the schema is exactly what its recorded revision defines, else "partial: ..."."""
    revision = migrating.current_revision(url)
    try:
        verify(url, revision)
    except SchemaMismatch as exc:
        return f"partial: {exc}"
    return f"{'new' if revision == revisions()[-1] else 'old'}:{revision}"


# the cases -----------------------------------------------------------------------------------------------------


def kill_points(steps: int, pr_choice: int) -> list[int]:
    return list(range(1, steps + 1)) if soak() else [pr_choice]


def fresh_case(root: Path, backend: Backend, tally: Tally) -> None:
    steps = len(revisions())
    for k in kill_points(steps, 1):
        url = backend.new_url(f"fresh{k}")
        data = data_dir(root, url, f"fresh{k}")
        status, log = run_until_exit(data, url, {"GPUPOOL_FAILPOINTS": f"migrate.mid_migration=crash@{k}"})
        assert status == -9 and "failpoint migrate.mid_migration: crash" in log, (status, log[-2000:])
        tally.killed_mid += 1
        state = schema_state(url)
        if state != "old:None" or row_counts(url).get("alembic_version", 0):
            tally.partial.append(f"{backend.name} fresh killed after step {k}: {state}")
        start_normally(data, url)
        tally.migrations += 1
        assert schema_state(url) == f"new:{revisions()[-1]}"


def populated_at_first(root: Path, url: str, tag: str) -> tuple[Path, int]:
    """A database made and filled by a real control plane through the API, then downgraded to revision 0001."""
    data = data_dir(root, url, tag)
    server = start_server(data, database_arg(url))
    try:
        with server.client() as api:
            for i in range(25):
                body = {"command": ["true"], "gpus": "1", "cpus": "0.1", "memory_mib": 64, "name": f"job{i}"}
                assert api.post("/jobs", json=body, headers={"Idempotency-Key": f"k{i}"}).status_code == 201
            jobs = len(api.get("/jobs", params={"limit": 500}).json()["items"])
    finally:
        stop_server(server)
    command.downgrade(migrating.alembic_config(url), FIRST)
    assert schema_state(url) == f"old:{FIRST}"
    return data, jobs


def populated_case(root: Path, backend: Backend, tally: Tally) -> None:
    steps = len(revisions()) - 1
    for k in kill_points(steps, steps):
        url = backend.new_url(f"populated{k}")
        data, jobs = populated_at_first(root, url, f"populated{k}")
        before = row_counts(url)
        status, log = run_until_exit(data, url, {"GPUPOOL_FAILPOINTS": f"migrate.mid_migration=crash@{k}"})
        assert status == -9 and "failpoint migrate.mid_migration: crash" in log, (status, log[-2000:])
        tally.killed_mid += 1
        state, after = schema_state(url), row_counts(url)
        if state != f"old:{FIRST}" or after != before:
            tally.partial.append(f"{backend.name} populated killed after step {k}: {state}; rows {before} -> {after}")
        if backend.name == "sqlite":
            backup = migrating.backup_path(url, FIRST)
            assert backup is not None and backup.exists(), "no backup copy was taken before the upgrade"
        start_normally(data, url)
        tally.migrations += 1
        assert schema_state(url) == f"new:{revisions()[-1]}"
        assert row_counts(url)["jobs"] == jobs == before["jobs"]


HALF_APPLIED = {
    "later-table-present": (FIRST, "CREATE TABLE prices (model VARCHAR(64) PRIMARY KEY, cents_per_gpu_hour INTEGER)",
                            "table prices of a later revision is present"),
    "table-missing-at-head": ("head", "DROP TABLE cluster_samples", "table cluster_samples is missing"),
    "batch-leftover": (FIRST, "CREATE TABLE _alembic_tmp_allocations (id VARCHAR(32))",
                       "left over from an interrupted migration"),
}


def refusal_case(root: Path, backend: Backend, tally: Tally) -> None:
    """Each half-applied schema is refused; the first by a real control plane process (exit status 3 and the
    message on its output), the others by the same start-up step in this process (saves a Python start each)."""
    for index, (tag, (revision, statement, want)) in enumerate(HALF_APPLIED.items()):
        url = backend.new_url(tag)
        data = data_dir(root, url, tag)
        data.mkdir(parents=True, exist_ok=True)
        command.upgrade(migrating.alembic_config(url), revision)
        engine = create_engine(url, poolclass=pool.NullPool)
        with engine.begin() as connection:
            connection.execute(text(statement))
        engine.dispose()
        before = row_counts(url)
        status, log = run_until_exit(data, url, {}) if index == 0 else refused_in_process(url)
        tally.refusal_cases += 1
        refused = status == 3 and "refusing to start: the database schema is half-applied" in log and want in log
        tally.refusals += refused
        assert refused, (tag, status, log[-2000:])
        assert row_counts(url) == before, "a refused start changed the database"


def refused_in_process(url: str) -> tuple[int, str]:
    """What `python -m gpupool.server` does with the database before serving: (3, message) when it refuses."""
    try:
        migrating.upgrade(url)
    except SchemaMismatch as exc:
        return 3, str(exc)
    return 0, "started"


def t10(root: Path, backend: Backend) -> None:
    tally = Tally()
    fresh_case(root, backend, tally)
    populated_case(root, backend, tally)
    refusal_case(root, backend, tally)
    figure(f"T10 migrations={tally.migrations} killed_mid={tally.killed_mid} partial={len(tally.partial)} "
           f"refused_half_applied={tally.refusals}/{tally.refusal_cases} ({backend.name})")
    assert not tally.partial, tally.partial


def test_t10_migrations_killed_mid_way_sqlite(tmp_path: Path):
    t10(tmp_path, sqlite_backend(tmp_path))


def test_t10_migrations_killed_mid_way_postgres(tmp_path: Path, postgres: Postgres):
    t10(tmp_path, pg_backend(postgres))


# units ---------------------------------------------------------------------------------------------------------

A, B = frozenset({"id", "name"}), frozenset({"id"})


@pytest.mark.parametrize(("actual", "expected", "want"), [
    ({"a": A}, {"a": A}, []),
    ({}, {"a": A}, ["table a is missing"]),
    ({"a": B}, {"a": A}, ["column a.name is missing"]),
    ({"a": A, "b": B}, {"a": A}, ["table b of a later revision is present"]),
    ({"a": A | {"late"}}, {"a": A}, ["column a.late of a later revision is present"]),
    ({"a": A, "mine": B}, {"a": A}, []),
    ({"a": A, "_alembic_tmp_a": A}, {"a": A}, ["table _alembic_tmp_a is left over from an interrupted migration"]),
], ids=["exact", "missing-table", "missing-column", "later-table", "later-column", "unrelated-table-ignored",
        "batch-leftover"])
def test_differences(actual, expected, want):
    head = {"a": A | {"late"}, "b": B}
    assert differences(actual, expected, head) == want


def test_expected_schema_follows_the_migrations():
    assert expected_schema(None) == {}
    first, head = expected_schema(FIRST), expected_schema(revisions()[-1])
    assert "jobs" in first and "ledger" not in first and "ledger" in head
    assert set(first) <= set(head)


def test_sqlite_backup_is_a_consistent_copy(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'gpupool.db'}"
    command.upgrade(migrating.alembic_config(url), FIRST)
    copy = migrating.backup_sqlite(url, FIRST)
    assert copy == tmp_path / f"gpupool.db.pre-{FIRST}.bak"
    assert schema_state(f"sqlite:///{copy}") == f"old:{FIRST}"
