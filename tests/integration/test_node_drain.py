"""Draining and removing nodes (issue 43, item 2) on a live control plane (SQLite) with real agents of fake GPUs,
timings scaled by 1/20 (kill grace 0.5 s):

1. drain: the job running on the node keeps running (attempt 1) while a new job goes to the other node; at the
   deadline, not before, the job is stopped with its grace and requeued (event "evicted"), and runs again elsewhere;
   undrain: the node takes work again;
2. remove: refused (409 naming the job) while a job runs there; a dry run changes nothing; forced, the job is
   requeued and the node leaves the list once its agent has stopped the job (its allocation still names it); an
   empty node is removed at once and its name is free for a new join token;
3. a drain's deadline is kept in the database: a control plane restarted before it still evicts at the deadline,
   and the node still takes no new work;
4. a gang with a task on the drained node: both its tasks are stopped, and the job goes back to pending only once
   both have (its attempts never overlap; the invariant checker runs after every test).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import SCALED, Cluster, marker_command, read_marker, wait_for

from gpupool.devtools.harness import kill_server, restart_server, stable_port

pytestmark = pytest.mark.slow


def _at(text: str) -> float:
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _event(cluster: Cluster, job_id: str, kind: str) -> dict[str, Any] | None:
    return next((e for e in cluster.events(job_id) if e["kind"] == kind), None)


def _running_on(cluster: Cluster, job_id: str, attempt: int) -> str:
    """The node of the job's task 0 once `attempt` runs."""
    job = cluster.wait_job(job_id, ["running"], timeout_s=30)
    wait_for(lambda: cluster.job(job_id)["attempt"] == attempt and cluster.job(job_id)["state"] == "running", 30,
             f"job {job_id} attempt {attempt} to run")
    job = cluster.job(job_id)
    return next(a["node"] for a in job["allocations"] if a["attempt"] == attempt and a["task_index"] == 0)


def _busy_node(cluster: Cluster, box: Path) -> str:
    """Start agent n0 (one GPU) alone, run a long marker job there, then start n1 (two GPUs); the job's id."""
    cluster.start_agent("n0", "1xA100-80GB")
    cluster.wait_ready(["n0"])
    job = cluster.submit(command=marker_command(box, 120), gpus="1", name="long")
    assert _running_on(cluster, job, 1) == "n0"
    cluster.start_agent("n1", "2xA100-80GB")
    cluster.wait_ready(["n1"])
    return job


def test_drain_keeps_running_work_and_evicts_it_at_the_deadline(cluster: Cluster):
    box = cluster.drop_box("drain")
    long = _busy_node(cluster, box)
    answer = cluster.api.post("/nodes/n0/drain", json={"deadline_s": 6})
    assert answer.status_code == 200, answer.text
    deadline = _at(answer.json()["deadline"])
    assert [w["job"] for w in answer.json()["work"]] == [long]
    node = cluster.nodes()["n0"]
    assert node["cordoned"] and node["drain_deadline"] and node["drain_since"], node

    newcomer = cluster.submit(command=["true"], gpus="1", name="newcomer")
    assert cluster.wait_job(newcomer)["allocations"][0]["node"] == "n1"
    assert cluster.job(long)["state"] == "running" and cluster.job(long)["attempt"] == 1
    assert _event(cluster, long, "evicted") is None and datetime.now(UTC).timestamp() < deadline

    evicted = wait_for(lambda: _event(cluster, long, "evicted"), 30, "the eviction at the deadline")
    assert _at(evicted["at"]) >= deadline, (evicted, deadline)
    assert "drained" in evicted["message"], evicted
    assert _running_on(cluster, long, 2) == "n1"
    first = next(a for a in cluster.job(long)["allocations"] if a["attempt"] == 1)
    assert first["node"] == "n0" and first["state"] == "released", first
    marker = read_marker(box / "attempt-1")
    assert marker is not None and not marker.done, marker  # stopped, not run to its end
    assert marker.last >= deadline - 0.5, (marker, deadline)
    assert sum(g["allocated_milli"] for g in cluster.nodes()["n0"]["gpus"]) == 0

    undone = cluster.api.post("/nodes/n0/undrain")
    assert undone.status_code == 200, undone.text
    assert not cluster.nodes()["n0"]["cordoned"] and cluster.nodes()["n0"]["drain_since"] is None
    pair = cluster.submit(command=["true"], gpus="1", tasks=2, name="pair")  # n1 has one GPU free (`long` holds
    assert {a["node"] for a in cluster.wait_job(pair)["allocations"]} == {"n0", "n1"}  # the other): n0 is needed
    cluster.api.post(f"/jobs/{long}/cancel")


def _registration(cluster: Cluster, name: str) -> dict[str, Any]:
    return {"join_token": cluster.join_token(), "name": name, "boot_id": "boot", "cpu_milli": 8000,
            "memory_mib": 8192, "gpus": [{"index": 0, "uuid": f"GPU-{name}-0", "model": "A100",
                                          "memory_mib": 40960, "fake": True}]}


