"""Real servers for the API tests: a control plane subprocess on loopback, on SQLite or on a PostgreSQL
server that this harness starts (as the postgres user when running as root)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.devtools.harness import (  # noqa: F401 - re-exported for the tests
    Postgres,
    Server,
    free_port,
    pg_bin,
    postgres_server,
    start_server,
    stop_server,
)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (make test installs it on Debian)")
    with postgres_server() as pg:
        yield pg


def _start(request: pytest.FixtureRequest, data_dir: Path) -> Server:
    url = None
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"t{os.getpid()}_{free_port()}")
    return start_server(data_dir, url)


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A fresh control plane per test, on SQLite and on PostgreSQL."""
    srv = _start(request, tmp_path / "data")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def shared_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One control plane per test module and backend, for tests whose assertions hold whatever other tests of the
    module added (each looks only at what it made itself). A start costs seconds; most API checks take milliseconds."""
    srv = _start(request, tmp_path_factory.mktemp("shared") / "data")
    yield srv
    stop_server(srv)


#: the API guard's limits lifted for tests that drive the API hard (those that test a limit set their own)
LIFTED = {"GPUPOOL_RATE_LIMIT_PER_S": "100000", "GPUPOOL_RATE_LIMIT_BURST": "100000",
          "GPUPOOL_AUTH_FAILURES_PER_MIN": "100000", "GPUPOOL_MAX_PENDING_JOBS_PER_ORG": "100000"}


@pytest.fixture
def launch(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """`launch(backend, **env)`: a control plane on "sqlite" or "postgres" with GPUPOOL_* `env` over LIFTED;
    stopped after the test."""
    started: list[Server] = []

    def start(backend: str = "sqlite", **env: str) -> Server:
        url = None
        if backend == "postgres":
            pg: Postgres = request.getfixturevalue("postgres")
            url = pg.create_database(f"cp{free_port()}")
        server = start_server(tmp_path / f"cp{len(started)}" / "data", url, env={**LIFTED, **env})
        started.append(server)
        return server

    yield start
    for server in started:
        stop_server(server)
