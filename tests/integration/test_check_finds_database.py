"""`gpupool check` finds the database the way `gpupool up` configured it (issue 33, item 5): after `gpupool up`, a bare
`gpupool check`, run from any folder, checks that control plane's database; `--data-dir` names another data dir, and
without any database it says where it looked and which flags point elsewhere, without a traceback and without
creating an empty database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from agent_cluster import wait_for

from gpupool.devtools import jobdirs
from gpupool.devtools.harness import stable_port

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "gpupool.cli.main"]


def check(env: dict[str, str], cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "check", *flags], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_bare_check_reads_the_database_gpupool_up_made(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the API on a port no outgoing connection takes, the agent channel on any free port (by default it is the API
    # port + 1, which another test may hold)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "GPUPOOL_AGENT_PORT": "0"}
    env.pop("GPUPOOL_DATABASE_URL", None)
    with jobdirs.open_folder("gpupool-check-") as base:
        data, port = base / "pool-data", stable_port()
        with open(tmp_path / "up.log", "wb") as log:
            up = subprocess.Popen([*CLI, "up", "--data-dir", str(data), "--port", str(port), "--fake-gpus",
                                   "1xA100-80GB"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=base)
        try:
            def ready() -> bool:
                assert up.poll() is None, (tmp_path / "up.log").read_text()
                if not (data / "admin.token").exists():
                    return False
                token = (data / "admin.token").read_text().strip()
                try:  # the token is written before the server binds its port
                    nodes = httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes", timeout=5,
                                      headers={"Authorization": f"Bearer {token}"})
                except httpx.TransportError:
                    return False
                return nodes.status_code == 200 and [n["state"] for n in nodes.json()] == ["ready"]
            wait_for(ready, 90, "gpupool up's node to be ready")
            bare = check(env, elsewhere)
            named = check(env, elsewhere, "--data-dir", str(data))
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=60)
    database = str((data / "gpupool.db").resolve())
    assert bare.returncode == 0, bare.stdout + bare.stderr
    assert database in bare.stdout and "0 invariant violations" in bare.stdout
    assert named.returncode == 0 and database in named.stdout, named.stdout + named.stderr
    assert not (elsewhere / "gpupool-data").exists()


def test_check_without_a_database_names_where_it_looked(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("GPUPOOL_DATABASE_URL", None)
    missing = check(env, tmp_path)
    assert missing.returncode == 2
    message = missing.stderr.strip()
    assert str(tmp_path / "gpupool-data" / "gpupool.db") in message, message
    assert "--data-dir" in message and "--database-url" in message and "Traceback" not in message, message
    assert not (tmp_path / "gpupool-data").exists()
