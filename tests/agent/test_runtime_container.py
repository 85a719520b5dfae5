"""ContainerRuntime: the container spec it generates (RELIABILITY.md §3.2 S8, CPU tier: non-root, no new privileges,
no capabilities, private namespaces, read-only root, exactly the granted GPUs); selection without podman here; a real
run only where podman and a local test image exist."""

from __future__ import annotations

import os
import time

import pytest

from gpupool.agent.runtime import ContainerRuntime, LaunchSpec, ProcessRuntime, RunState, open_runtime
from gpupool.agent.runtime import container as container_module
from gpupool.agent.runtime.container import container_user, podman_argv
from gpupool.agent.runtime.process import workload_env
from gpupool.protocol.agent import GpuGrant

GRANTS = (GpuGrant(uuid="GPU-aaaa", index=1, milli=1000, memory_mib=0),
          GpuGrant(uuid="MIG-bbbb", index=3, milli=1000, memory_mib=0))
SPEC = LaunchSpec("a1", 0, "j1", ("python", "train.py"), workdir="/work", image="registry.example.com/team/train:1.0",
                  env={"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"}, gpus=GRANTS)
#: what must be in every container's command line, and what must never be
REQUIRED = ("--security-opt=no-new-privileges", "--cap-drop=ALL", "--network=private", "--pid=private",
            "--ipc=private", "--read-only", "--read-only-tmpfs=true")
FORBIDDEN = ("--privileged", "--network=host", "--net=host", "--pid=host", "--ipc=host", "--uts=host",
             "--userns=host", "--cap-add", "--security-opt=seccomp=unconfined", "--volume", "-v")


def options(argv: list[str]) -> list[str]:
    """The podman options of `argv`: everything between `run` and the image."""
    return argv[argv.index("run") + 1: argv.index(SPEC.image)]


def violations(argv: list[str]) -> list[str]:
    opts = options(argv)
    found = [f"missing {flag}" for flag in REQUIRED if flag not in opts]
    found += [f"forbidden {opt}" for opt in opts if opt.split("=")[0] in FORBIDDEN or opt in FORBIDDEN]
    users = [opt.split("=", 1)[1] for opt in opts if opt.startswith("--user=")]
    if len(users) != 1 or any(part in ("0", "root") for part in users[0].split(":")):
        found.append(f"not exactly one non-root --user: {users}")
    return found


def test_the_container_runs_unprivileged_in_private_namespaces_on_a_read_only_root(s8):
    with s8.case("runtime_spec") as numbers:
        argv = podman_argv("podman", SPEC, GRANTS, cdi=True)
        numbers["checked_flags"] = len(REQUIRED) + len(FORBIDDEN) + 1
        assert violations(argv) == []
        assert "--user=65534:65534" in options(argv)
        assert argv[-3:] == [SPEC.image, "python", "train.py"]
        assert "--workdir" in options(argv)


@pytest.mark.parametrize("bad", [["--privileged"], ["--network=host"], ["--pid=host"], ["--ipc=host"],
                                 ["--user=0:0"]], ids=["privileged", "host-net", "host-pid", "host-ipc", "root"])
def test_the_spec_check_catches_each_violation(bad):
    argv = podman_argv("podman", SPEC, GRANTS, cdi=True)
    at = argv.index(SPEC.image)
    tampered = [a for a in argv[:at] if not a.startswith("--user=") or not bad[0].startswith("--user=")]
    assert violations([*tampered, *bad, *argv[at:]]) != []


def test_the_user_is_configurable_but_never_root():
    argv = podman_argv("podman", SPEC, GRANTS, cdi=False, user=container_user("1000:1000"))
    assert "--user=1000:1000" in options(argv) and violations(argv) == []
    for bad in ("0:0", "0", "1000:0", "root", "nobody", "1000:", ":1000", "-1:5", "1000:1000:1"):
        with pytest.raises(ValueError, match="uid:gid"):
            container_user(bad)


def test_the_container_sees_exactly_the_granted_gpus(s8):
    with s8.case("visible_devices") as numbers:
        argv = podman_argv("podman", SPEC, GRANTS, cdi=True)
        devices = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--device"]
        assert devices == ["nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=MIG-bbbb"]
        env = workload_env(SPEC, GRANTS, {"PATH": "/usr/bin"})
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,MIG-bbbb", \
            "the order's own env must not widen what the container sees"
        names = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--env"]
        assert {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} <= set(names)
        assert all("=" not in name for name in names), "values never appear on a command line"
        none = podman_argv("podman", SPEC, (), cdi=True)
        assert "--device" not in none and workload_env(SPEC, (), {})["NVIDIA_VISIBLE_DEVICES"] == "void"
        numbers["gpus"] = len(devices)


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
