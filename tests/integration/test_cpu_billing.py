"""A job without GPUs is accounted and billed for its CPU and memory (issue 41, finding 7): a real control plane, a
real agent with fake GPUs, and the usage report of the public API. Before, such a job cost nothing."""

from __future__ import annotations

import time
from typing import Any

from agent_cluster import SCALED, Cluster, wait_for

CENTS_PER_HOUR = 3600  # one cent per core-second and per GiB-second: a short job costs enough to see


def _usage_of(cluster: Cluster, job_id: str) -> dict[str, Any] | None:
    rows = cluster.api.get("/usage", params={"by": "job"}).json()
    return next((r for r in rows if r["key"] == job_id), None)


def test_a_job_without_gpus_is_billed_for_its_cpu_and_memory(cluster: Cluster) -> None:
    for resource in ("cpu", "memory"):
        response = cluster.api.put("/resource-prices", json={"resource": resource, "cents_per_hour": CENTS_PER_HOUR})
        assert response.status_code == 200, response.text
    cluster.start_agent("cpu-node", "2xA100-80GB")
    cluster.wait_ready(["cpu-node"])
    job_id = cluster.submit(command=["sleep", "1.5"], gpus="0", cpus="0.5", memory_mib=2048)
    assert cluster.wait_job(job_id)["state"] == "succeeded"
    time.sleep(3 * float(SCALED["GPUPOOL_METERING_INTERVAL_S"]))  # the metering after its release: its whole interval
    usage = wait_for(lambda: _usage_of(cluster, job_id), 30, "the job's usage metered")
    held_s = usage["cpu_hours"] * 3600 / 0.5  # how long the ledger says it held its half core: from its confirmed
    assert usage["gpu_hours"] == 0 and 0.5 <= held_s < 30, usage  # start to its exit, within the 1.5 s it slept
    assert abs(usage["memory_gib_hours"] * 3600 - 2 * held_s) < 0.02, usage  # 2 GiB over the same interval
    dollars = (usage["cpu_hours"] + usage["memory_gib_hours"]) * CENTS_PER_HOUR / 100
    assert usage["cost"] > 0 and abs(usage["cost"] - dollars) < 0.01, usage
