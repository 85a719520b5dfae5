"""T4: agents with skewed wall clocks (RELIABILITY.md §3.1).

A control plane (SQLite) and three real agents whose wall clocks are off by -10 min, +10 min and +1 h
(GPUPOOL_TEST_CLOCK_SKEW_S), timings scaled by 1/20 (heartbeat H 0.25 s, lost grace G 3 s, launch-order TTL 6 s).

* Liveness runs on the control plane's monotonic clock: no node is declared lost over 2 G of normal work.
* Launch orders expire at an instant of the control plane's clock; the agents judge it on their estimate of that
  clock (the handshake's Date header), so each skewed node runs its jobs on the first attempt (without the
  correction, the nodes ahead by 10 min and 1 h refuse every order as expired).
* Billing runs on the control plane's receipt times: each job's billed interval matches what its workload really
  ran (its marker file, one host clock) within the report latency, one heartbeat plus one workload poll, plus the
  workload's own start (a Python interpreter's, before its first stamp; up to a quarter second on a loaded host).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from agent_cluster import SCALED, Cluster, marker_command, read_marker

from gpupool.devtools.figures import figure

pytestmark = pytest.mark.slow

G = float(SCALED["GPUPOOL_LOST_AFTER_S"])
H = float(SCALED["GPUPOOL_HEARTBEAT_S"])
TICK_S = 0.5  # the agent's workload poll (ChannelConfig.tick_s)
SKEWS = {"skew-minus-10m": -600.0, "skew-plus-10m": 600.0, "skew-plus-1h": 3600.0}
JOB_S = 2.0
START_S = 0.25  # the marker workload's interpreter start, billed but before its first stamp


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    made = Cluster(tmp_path / "cluster", env={**SCALED, "GPUPOOL_LAUNCH_TTL_S": "6"})
    made.__enter__()
    yield made
    made.__exit__(None, None, None)
    violations = getattr(made, "violations", [])
    assert not violations, "invariants broken:\n" + "\n".join(violations)


def moment(text: str) -> float:
    at = datetime.fromisoformat(text)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def billing_error(cluster: Cluster, job_id: str, folder: Path) -> tuple[str, float]:
    """(node, |billed seconds - seconds the workload ran|) of a finished one-task job's last attempt (inf when that
    attempt never ran to its end)."""
    allocation = max(cluster.job(job_id)["allocations"], key=lambda a: a["attempt"])
    marker = read_marker(folder / f"attempt-{allocation['attempt']}")
    if marker is None or not marker.done or allocation["started_at"] is None:
        return allocation["node"], float("inf")
    billed = moment(allocation["released_at"]) - moment(allocation["started_at"])
    return allocation["node"], abs(billed - (marker.last - marker.first))


def test_t4_skewed_agents_are_not_lost_run_first_time_and_bill_within_a_heartbeat(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch):
    for name, skew in SKEWS.items():
        monkeypatch.setenv("GPUPOOL_TEST_CLOCK_SKEW_S", str(skew))
        cluster.start_agent(name)
    monkeypatch.delenv("GPUPOOL_TEST_CLOCK_SKEW_S")
    cluster.wait_ready(list(SKEWS), timeout_s=60)
    ready_at = time.monotonic()
    folders = [cluster.drop_box(f"job{i}") for i in range(2 * len(SKEWS))]
    jobs = []
    for folder in folders:
        jobs.append(cluster.submit(command=marker_command(folder, JOB_S), gpus="1"))
    finished = [cluster.wait_job(j, timeout_s=60) for j in jobs]
    time.sleep(max(0.0, ready_at + 2 * G - time.monotonic()))
    errors = [billing_error(cluster, j, f) for j, f in zip(jobs, folders, strict=True)]
    page = httpx.get(f"{cluster.url}/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {cluster.server.token}"}).text
    lost = float(next(line.split()[1] for line in page.splitlines()
                      if line.startswith("gpupool_nodes_lost_total ")))
    nodes = cluster.nodes()
    worst = max(e for _, e in errors)
    figure(f"T4  skew=-10min,+10min,+1h false_lost={lost:.0f} first_attempt={sum(j['attempt'] == 1 for j in finished)}"
           f"/{len(jobs)} nodes_used={len({n for n, _ in errors})}/{len(SKEWS)} billing_err_max={worst:.2f}s "
           f"(H={H:g}s, poll={TICK_S:g}s)")
    assert lost == 0 and all(nodes[n]["state"] == "ready" for n in SKEWS), nodes
    assert [j["state"] for j in finished] == ["succeeded"] * len(jobs) and {j["attempt"] for j in finished} == {1}
    assert worst <= H + TICK_S + START_S, errors
