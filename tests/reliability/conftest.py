"""Fixtures of the reliability tests (RELIABILITY.md §3.1): real control planes and agents under injected faults.

The PR tier runs reduced counts; GPUPOOL_SOAK=1 (`make soak`) the full ones. Every test reports its result as
one figure line (gpupool.devtools.figures.figure). The end-to-end helpers come from tests/integration.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # agent_cluster

from gpupool.devtools.harness import Postgres, pg_bin, postgres_server  # noqa: E402


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL server per test process (each test makes its own database in it)."""
    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (make system-deps installs it on Debian)")
    with postgres_server() as pg:
        yield pg
