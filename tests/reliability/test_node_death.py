"""A node killed outright (issue 42): its agent and every workload of it SIGKILLed at once, as a crashed host
would be. Silence alone moves its work only once it can no longer run (max_disconnect and the margin: lost after
G); a sign of death moves it at once: the node's agent comes back as a new boot (a new boot id) and says hello
without the work, or an operator marks the node down.

Timings: agent_cluster.SCALED with max_disconnect 5 s and the lost grace G 6 s (as T2). Figures:
`T12 killed_outright: requeued_after_new_boot_s=… (agent restart -> requeued) requeued_after_silence_s=… (bound G..G+…)
marked_down_requeued_s=…`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_cluster import SCALED, Cluster, marker_command, read_marker, wait_for

from gpupool.devtools.figures import figure
from gpupool.server.check import run_checks

pytestmark = pytest.mark.slow

ENV = {**SCALED, "GPUPOOL_MAX_DISCONNECT_S": "5", "GPUPOOL_LOST_AFTER_S": "6"}
H, G = float(ENV["GPUPOOL_HEARTBEAT_S"]), float(ENV["GPUPOOL_LOST_AFTER_S"])
SCAN = min(1.0, H)


def _crash(cluster: Cluster, name: str) -> float:
    """SIGKILL the agent `name` and every workload of it, at once, as a crashed host would; the Unix time of the
    kill. The workloads' records then say they ran in an earlier boot of the kernel (STAND-IN for the reboot of a
    real machine, which a test cannot do: the kernel's boot id is all that changes in them)."""
    agent = cluster.agents[name]
    pids = agent.workload_pids()
    at = time.time()
    agent.signal(signal.SIGKILL)
    for pgid in pids:
        os.killpg(pgid, signal.SIGKILL)
    agent.wait()
    for state in (agent.data_dir / "workloads").glob("*/state.json"):
        record = json.loads(state.read_text())
        state.write_text(json.dumps({**record, "host_boot_id": "a-boot-before-the-crash"}))
    return at


def _requeued_at(cluster: Cluster, job_id: str) -> float | None:
    at = next((e["at"] for e in cluster.events(job_id) if e["kind"] == "requeued"), None)
    if at is None:
        return None
    moment = datetime.fromisoformat(at)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _running_on(cluster: Cluster, node: str, box: Path) -> str:
    """A marker job placed on `node` (the other nodes cordoned until it runs)."""
    others = [n for n in cluster.nodes() if n != node]
    for other in others:
        assert cluster.api.post(f"/nodes/{other}/cordon").status_code == 200
    try:
        job_id = cluster.submit(command=marker_command(box, 120), gpus="1")
        cluster.wait_job(job_id, ["running"], timeout_s=60)
    finally:
        for other in others:
            assert cluster.api.post(f"/nodes/{other}/uncordon").status_code == 200
    return job_id


def test_t12_a_node_killed_outright_has_its_work_moved_at_the_first_sign_of_death(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", env=dict(ENV)) as cluster:
        for name in ("crash", "silent", "down", "spare"):
            cluster.start_agent(name)
        cluster.wait_ready(["crash", "silent", "down", "spare"])
        reboot, silence, down = (_running_on(cluster, n, cluster.drop_box(n)) for n in ("crash", "silent", "down"))

        _crash(cluster, "crash")
        time.sleep(1.0)  # down long enough to notice; far less than G
        back_at = time.time()
        cluster.start_agent("crash", join=False)
        rebooted = wait_for(lambda: _requeued_at(cluster, reboot), G, "the rebooted node's work requeued") - back_at

        killed_at = _crash(cluster, "silent")
        silent_s = wait_for(lambda: _requeued_at(cluster, silence), 3 * G, "the silent node's work requeued")
        silent_s -= killed_at

        _crash(cluster, "down")
        marked_at = time.time()
        wait_for(lambda: cluster.api.post("/nodes/down/down").status_code == 200, G, "node down to be accepted")
        marked_s = wait_for(lambda: _requeued_at(cluster, down), G, "the marked-down node's work requeued") - marked_at

        for job_id in (reboot, silence, down):
            cluster.wait_job(job_id, ["running"], timeout_s=60)  # attempt 2, elsewhere
        high = G + 2 * SCAN + H
        figure(f"T12 killed_outright requeued_after_new_boot_s={max(rebooted, 0.0):.2f} requeued_after_silence_s="
               f"{silent_s:.2f} (bound G-H..G+2scan+H = {G - H:g}..{high:g}) marked_down_requeued_s={marked_s:.2f}")
        assert rebooted < G  # the new boot said hello: no wait for the silence
        assert G - H - 0.05 <= silent_s <= high + 0.5  # from the last heartbeat before the kill; slack: polling, load
        for job_id in (reboot, silence, down):
            assert cluster.job(job_id)["attempt"] == 2
        for name in ("crash", "silent", "down"):
            assert read_marker(cluster.drop_box(name) / "attempt-1") is not None
        assert run_checks(cluster.db_url) == []
