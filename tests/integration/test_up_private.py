"""`gpupool up` (the all-in-one) keeps its data private (issue 41, finding 1): DATA_DIR, its logs and the local agent's
data folder are 0700 even when DATA_DIR existed with another mode, every key and token in them is 0600, and the jobs'
work folders live next to DATA_DIR (0711), which jobs could not enter."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from agent_cluster import wait_for

from gpupool.devtools import jobdirs
from gpupool.devtools.harness import stable_port

pytestmark = pytest.mark.slow

SECRETS = ("admin.token", "master.key", "ca.key", "order-signing.key", "agent/node.json")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_gpupool_up_makes_its_data_private(tmp_path: Path) -> None:
    with jobdirs.open_folder("gpupool-up-") as base:
        data, port = base / "gpupool-data", stable_port()
        data.mkdir(mode=0o755)  # as a user may have made it
        # the CLI's config goes to HOME; the agent channel on any free port (by default the API port + 1)
        env = {**os.environ, "HOME": str(tmp_path), "GPUPOOL_AGENT_PORT": "0"}
        with open(tmp_path / "up.log", "wb") as log:
            up = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "up", "--data-dir", str(data), "--port",
                                   str(port), "--fake-gpus", "1xA100-80GB"], stdout=log, stderr=subprocess.STDOUT,
                                  env=env)
        try:
            def ready() -> bool:
                assert up.poll() is None, (tmp_path / "up.log").read_text()
                if not all((data / name).exists() for name in SECRETS):
                    return False
                token = (data / "admin.token").read_text().strip()
                nodes = httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes", timeout=5,
                                  headers={"Authorization": f"Bearer {token}"})
                return nodes.status_code == 200 and [n["state"] for n in nodes.json()] == ["ready"]
            wait_for(ready, 90, "gpupool up's node to be ready")
            folders = {str(p.relative_to(base)): mode(p) for p in (data, data / "logs", data / "agent")}
            secrets = {name: mode(data / name) for name in SECRETS}
            work = mode(base / "gpupool-data-work") if (base / "gpupool-data-work").exists() else None
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=60)
    assert folders == {"gpupool-data": 0o700, "gpupool-data/logs": 0o700, "gpupool-data/agent": 0o700}
    assert secrets == dict.fromkeys(SECRETS, 0o600)
    assert work == 0o711