def test_remove_is_refused_while_busy_and_forced_remove_requeues(cluster: Cluster):
    box = cluster.drop_box("remove")
    long = _busy_node(cluster, box)
    refused = cluster.api.delete("/nodes/n0")
    assert refused.status_code == 409 and long in refused.json()["detail"], refused.text
    dry = cluster.api.delete("/nodes/n0", params={"force": True, "dry_run": True})
    assert dry.status_code == 200 and [w["job"] for w in dry.json()["work"]] == [long], dry.text
    assert "n0" in cluster.nodes() and cluster.job(long)["attempt"] == 1

    forced = cluster.api.delete("/nodes/n0", params={"force": True})
    assert forced.status_code == 200, forced.text
    assert cluster.job(long)["state"] in ("pending", "scheduled", "running")
    assert _running_on(cluster, long, 2) == "n1"
    wait_for(lambda: "n0" not in cluster.nodes(), 30, "n0 to leave the node list")
    first = next(a for a in cluster.job(long)["allocations"] if a["attempt"] == 1)
    assert first["node"] == "n0" and first["state"] == "released", first  # its history stays
    assert _event(cluster, long, "evicted") is not None
    assert cluster.agents["n0"].wait(30) == 3  # its credential is revoked: the agent stops
    assert cluster.api.delete("/nodes/n0").status_code == 404

    spare = cluster.api.post("/agent/register", json=_registration(cluster, "spare"))
    assert spare.status_code == 200, spare.text
    removed = cluster.api.delete("/nodes/spare")
    assert removed.status_code == 200 and removed.json()["work"] == [], removed.text
    assert "spare" not in cluster.nodes()
    again = cluster.api.post("/agent/register", json=_registration(cluster, "spare"))
    assert again.status_code == 200 and again.json()["node_id"] == spare.json()["node_id"], again.text
    back = cluster.api.post("/agent/register", json=_registration(cluster, "n0"))  # the force-removed name
    assert back.status_code == 200, back.text
    time.sleep(4 * float(SCALED["GPUPOOL_HEARTBEAT_S"]))  # monitor passes (one per heartbeat): not removed again
    for name in ("spare", "n0"):
        assert not cluster.nodes()[name]["cordoned"] and cluster.nodes()[name]["drain_since"] is None, name
    cluster.api.post(f"/jobs/{long}/cancel")


def test_a_drain_deadline_survives_a_control_plane_restart(tmp_path: Path):
    # the restart may take longer than the scaled max_disconnect on a loaded machine, and the job's watchdog
    # would then stop it (self-fencing) before the deadline: this case is about the deadline, so the pool waits
    env = {**SCALED, "GPUPOOL_MAX_DISCONNECT_S": "60", "GPUPOOL_LOST_AFTER_S": "61"}
    with Cluster(tmp_path / "cluster", env=env, port=stable_port()) as cluster:
        box = cluster.drop_box("restart")
        long = _busy_node(cluster, box)
        answer = cluster.api.post("/nodes/n0/drain", json={"deadline_s": 3})
        assert answer.status_code == 200, answer.text
        deadline = _at(answer.json()["deadline"])
        assert cluster.server is not None
        kill_server(cluster.server)  # before the deadline: only the next control plane can evict
        killed_at = datetime.now(UTC).timestamp()
        assert killed_at < deadline, "the kill came after the deadline: raise it"
        cluster.server = restart_server(cluster.server)
        cluster._client = cluster.server.client()
        assert cluster.nodes()["n0"]["drain_deadline"] is not None

        evicted = wait_for(lambda: _event(cluster, long, "evicted"), 60, "the eviction after the restart")
        assert _at(evicted["at"]) >= max(deadline, killed_at), (evicted, deadline, killed_at)
        assert _running_on(cluster, long, 2) == "n1"
        pair = cluster.submit(command=["true"], gpus="1", tasks=2, name="pair")  # needs n0's GPU and n1's free one
        wait_for(lambda: cluster.api.get(f"/jobs/{pair}/why").json()["kind"] != "queued", 30, "a scheduling cycle")
        assert cluster.job(pair)["state"] == "pending"  # n0 still takes nothing
        cluster.api.post(f"/jobs/{pair}/cancel")
        cluster.api.post(f"/jobs/{long}/cancel")
    assert cluster.violations == []


def test_a_gang_evicted_from_a_drained_node_stops_everywhere_before_it_is_requeued(cluster: Cluster):
    for name in ("g0", "g1"):
        cluster.start_agent(name, "1xA100-80GB")
    cluster.wait_ready(["g0", "g1"])
    gang = cluster.submit(command=["sleep", "120"], gpus="1", tasks=2, name="gang")
    cluster.wait_job(gang, ["running"])
    assert {a["node"] for a in cluster.job(gang)["allocations"]} == {"g0", "g1"}

    answer = cluster.api.post("/nodes/g0/drain", json={"deadline_s": 0})
    assert answer.status_code == 200 and {w["job"] for w in answer.json()["work"]} == {gang}, answer.text
    requeued = wait_for(lambda: _event(cluster, gang, "requeued"), 30, "the gang to be requeued")
    evicted = _event(cluster, gang, "evicted")
    assert evicted is not None and _at(evicted["at"]) <= _at(requeued["at"])
    job = cluster.job(gang)
    assert job["state"] == "pending" and job["attempt"] == 1, job  # g0 takes nothing: the gang cannot start
    stopped = [a for a in job["allocations"] if a["attempt"] == 1]
    assert len(stopped) == 2 and all(a["state"] == "released" for a in stopped), stopped
    assert _at(requeued["at"]) >= max(_at(a["released_at"]) for a in stopped) - 0.01  # requeued after both stopped

    assert cluster.api.post("/nodes/g0/undrain").status_code == 200
    wait_for(lambda: cluster.job(gang)["attempt"] == 2 and cluster.job(gang)["state"] == "running", 30,
             "the gang to run again once g0 is undrained")
    cluster.api.post(f"/jobs/{gang}/cancel")
