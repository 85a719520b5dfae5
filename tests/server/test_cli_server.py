"""`gpupool server`: the CLI command users (and `gpupool up`) start the control plane with. The other tests start
`python -m gpupool.server` directly, which is what this command execs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from gpupool.devtools.harness import TEST_LIMITS, server_log, stable_port, wait_ready

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]


def test_gpupool_server_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    data, port = tmp_path / "data", stable_port()  # and the agent channel on any free port (TEST_LIMITS)
    data.mkdir()
    with open(server_log(data, port), "ab") as log:
        process = subprocess.Popen([*GPUPOOL, "server", "--data-dir", str(data), "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, env={**TEST_LIMITS, **os.environ})
    try:
        wait_ready(f"http://127.0.0.1:{port}", process, server_log(data, port))
        token = (data / "admin.token").read_text().strip()
        whoami = httpx.get(f"http://127.0.0.1:{port}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert whoami.json()["role"] == "operator"
    finally:
        process.terminate()
        assert process.wait(timeout=20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once stopped


def test_gpupool_server_refuses_a_bad_port_naming_it(tmp_path: Path) -> None:
    done = subprocess.run([*GPUPOOL, "server", "--data-dir", str(tmp_path), "--port", "70000"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--port" in done.stderr
