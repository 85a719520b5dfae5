"""ContainerRuntime: selection without podman here; a real run only where podman and a local test image exist."""

from __future__ import annotations

import os
import time

import pytest

from gpupool.agent.runtime import ContainerRuntime, LaunchSpec, ProcessRuntime, RunState, open_runtime
from gpupool.agent.runtime import container as container_module


def test_open_runtime_falls_back_to_processes_without_podman(tmp_path, monkeypatch):
    monkeypatch.setattr(container_module, "podman_path", lambda: None)
    runtime = open_runtime(tmp_path)
    assert type(runtime) is ProcessRuntime
    with pytest.raises(RuntimeError, match="podman not found"):
        ContainerRuntime(tmp_path)


@pytest.mark.skipif(container_module.podman_path() is None, reason="podman is not installed")
@pytest.mark.skipif("GPUPOOL_TEST_IMAGE" not in os.environ, reason="set GPUPOOL_TEST_IMAGE to a locally present image")
def test_an_image_workload_runs_and_reports_its_exit_code(tmp_path):
    runtime = ContainerRuntime(tmp_path)
    spec = LaunchSpec(
        "c1", 0, "j", ("sh", "-c", "echo $GPUPOOL_JOB_ID; exit 3"), image=os.environ["GPUPOOL_TEST_IMAGE"]
    )
    handle = runtime.launch(spec)
    deadline = time.monotonic() + 60
    while runtime.poll(handle).running:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert runtime.poll(handle) == RunState("exited", 3)
    assert "j" in handle.log_path.read_text()
    runtime.forget(handle)
