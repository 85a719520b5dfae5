"""A port already taken stops the control plane at start with one line that names the port and the setting that
moves it, for `gpupool server` and for `gpupool up` (whose agent channel is, by default, on the API port + 1, which
something else may hold): never a traceback, never only "exited with code 3"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.devtools.harness import stable_port

pytestmark = pytest.mark.slow


@pytest.fixture
def held() -> Iterator[tuple[int, socket.socket]]:
    """A free API port whose next port (the agent channel's default) this test holds, listening."""
    for _ in range(50):
        port, holder = stable_port(), socket.socket()
        try:
            holder.bind(("127.0.0.1", port + 1))
        except OSError:
            holder.close()
            continue
        holder.listen()
        with holder:
            yield port, holder
        return
    pytest.fail("no free pair of loopback ports")


def _gpupool(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")} | {"HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "gpupool.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_up_names_the_agent_channel_port_that_is_taken(tmp_path: Path, held: tuple[int, socket.socket]) -> None:
    port, _ = held
    done = _gpupool(tmp_path, "up", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--fake-gpus",
                    "1xA100-80GB")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert f"the agent channel cannot listen on 127.0.0.1:{port + 1}" in said, said
    assert "GPUPOOL_AGENT_PORT" in said and "Traceback" not in said, said


def test_server_names_the_api_port_that_is_taken(tmp_path: Path, held: tuple[int, socket.socket]) -> None:
    port, _ = held
    done = _gpupool(tmp_path, "server", "--data-dir", str(tmp_path / "data"), "--port", str(port + 1))
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [f"error: the API cannot listen on 127.0.0.1:{port + 1}: Address already in "
                                        f"use; choose another with --port or GPUPOOL_PORT"], done.stderr
