"""A drain answered by the standby control plane reaches the leader's scheduler (issue 43, item 2; HA on
PostgreSQL, as in test_ha): both control planes serve the API, but only the leader schedules, from its own cache.
A node drained through the standby takes no new job within a liveness pass of the leader, and takes work again
once undrained through the standby. The node registers without an agent (its allocation stays "starting")."""

from __future__ import annotations

import time

import httpx
import pytest
from test_ha import EpochWatch, Pair, pair  # noqa: F401 - the fixture

from gpupool.devtools.harness import wait_for

pytestmark = pytest.mark.slow

#: the leader's liveness pass (AgentHub.monitor: every min(1 s, heartbeat_s)), which makes its cache follow the rows
PASS_S = 1.0


def _register(server_url: str, api: httpx.Client) -> None:
    token = api.post("/join-tokens", json={}).json()["token"]
    body = {"join_token": token, "name": "solo", "boot_id": "boot", "cpu_milli": 8000, "memory_mib": 8192,
            "gpus": [{"index": 0, "uuid": "GPU-solo-0", "model": "A100", "memory_mib": 81_920, "fake": True}]}
    response = httpx.post(f"{server_url}/api/v1/agent/register", json=body, timeout=30)
    assert response.status_code == 200, response.text


def test_a_drain_through_the_standby_reaches_the_leaders_scheduler(pair: Pair) -> None:  # noqa: F811
    watch = EpochWatch(pair.url)
    watch.start()
    try:
        pair.start("a")
        wait_for(lambda: watch.epoch, 30, "a leader")
        pair.start("b")
        leader = pair.servers[pair.leader(watch)]
        standby = pair.servers[pair.other(pair.leader(watch))]
        with leader.client() as lead, standby.client(pair.token) as side:
            _register(leader.url, lead)
            drained = side.post("/nodes/solo/drain", json={})
            assert drained.status_code == 200, drained.text
            time.sleep(3 * PASS_S)
            job = side.post("/jobs", json={"command": ["true"], "gpus": "1", "cpus": "0.1"}).json()["id"]
            wait_for(lambda: side.get(f"/jobs/{job}/why").json()["kind"] != "queued", 30, "a scheduling cycle")
            time.sleep(3 * PASS_S)  # cycles run every 0.1 s: many have seen it
            assert side.get(f"/jobs/{job}").json()["state"] == "pending"

            assert side.post("/nodes/solo/undrain").status_code == 200
            wait_for(lambda: side.get(f"/jobs/{job}").json()["state"] == "scheduled", 30,
                     "the job to be placed once the node is undrained through the standby")
    finally:
        watch.stop()
