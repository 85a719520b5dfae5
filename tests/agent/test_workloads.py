"""Workloads: orders to runtime calls and task statuses, with a real ProcessRuntime and an Outbox (no network)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.agent.clock import ManualClock
from gpupool.agent.orders import EpochRecord
from gpupool.agent.outbox import Outbox, OutFrame
from gpupool.agent.runtime import ProcessRuntime
from gpupool.agent.runtime.process import DEFAULT_PATH
from gpupool.agent.workloads import FENCED_NOTE, LOG_ACKED_FILE, Workloads
from gpupool.protocol.agent import GpuGrant, Launch, LogChunk, Stop, TaskStatus

NOW = 1_700_000_000.0
BOOT = "boot-1"
ENV = {"PATH": os.environ.get("PATH", DEFAULT_PATH)}


def launch(script: str, allocation="a1", attempt=0, epoch=3, expires_at=NOW + 120, gpus=(), image=None,
           max_disconnect_s=None) -> Launch:
    grants = [GpuGrant(uuid=u, index=i, milli=1000, memory_mib=0) for i, u in enumerate(gpus)]
    return Launch(
        allocation_id=allocation,
        attempt=attempt,
        job_id="j",
        task_index=0,
        command=["sh", "-c", script],
        gpus=grants,
        epoch=epoch,
        expires_at=expires_at,
        image=image,
        max_disconnect_s=max_disconnect_s,
    )


class Node:
    """A Workloads with its runtime, outbox and clock, plus helpers to read what it would send."""

    def __init__(self, directory: Path, gpu_uuids=("GPU-1",), epochs: EpochRecord | None = None) -> None:
        self.runtime = ProcessRuntime(directory, base_env=ENV)
        self.outbox = Outbox(BOOT)
        self.clock = ManualClock(NOW)
        self.workloads = Workloads(self.runtime, self.outbox, wall_clock=self.clock, epochs=epochs, gpu_uuids=gpu_uuids)

    def sent(self) -> list[OutFrame]:
        return self.outbox.take()

    def statuses(self) -> list[tuple[str, str, int | None]]:
        return [(f.allocation_id, f.state, f.exit_code) for f in self.sent() if isinstance(f, TaskStatus)]

    def tick_until(self, predicate: Callable[[list[OutFrame]], bool], timeout_s: float = 10.0) -> list[OutFrame]:
        """Tick (connected) until the frames sent so far satisfy `predicate`; return them."""
        frames: list[OutFrame] = []
        deadline = time.monotonic() + timeout_s
        while not predicate(frames):
            assert time.monotonic() < deadline, f"timed out; sent so far: {frames}"
            self.workloads.tick(connected=True)
            frames += self.sent()
            time.sleep(0.01)
        return frames

    def ack_all(self, frames: list[OutFrame]) -> None:
        self.workloads.on_acked(self.outbox.ack(max(f.seq for f in frames)))


def final_state(frames: list[OutFrame]) -> TaskStatus | None:
    finals = [f for f in frames if isinstance(f, TaskStatus) and f.state != "started"]
    return finals[-1] if finals else None


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path / "workloads")
    yield node
    for handle in node.runtime.adopt():
        if node.runtime.is_alive(handle):
            os.killpg(handle.pgid, signal.SIGKILL)


def test_launch_reports_started_then_logs_then_exit(node):
    node.workloads.on_launch(launch("echo hello; exit 5"))
    [started] = node.sent()
    assert (started.state, started.allocation_id, started.boot_id) == ("started", "a1", BOOT)
    frames = node.tick_until(lambda fs: final_state(fs) is not None)
    logs = [f for f in frames if isinstance(f, LogChunk)]
    assert "".join(f.data for f in logs) == "hello\n"
    assert frames.index(logs[-1]) < frames.index(final_state(frames))
    assert (final_state(frames).state, final_state(frames).exit_code) == ("exited", 5)


def test_a_fully_reported_workload_is_forgotten_and_duplicates_get_its_final_status(node):
    node.workloads.on_launch(launch("exit 0"))
    frames = node.sent() + node.tick_until(lambda fs: final_state(fs) is not None)
    node.ack_all(frames)
    node.workloads.tick(connected=True)
    assert node.workloads.keys() == [] and node.runtime.adopt() == []
    node.workloads.on_launch(launch("exit 0"))
    assert node.statuses() == [("a1", "exited", 0)]
    assert node.runtime.adopt() == []  # not started again


def test_a_duplicate_launch_does_not_start_twice(node):
    node.workloads.on_launch(launch("exec sleep 30"))
    node.workloads.on_launch(launch("exec sleep 30", expires_at=NOW - 1))
    assert node.statuses() == [("a1", "started", None), ("a1", "started", None)]
    assert len(node.runtime.adopt()) == 1


def test_expired_and_stale_orders_are_refused(tmp_path):
    node = Node(tmp_path / "w", epochs=EpochRecord(tmp_path / "epoch"))
    node.workloads.on_launch(launch("exit 0", allocation="new", epoch=7))
    node.workloads.on_launch(launch("exit 0", allocation="old", epoch=6))
    node.workloads.on_launch(launch("exit 0", allocation="late", epoch=7, expires_at=NOW - 0.5))
    node.workloads.on_launch(launch("exit 0", allocation="foreign", gpus=("GPU-9",), epoch=7))
    frames = [f for f in node.sent() if isinstance(f, TaskStatus)]
    assert [(f.allocation_id, f.state) for f in frames] == [
        ("new", "started"),
        ("old", "refused"),
        ("late", "refused"),
        ("foreign", "refused"),
    ]
    assert "epoch 6" in frames[1].message and "expired" in frames[2].message and "GPU-9" in frames[3].message
    assert EpochRecord(tmp_path / "epoch").highest == 7


def test_a_launch_the_runtime_cannot_start_fails(node):
    node.workloads.on_launch(launch("true", image="alpine:3"))
    [failed] = node.sent()
    assert failed.state == "failed" and "image" in failed.message


def test_stop_of_an_unknown_workload_is_refused(node):
    assert node.workloads.on_stop(Stop(allocation_id="zz", attempt=0, grace_s=1)) is None
    assert node.statuses() == [("zz", "refused", None)]


def test_stop_order_stops_and_reports_the_reason(node):
    node.workloads.on_launch(launch("echo ready; exec sleep 30"))
    node.tick_until(lambda fs: any(isinstance(f, LogChunk) for f in fs))
    handle = node.workloads.on_stop(Stop(allocation_id="a1", attempt=0, grace_s=5, reason="preempted"))
    assert handle is not None
    assert node.workloads.on_stop(Stop(allocation_id="a1", attempt=0, grace_s=5)) is None  # already stopping
    node.runtime.stop(handle, 5.0)
    final = final_state(node.tick_until(lambda fs: final_state(fs) is not None))
    assert (final.state, final.exit_code, final.message) == ("exited", 143, "stopped: preempted")
    node.workloads.on_stop(Stop(allocation_id="a1", attempt=0, grace_s=5))
    assert node.statuses() == [("a1", "exited", 143)]


def test_fenced_workloads_are_reported_fenced_even_after_an_agent_restart(node, tmp_path):
    node.workloads.on_launch(launch("exec sleep 30"))
    node.workloads.on_launch(launch("exec sleep 30", allocation="a2"))
    handles = node.workloads.fence()
    assert sorted(h.allocation_id for h in handles) == ["a1", "a2"]
    assert all(h.note == FENCED_NOTE for h in handles)
    assert node.workloads.running_reports() == []
    for handle in handles:
        node.runtime.stop(handle, 5.0)
    restarted = Node(tmp_path / "workloads")
    restarted.workloads.adopt(restarted.runtime.adopt())
    restarted.workloads.tick(connected=False)
    assert sorted(restarted.statuses()) == [("a1", "fenced", 143), ("a2", "fenced", 143)]


def test_each_workload_is_fenced_at_its_own_max_disconnect_which_survives_an_agent_restart(node, tmp_path):
    node.workloads.on_launch(launch("exec sleep 30", max_disconnect_s=5))
    node.workloads.on_launch(launch("exec sleep 30", allocation="a2"))  # the node's default
    assert node.workloads.time_left(3.0, 40.0) == 2.0
    assert node.workloads.fence(4.9, 40.0) == []
    [short] = node.workloads.fence(5.0, 40.0)
    assert short.allocation_id == "a1" and short.max_disconnect_s == 5
    assert node.workloads.fence(39.0, 40.0) == []  # a1 is fenced once; a2 still has a second
    assert node.workloads.time_left(39.0, 40.0) == 1.0
    restarted = Node(tmp_path / "workloads")
    restarted.workloads.adopt(restarted.runtime.adopt())
    assert [h.allocation_id for h in restarted.workloads.fence(40.0, 40.0)] == ["a2"]
    for handle in (short, *restarted.workloads.fence(41.0, 40.0), node.workloads.get(("a2", 0)).handle):
        node.runtime.stop(handle, 5.0)


def test_hello_reports_running_and_unreported_exits(node, tmp_path):
    node.workloads.on_launch(launch("exec sleep 30"))
    node.workloads.on_launch(launch("exit 9", allocation="a2"))
    node.tick_until(lambda fs: final_state(fs) is not None)
    reports = {r.allocation_id: (r.state, r.exit_code) for r in node.workloads.running_reports()}
    assert reports == {"a1": ("running", None), "a2": ("exited", 9)}
    assert all(r.pid for r in node.workloads.running_reports())


def test_exits_while_the_agent_was_down_are_reported_after_adoption(node, tmp_path):
    node.workloads.on_launch(launch("sleep 0.1; exit 4"))
    time.sleep(0.4)  # the "old agent" never polls
    restarted = Node(tmp_path / "workloads")
    restarted.workloads.adopt(restarted.runtime.adopt())
    assert [r.state for r in restarted.workloads.running_reports()] == ["running"]  # not polled yet
    restarted.workloads.tick(connected=False)
    assert restarted.statuses() == [("a1", "exited", 4)]


def test_an_exit_without_a_recorded_code_is_a_failure(node, tmp_path):
    node.workloads.on_launch(launch("exec sleep 30"))
    [handle] = node.runtime.adopt()
    os.killpg(handle.pgid, signal.SIGKILL)  # wrapper and workload die: nobody records a code
    time.sleep(0.2)
    restarted = Node(tmp_path / "workloads")
    restarted.workloads.adopt(restarted.runtime.adopt())
    frames = restarted.tick_until(lambda fs: final_state(fs) is not None)
    assert (final_state(frames).state, final_state(frames).exit_code) == ("failed", None)


def test_log_progress_survives_an_agent_restart(node, tmp_path):
    node.workloads.on_launch(launch("echo first; echo ready; exec sleep 30"))
    frames = node.tick_until(lambda fs: "ready" in "".join(f.data for f in fs if isinstance(f, LogChunk)))
    node.ack_all(frames)
    [handle] = node.runtime.adopt()
    assert (handle.state_dir / LOG_ACKED_FILE).read_text().strip() == str(len("first\nready\n"))
    with handle.log_path.open("a") as out:
        out.write("later\n")
    restarted = Node(tmp_path / "workloads")
    restarted.workloads.adopt(restarted.runtime.adopt())
    restarted.workloads.tick(connected=True)
    chunks = [f for f in restarted.sent() if isinstance(f, LogChunk)]
    assert [(c.offset, c.data) for c in chunks] == [(12, "later\n")]


def test_no_log_is_read_while_disconnected(node):
    node.workloads.on_launch(launch("echo hi; exec sleep 30"))
    node.sent()
    time.sleep(0.2)
    node.workloads.tick(connected=False)
    assert node.sent() == []
