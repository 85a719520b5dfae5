"""A database the control plane cannot use (issue 43: a wrong PostgreSQL password printed a 100-line traceback):
`gpupool check` and `gpupool server` say in one line which database failed (password hidden), the driver's reason,
and what to check; `gpupool --debug` shows the traceback as well."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.devtools.harness import Postgres, free_port

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]


def _url(pg: Postgres) -> str:
    """A URL naming a user PostgreSQL does not know, with a password: refused as wrong credentials are."""
    return f"postgresql+psycopg://intruder:hunter2@127.0.0.1:{pg.port}/gpupool"


@pytest.mark.parametrize("command", [["check"], ["server"]], ids=["check", "server"])
def test_a_refused_database_login_is_one_line(postgres: Postgres, tmp_path: Path, command: list[str]) -> None:
    args = [*command, "--database-url", _url(postgres)]
    if command[0] == "server":
        args += ["--data-dir", str(tmp_path / "data"), "--port", str(free_port())]
    done = subprocess.run([*GPUPOOL, *args], capture_output=True, text=True, timeout=120)
    said = done.stderr.strip()
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1 and len(said.splitlines()) == 1, said
    assert "cannot use the database postgresql+psycopg://intruder:***@127.0.0.1" in said and "intruder" in said
    assert "hunter2" not in done.stdout + said and "check the URL's user, password" in said
    debug = subprocess.run([*GPUPOOL, "--debug", *args], capture_output=True, text=True, timeout=120)
    assert "Traceback (most recent call last)" in debug.stderr and "hunter2" not in debug.stderr
