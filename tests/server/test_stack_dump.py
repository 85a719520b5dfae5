"""`kill -USR1` on a running control plane logs every thread's stack and leaves it serving."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from gpupool.devtools.harness import server_log, start_server, stop_server


def test_sigusr1_logs_the_stacks_and_the_control_plane_keeps_serving(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        log = server_log(server.data_dir, server.port)
        server.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 20
        while "scheduler/loop.py" not in log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log.read_text(errors="replace")
        assert "Thread 0x" in text and "scheduler/loop.py" in text, text[-2000:]
        assert server.process.poll() is None
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    finally:
        stop_server(server)
