"""Issue 43 item 5, SOR on a live server: a 2-GPU node with one GPU busy for a known time (its runtime limit) and a
2-GPU job waiting for the node. The scheduler holds the idle GPU for the waiting job (a firm reservation), so the
cluster samples say one GPU reserved and SOR (allocated + reserved over all GPUs) 1.0 against GAR 0.5."""

from __future__ import annotations

import pytest
from agent_cluster import JOB_PYTHON, Cluster, wait_for

pytestmark = pytest.mark.slow

SLEEP = [JOB_PYTHON, "-c", "import time; time.sleep(120)"]


def test_a_gpu_held_for_a_waiting_job_counts_in_sor_not_in_gar(cluster: Cluster):
    cluster.start_agent("a", fake_gpus="2xA100-80GB")
    cluster.wait_ready(["a"])
    busy = cluster.submit(command=SLEEP, gpus="1", runtime_limit_s=600)
    cluster.wait_job(busy, ("running",))
    wide = cluster.submit(command=SLEEP, gpus="2")
    reason = wait_for(lambda: (cluster.job(wide).get("reason") or {}).get("kind"), 10, "the 2-GPU job's reason")
    assert reason == "backfill_window", cluster.job(wide)

    def held() -> dict | None:
        samples = cluster.api.get("/cluster/samples").json()
        return samples[-1] if samples and samples[-1]["reserved"] > 0 else None

    sample = wait_for(held, 20, "a sample with the held GPU")
    assert sample["reserved"] == 1 and sample["allocated"] == 1 and sample["gpus"] == 2, sample
    assert sample["gar"] == 0.5 and sample["sor"] == 1.0, sample
    for job_id in (busy, wide):
        assert cluster.api.post(f"/jobs/{job_id}/cancel").status_code in (200, 202)
