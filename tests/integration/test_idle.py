"""Idle GPUs: reported by the agent, noted on the job, and reclaimed after the queue's grace period."""

from __future__ import annotations

import pytest
from agent_cluster import wait_for

pytestmark = pytest.mark.slow


def test_idle_allocation_is_noted_then_reclaimed_only_where_the_queue_says_so(make_cluster, monkeypatch):
    monkeypatch.setenv("GPUPOOL_IDLE_WINDOW_S", "0.5")  # fake GPUs report 0 % utilisation: idle at once
    cluster = make_cluster()
    cluster.api.post("/queues", json={"name": "strict", "idle_reclaim_s": 1.5}).raise_for_status()
    cluster.api.post("/queues", json={"name": "lenient"}).raise_for_status()
    cluster.start_agent("idle-node", "2xA100-80GB")
    cluster.wait_ready(["idle-node"])
    strict = cluster.api.post("/jobs", json={"command": ["sleep", "60"], "gpus": "1", "queue": "strict"}).json()["id"]
    lenient = cluster.api.post("/jobs", json={"command": ["sleep", "60"], "gpus": "1", "queue": "lenient"}).json()["id"]
    wait_for(lambda: cluster.api.get(f"/jobs/{strict}").json()["state"] == "cancelled", 30, "the idle job reclaimed")
    kinds = [e["kind"] for e in cluster.events(strict)]
    assert "idle" in kinds and "reclaimed" in kinds
    assert cluster.api.get(f"/jobs/{strict}").json()["reason"]["kind"] == "idle_reclaimed"
    wait_for(lambda: "idle" in [e["kind"] for e in cluster.events(lenient)], 30, "the lenient job noted idle")
    assert cluster.api.get(f"/jobs/{lenient}").json()["state"] == "running"
