"""T11 (issue 42): the only control plane is killed (SIGKILL) and stays down for a long outage while jobs run; then it
is restarted on the same data and port. Silence is not death: no attempt restarts, billing has no gap and no overlap,
the invariant checker finds nothing, and the jobs left pending are placed as soon as the agents are back.

Setup: a real control plane (SQLite) and three real agent processes with fake GPUs (tests/integration/agent_cluster.py).
PR tier: the RELIABILITY.md §2.2 timings scaled by 1/20 (heartbeat 0.25 s, unreachable after 0.75 s), with the
outage's own pair scaled the same way: max_disconnect 30 s (10 min) and an outage of 15 s (5 min), lost after 31.5 s.
GPUPOOL_SOAK=1: production timings (heartbeat 5 s, max_disconnect 600 s) and a 300 s outage.

Twenty-four jobs of half a GPU fill the twelve GPUs; five of them end during the outage (their agents keep the exit
reports in their outboxes), and three more wait pending behind the full cluster. Each job's workload writes a marker
file per attempt (start, a tick every 50 ms, done). Reported: `T11 outage_s=… jobs=24 agents=3 restarted_attempts=0
requeued=0 billing_gap_s=… billing_overlap_s=0 inv_viol=0 reconnect_s=… pending_placed_s=…` where reconnect_s is the
restart's readiness to the last agent's return and pending_placed_s its readiness to the last pending job placed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import SCALED, Cluster, marker_command, read_marker, wait_for
from sqlalchemy import select

from gpupool.devtools.figures import figure, soak
from gpupool.devtools.harness import kill_server, restart_server, stable_port
from gpupool.server.check import run_checks
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Allocation, LedgerEntry

pytestmark = pytest.mark.slow

PRODUCTION = {"GPUPOOL_HEARTBEAT_S": "5", "GPUPOOL_SUSPECT_AFTER_S": "15", "GPUPOOL_MAX_DISCONNECT_S": "600",
              "GPUPOOL_LOST_AFTER_S": "630", "GPUPOOL_KILL_GRACE_S": "10"}
SCALE = 1.0 if soak() else 1 / 20
ENV = {**SCALED, "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_LOST_AFTER_S": "31.5"}
if soak():
    ENV = {**ENV, **PRODUCTION}
OUTAGE_S = 300 * SCALE
AGENTS, GPUS, RUNNING, SHORT, PENDING = 3, "4xA100-80GB", 24, 5, 3
LONG_S = OUTAGE_S + 40  # outlives the outage and the restart by far
SHORT_S = OUTAGE_S / 3  # ends while the control plane is down


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster", env=dict(ENV), port=stable_port()) as running:
        for i in range(AGENTS):
            running.start_agent(f"n{i}", GPUS)
        running.wait_ready([f"n{i}" for i in range(AGENTS)])
        yield running
    assert running.violations == []


def _submit(cluster: Cluster, name: str, seconds: float) -> tuple[str, Path]:
    box = cluster.drop_box(name)
    return cluster.submit(command=marker_command(box, seconds), gpus="0.5", name=name), box


def test_t11_a_long_control_plane_outage_restarts_no_attempt(cluster: Cluster) -> None:
    jobs = dict(_submit(cluster, f"run{i}", SHORT_S if i < SHORT else LONG_S) for i in range(RUNNING))
    for job_id in jobs:
        cluster.wait_job(job_id, ["running"], timeout_s=60)
    waiting = dict(_submit(cluster, f"wait{i}", 2.0) for i in range(PENDING))
    assert cluster.server is not None
    kill_server(cluster.server)
    time.sleep(OUTAGE_S)
    restarted_at = time.monotonic()
    cluster.server = restart_server(cluster.server)
    ready_s = time.monotonic() - restarted_at
    cluster._client = cluster.server.client()
    reconnect_s = wait_for(lambda: _all_back(cluster, restarted_at), 60, "the agents to reconnect") - ready_s
    placed_s = wait_for(lambda: _placed(cluster, waiting, restarted_at), 60, "the pending jobs to be placed") - ready_s
    for job_id in (*jobs, *waiting):
        cluster.wait_job(job_id, timeout_s=LONG_S + 60)
    wait_for(lambda: set(_billed(cluster.db_url)) >= {*jobs, *waiting}, 30, "every job's billing")
    time.sleep(3 * float(ENV["GPUPOOL_METERING_INTERVAL_S"]))  # the last intervals metered
    outcome = _outcome(cluster, {**jobs, **waiting})
    violations = run_checks(cluster.db_url)
    figure(f"T11 outage_s={OUTAGE_S:g} ({'production' if soak() else 'scaled 1/20'}: 5 min) jobs={RUNNING} "
           f"agents={AGENTS} restarted_attempts={outcome['restarted']} requeued={outcome['requeued']} "
           f"billing_gap_s={outcome['gap']:.2f} billing_overlap_s={outcome['overlap']:.2f} inv_viol={len(violations)} "
           f"ready_s={ready_s:.1f} reconnect_s={reconnect_s:.1f} pending_placed_s={placed_s:.1f}")
    assert outcome["restarted"] == 0 and outcome["requeued"] == 0, outcome
    assert outcome["failed"] == [], outcome
    assert outcome["overlap"] == 0 and violations == []
    heartbeat = float(ENV["GPUPOOL_HEARTBEAT_S"])
    assert outcome["gap"] <= 4 * heartbeat + 1, outcome  # billing follows the workload, not the control plane


def _all_back(cluster: Cluster, since: float) -> float | None:
    """Seconds since `since` once every node is ready again (its agent reconnected), else None."""
    nodes = cluster.nodes()
    return time.monotonic() - since if all(nodes[f"n{i}"]["state"] == "ready" for i in range(AGENTS)) else None


def _placed(cluster: Cluster, waiting: dict[str, Path], since: float) -> float | None:
    states = [cluster.job(job_id)["state"] for job_id in waiting]
    return time.monotonic() - since if all(s not in ("pending", "pending_approval") for s in states) else None


def _outcome(cluster: Cluster, jobs: dict[str, Path]) -> dict[str, Any]:
    """Restarted attempts (a second marker file or an attempt above 1), requeue events, failed jobs, and per job the
    billing's gap to and overlap with its workload's own run (first to last marker stamp)."""
    restarted = requeued = 0
    failed: list[str] = []
    gap = overlap = 0.0
    billed = _billed(cluster.db_url)
    for job_id, box in jobs.items():
        job = cluster.job(job_id)
        restarted += int(job["attempt"] != 1 or (box / "attempt-2").exists())
        requeued += sum(e["kind"] in ("requeued", "preempted") for e in cluster.events(job_id))
        if job["state"] != "succeeded":
            failed.append(f"{job_id}: {job['state']}")
        marker = read_marker(box / "attempt-1")
        intervals = billed.get(job_id, [])
        if marker is None or not intervals:
            failed.append(f"{job_id}: no marker or no billing")
            continue
        overlap += sum(max(0.0, min(a_end, b_end) - max(a_start, b_start))
                       for n, (a_start, a_end) in enumerate(intervals) for b_start, b_end in intervals[n + 1:])
        covered = sum(end - start for start, end in intervals)
        gap = max(gap, (marker.last - marker.first) - covered)
    return {"restarted": restarted, "requeued": requeued, "failed": failed, "gap": gap, "overlap": overlap}


def _billed(url: str) -> dict[str, list[tuple[float, float]]]:
    """Per job, the intervals its ledger entries bill (Unix seconds)."""
    db = Database(url)
    try:
        with db.session() as session:
            rows = session.execute(select(LedgerEntry.job_id, LedgerEntry.start, LedgerEntry.end).join(
                Allocation, Allocation.id == LedgerEntry.allocation_id)).all()
    finally:
        db.engine.dispose()
    out: dict[str, list[tuple[float, float]]] = {}
    for job_id, start, end in rows:
        out.setdefault(job_id, []).append((_ts(start), _ts(end)))
    return out


def _ts(moment: datetime) -> float:
    from datetime import UTC
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
