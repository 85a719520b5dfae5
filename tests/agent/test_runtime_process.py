"""ProcessRuntime with real subprocesses: exit codes, environment, stop with grace, adopt after restart, pid reuse."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.agent.runtime import LaunchError, LaunchSpec, ProcessRuntime, RunHandle, RunState, gpu_env
from gpupool.agent.runtime.container import podman_argv
from gpupool.agent.runtime.process import (
    DEFAULT_PATH,
    STATE_FILE,
    shell_exit_code,
    workload_dir_name,
    workload_env,
)
from gpupool.agent.runtime.procfs import parse_stat, read_stat
from gpupool.protocol.agent import GpuGrant, Launch

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the process runtime needs Linux /proc")

BASE_ENV = {"PATH": os.environ.get("PATH", DEFAULT_PATH), "HOME": "/tmp", "SECRET_OF_AGENT": "x"}


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def wait_exit(runtime: ProcessRuntime, handle: RunHandle, timeout_s: float = 10.0) -> RunState:
    wait_until(lambda: not runtime.poll(handle).running, timeout_s)
    return runtime.poll(handle)


def shell(script: str, allocation: str = "alloc-1", attempt: int = 0, **kwargs) -> LaunchSpec:
    return LaunchSpec(allocation, attempt, "job-1", ("sh", "-c", script), **kwargs)


def grant(uuid: str = "GPU-aaaa", index: int = 0, milli: int = 1000, memory_mib: int = 0) -> GpuGrant:
    return GpuGrant(uuid=uuid, index=index, milli=milli, memory_mib=memory_mib)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ProcessRuntime]:
    rt = ProcessRuntime(tmp_path / "workloads", base_env=BASE_ENV)
    yield rt
    for handle in ProcessRuntime(tmp_path / "workloads").adopt():  # never leave a sleeper behind
        if rt.is_alive(handle):
            os.killpg(handle.pgid, signal.SIGKILL)


def logged_env(runtime: ProcessRuntime, spec: LaunchSpec) -> dict[str, str]:
    handle = runtime.launch(spec)
    assert wait_exit(runtime, handle).exit_code == 0
    lines = handle.log_path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_exit_code_and_output_are_recorded(runtime):
    handle = runtime.launch(shell("echo hi; echo oops >&2; exit 3"))
    assert wait_exit(runtime, handle) == RunState("exited", 3)
    assert handle.log_path.read_text() == "hi\noops\n"
    assert handle.log_path.stat().st_mode & 0o777 == 0o600
    assert handle.pgid == handle.pid and handle.start_ticks is not None


def test_whole_gpu_environment(runtime):
    gpus = (grant("GPU-1111", 0), grant("GPU-2222", 1))
    env = logged_env(runtime, shell("env", env={"MY_VAR": "1", "CUDA_VISIBLE_DEVICES": "spoofed"}, gpus=gpus))
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1111,GPU-2222"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-1111,GPU-2222"
    assert env["GPUPOOL_ALLOCATION_ID"] == "alloc-1"
    assert env["GPUPOOL_ATTEMPT"] == "0"
    assert env["GPUPOOL_JOB_ID"] == "job-1"
    assert env["MY_VAR"] == "1"
    assert "SECRET_OF_AGENT" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    assert "GPUPOOL_GPU_FRACTION" not in env


def test_fractional_gpu_sets_mps_limits(runtime):
    env = logged_env(runtime, shell("env", gpus=(grant("GPU-1111", milli=250, memory_mib=20480),)))
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1111"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["GPUPOOL_GPU_FRACTION"] == "0.25"


def test_mig_instance_uuid_is_passed_as_is(runtime):
    mig = "MIG-4b5f9e9c-1c1a-5f0e-9d36-6d3c5a1f2b7e"
    env = logged_env(runtime, shell("env", gpus=(grant(mig, milli=1000, memory_mib=9856),)))
    assert env["CUDA_VISIBLE_DEVICES"] == mig
    assert env["NVIDIA_VISIBLE_DEVICES"] == mig


@pytest.mark.parametrize(
    ("gpus", "want"),
    [
        ((), {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}),
        ((grant(milli=5, memory_mib=0),), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1", "GPUPOOL_GPU_FRACTION": "0.005"}),
        (
            (grant("A", 0, 1000), grant("B", 1, 500, 1024), grant("C", 2, 333, 0)),
            {
                "CUDA_VISIBLE_DEVICES": "A,B,C",
                "GPUPOOL_GPU_FRACTION": "1,0.5,0.333",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=1024M",
            },
        ),
    ],
)
def test_gpu_env_table(gpus, want):
    env = gpu_env(gpus)
    assert {key: env.get(key) for key in want} == want
    if all(g.memory_mib == 0 for g in gpus):
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_order_env_cannot_override_gpupool_variables():
    spec = shell("true", env={"GPUPOOL_JOB_ID": "evil", "PATH": "/opt/bin"})
    env = workload_env(spec, (), {"PATH": "/usr/bin"})
    assert env["GPUPOOL_JOB_ID"] == "job-1"
    assert env["PATH"] == "/opt/bin"
    assert workload_env(shell("true"), (), {})["PATH"] == DEFAULT_PATH


def test_launch_spec_from_launch_order():
    order = Launch(
        allocation_id="a",
        attempt=2,
        job_id="j",
        task_index=3,
        command=["python", "-c", "1"],
        env={"K": "V"},
        gpus=[grant()],
        epoch=1,
        expires_at=0.0,
    )
    spec = LaunchSpec.from_launch(order)
    assert (spec.key, spec.command, spec.env, spec.gpus, spec.task_index) == (
        ("a", 2),
        ("python", "-c", "1"),
        {"K": "V"},
        (grant(),),
        3,
    )


def test_stop_terminates_politely(runtime):
    handle = runtime.launch(shell("echo ready; exec sleep 30"))
    wait_until(lambda: "ready" in handle.log_path.read_text())
    assert runtime.stop(handle, grace_s=5.0) == RunState("exited", 128 + signal.SIGTERM)


def test_stop_kills_a_process_that_ignores_sigterm_after_the_grace(runtime):
    handle = runtime.launch(shell("trap '' TERM; echo ready; sleep 30; echo survived"))
    wait_until(lambda: "ready" in handle.log_path.read_text())
    started = time.monotonic()
    state = runtime.stop(handle, grace_s=0.3)
    elapsed = time.monotonic() - started
    assert state == RunState("exited", 128 + signal.SIGKILL)
    assert 0.3 <= elapsed < 5.0
    assert "survived" not in handle.log_path.read_text()
    assert read_stat(handle.pid) is None or read_stat(handle.pid).is_dead


def test_stop_of_an_exited_workload_is_a_no_op(runtime):
    handle = runtime.launch(shell("exit 4"))
    wait_exit(runtime, handle)
    assert runtime.stop(handle, grace_s=1.0) == RunState("exited", 4)


def test_adopt_after_restart_keeps_the_same_process(runtime, tmp_path):
    handle = runtime.launch(shell("echo ready; exec sleep 30"))
    wait_until(lambda: "ready" in handle.log_path.read_text())
    restarted = ProcessRuntime(tmp_path / "workloads", base_env=BASE_ENV)
    [adopted] = restarted.adopt()
    assert adopted == handle
    assert restarted.poll(adopted).running
    assert restarted.stop(adopted, grace_s=5.0) == RunState("exited", 128 + signal.SIGTERM)
    assert ProcessRuntime(tmp_path / "workloads").poll(adopted) == RunState("exited", 143)


def test_exit_code_survives_an_agent_restart(runtime, tmp_path):
    handle = runtime.launch(shell("sleep 0.2; exit 7"))
    del runtime  # the agent "dies": nobody polls or reaps the workload while it ends
    restarted = ProcessRuntime(tmp_path / "workloads", base_env=BASE_ENV)
    [adopted] = restarted.adopt()
    assert adopted.pid == handle.pid
    assert wait_exit(restarted, adopted) == RunState("exited", 7)


def test_a_reused_pid_is_neither_adopted_as_running_nor_signalled(runtime, tmp_path):
    handle = runtime.launch(shell("echo ready; exec sleep 30"))
    wait_until(lambda: "ready" in handle.log_path.read_text())
    state_file = handle.state_dir / STATE_FILE
    record = json.loads(state_file.read_text())
    record["start_ticks"] += 1  # as if the recorded pid now belonged to a process started at another time
    state_file.write_text(json.dumps(record))
    restarted = ProcessRuntime(tmp_path / "workloads", base_env=BASE_ENV)
    [adopted] = restarted.adopt()
    assert restarted.poll(adopted) == RunState("exited", None)
    assert restarted.stop(adopted, grace_s=0.1) == RunState("exited", None)  # nothing to signal
    assert runtime.poll(handle).running  # the real process was left alone
    runtime.stop(handle, grace_s=5.0)


def test_a_workload_from_another_host_boot_is_not_alive(runtime, tmp_path):
    handle = runtime.launch(shell("exec sleep 30"))
    state_file = handle.state_dir / STATE_FILE
    record = json.loads(state_file.read_text())
    record["host_boot_id"] = "another-boot"
    state_file.write_text(json.dumps(record))
    [adopted] = ProcessRuntime(tmp_path / "workloads").adopt()
    assert not ProcessRuntime(tmp_path / "workloads").is_alive(adopted)
    runtime.stop(handle, grace_s=5.0)


def test_launch_errors(runtime, tmp_path):
    with pytest.raises(LaunchError, match="image"):
        runtime.launch(shell("true", image="docker.io/library/alpine:3"))
    handle = runtime.launch(shell("true", allocation="a-dup"))
    with pytest.raises(LaunchError, match="already"):
        runtime.launch(shell("true", allocation="a-dup"))
    wait_exit(runtime, handle)


def test_a_workdir_the_job_cannot_enter_exits_127(runtime, tmp_path):
    # entered as the job's user, so that an answer never tells whether a folder it may not see exists
    handle = runtime.launch(shell("true", workdir=str(tmp_path / "missing")))
    assert wait_exit(runtime, handle) == RunState("exited", 127)
    assert "cannot enter the working directory" in handle.log_path.read_text()


def test_unknown_command_exits_127(runtime):
    handle = runtime.launch(LaunchSpec("a", 0, "j", ("/nonexistent/gpupool-test-binary",)))
    assert wait_exit(runtime, handle) == RunState("exited", 127)
    assert "cannot start" in handle.log_path.read_text()


def test_workdir_is_used(runtime, tmp_path):
    handle = runtime.launch(shell("pwd", workdir=str(tmp_path)))
    wait_exit(runtime, handle)
    assert handle.log_path.read_text().strip() == str(tmp_path)


def test_forget_and_note(runtime, tmp_path):
    handle = runtime.launch(shell("exec sleep 30"))
    with pytest.raises(RuntimeError, match="still runs"):
        runtime.forget(handle)
    noted = runtime.set_note(handle, "fenced")
    assert ProcessRuntime(tmp_path / "workloads").adopt()[0].note == "fenced"
    runtime.stop(noted, grace_s=5.0)
    runtime.forget(noted)
    assert not handle.state_dir.exists()
    assert runtime.adopt() == []


def test_adopt_skips_corrupt_state(runtime, tmp_path):
    bad = tmp_path / "workloads" / "bad.0"
    bad.mkdir(parents=True)
    (bad / STATE_FILE).write_text("{not json")
    assert runtime.adopt() == []


@pytest.mark.parametrize(
    ("allocation_id", "want_prefix"),
    [("alloc-1", "alloc-1.3"), ("a/b", "a_b-"), ("..", "..-"), ("x" * 200, "x" * 80 + "-")],
)
def test_workload_dir_name_is_safe(allocation_id, want_prefix):
    name = workload_dir_name(allocation_id, 3)
    assert name.startswith(want_prefix) and name.endswith(".3") and "/" not in name


def test_distinct_unsafe_ids_get_distinct_dirs():
    assert workload_dir_name("a/b", 0) != workload_dir_name("a_b", 0)


def test_parse_stat_handles_odd_command_names():
    raw = b"123 (a) b (c)) S 1 123 123 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 0 0"
    stat = parse_stat(raw)
    assert (stat.state, stat.start_ticks, stat.is_dead) == ("S", 98765, False)


def test_shell_exit_code():
    assert [shell_exit_code(c) for c in (0, 3, -9, -15)] == [0, 3, 137, 143]


def test_podman_argv_passes_env_by_name_and_gpus_as_cdi():
    spec = LaunchSpec(
        "a",
        1,
        "j",
        ("python", "train.py"),
        env={"TOKEN": "secret"},
        workdir="/work",
        image="img:1",
        gpus=(grant("GPU-1"),),
    )
    argv = podman_argv("podman", spec, spec.gpus, cdi=True)
    assert argv[:5] == ["podman", "run", "--rm", "--name", "gpupool-a.1"]
    assert "secret" not in " ".join(argv)
    assert ["--env", "TOKEN"] == argv[argv.index("TOKEN") - 1 : argv.index("TOKEN") + 1]
    assert ["--device", "nvidia.com/gpu=GPU-1"] == argv[argv.index("--device") : argv.index("--device") + 2]
    assert argv[-3:] == ["img:1", "python", "train.py"]
    assert "--device" not in podman_argv("podman", spec, spec.gpus, cdi=False)


def test_a_relative_state_directory_still_records_the_exit_code(tmp_path, monkeypatch):
    # `gpupool up` passes a relative data dir; the workload runs in another directory, and so does its wrapper
    monkeypatch.chdir(tmp_path)
    relative = ProcessRuntime(Path("workloads"), base_env=BASE_ENV)
    handle = relative.launch(shell("echo done; exit 4"))
    assert wait_exit(relative, handle) == RunState("exited", 4)
    assert handle.log_path.read_text() == "done\n"
