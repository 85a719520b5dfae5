"""The workload watchdog: with `fence_s` set, a process workload's wrapper stops it once the agent's lease (when it
last heard from the control plane) is older than `fence_s`, even with no agent process alive at all."""

from __future__ import annotations

import time
from pathlib import Path

from agent_cluster import wait_for

from gpupool.agent.runtime import LaunchSpec, ProcessRuntime, RunHandle, RunState


def runtime(tmp_path: Path) -> ProcessRuntime:
    return ProcessRuntime(tmp_path / "workloads", fence_s=0.6, fence_grace_s=0.3)


def test_a_renewed_lease_keeps_the_workload_and_a_stale_one_fences_it(tmp_path: Path):
    rt = runtime(tmp_path)
    rt.renew_lease(time.monotonic())
    handle = rt.launch(LaunchSpec("a1", 1, "j1", ("sleep", "30")))
    try:
        for _ in range(15):  # 1.5 s, well past fence_s, while the "agent" keeps hearing from the control plane
            rt.renew_lease(time.monotonic())
            time.sleep(0.1)
        assert rt.poll(handle).running and not rt.self_fenced(handle)
        stale_at = time.monotonic()
        state = wait_for(lambda: ended(rt, handle), 5, "the watchdog to fence")
        assert state == RunState("exited", 143) and rt.self_fenced(handle)
        assert 0.5 < time.monotonic() - stale_at < 1.5
        assert "self-fencing" in handle.log_path.read_text()
    finally:
        rt.stop(handle, 0)


def test_a_workload_ignoring_sigterm_is_killed_with_its_whole_group_after_the_grace(tmp_path: Path):
    rt = runtime(tmp_path)
    marker = tmp_path / "child-pid"
    command = ("sh", "-c", f"trap '' TERM; sleep 30 & echo $! > {marker}; wait")
    handle = rt.launch(LaunchSpec("a2", 1, "j2", command))  # no lease at all: fenced fence_s after its start
    try:
        state = wait_for(lambda: ended(rt, handle), 5, "the watchdog to kill")
        assert state == RunState("exited", 137) and rt.self_fenced(handle)
        grandchild = int(marker.read_text())
        wait_for(lambda: not Path(f"/proc/{grandchild}").exists() or _zombie(grandchild), 2, "the group to die")
    finally:
        rt.stop(handle, 0)


def test_without_fence_s_there_is_no_watchdog(tmp_path: Path):
    rt = ProcessRuntime(tmp_path / "workloads")
    handle = rt.launch(LaunchSpec("a3", 1, "j3", ("sleep", "30")))
    try:
        time.sleep(1.0)
        assert rt.poll(handle).running and not rt.self_fenced(handle)
    finally:
        rt.stop(handle, 0)


def ended(rt: ProcessRuntime, handle: RunHandle) -> RunState | None:
    state = rt.poll(handle)
    return None if state.running else state


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True
