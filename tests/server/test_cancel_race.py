"""S14 (issue 41, findings 3 and 15): cancel is final, against a real control plane and a real agent (fake GPUs), on
SQLite and on PostgreSQL.

Client threads submit jobs and cancel each one after a random delay while the scheduler binds them. The failpoint
`binder.after_allocation_insert=sleep(BIND_HOLD_MS)` holds every binding transaction open between its read of the
jobs and its commit, so many cancels land inside it; the others land before the read or after the commit (the edges
of the race). On main a cancel inside it was overwritten by the binder (SQLite: events `submitted, cancelled,
scheduled, running, ...`) or missed the new allocation (both backends: `submitted, scheduled, cancelled`, no stop
order sent), and the job ran and was billed after its `200 cancelled`.

Passing: of the jobs answered `200 cancelled`, none leaves the state cancelled or runs again after the cancel, none
has an allocation whose start was confirmed after the cancel, none is billed past the cancel except an attempt that
had started before it (billed to its stop); and `gpupool check` finds nothing. PR tier: RACES_PR races per backend;
GPUPOOL_SOAK=1: RACES_SOAK.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # agent_cluster

from agent_cluster import SCALED, Cluster  # noqa: E402

from gpupool.devtools.figures import figure, soak  # noqa: E402
from gpupool.devtools.harness import Postgres, free_port  # noqa: E402
from gpupool.server.check import run_checks  # noqa: E402
from gpupool.server.db.engine import Database  # noqa: E402
from gpupool.server.db.models import Allocation, Job, JobEvent, LedgerEntry  # noqa: E402
from gpupool.server.services.metering import aware  # noqa: E402

RACES_PR, RACES_SOAK = 300, 1000
CLIENTS = 16  # threads, each submitting a job and then cancelling it, one job at a time
BIND_HOLD_MS = 50  # how long each binding transaction stays open between its read and its commit
CANCEL_WITHIN_S = 0.3  # each cancel comes a random time after its submission, up to this
JOB = {"command": ["sleep", "3"], "gpus": "0.1", "cpus": "0.01", "memory_mib": 1}


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A control plane whose binder holds each transaction open BIND_HOLD_MS, with one agent of 8 fake GPUs."""
    url = None
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"s14_{free_port()}")
    env = {**SCALED, "GPUPOOL_FAILPOINTS": f"binder.after_allocation_insert=sleep({BIND_HOLD_MS})"}
    with Cluster(tmp_path / "cp", env=env, database_url=url) as cp:
        cp.start_agent("race-0", fake_gpus="8xA100-80GB")
        cp.wait_ready(["race-0"])
        yield cp
    assert cp.violations == []


@dataclass(frozen=True)
class Cancel:
    job_id: str
    status: int
    state: str


def _client_run(cp: Cluster, jobs: int, seed: int) -> list[Cancel]:
    """One client: `jobs` times, submit a job, wait a random moment, cancel it; what each cancel answered."""
    rng, out = random.Random(seed), []
    assert cp.server is not None
    with cp.server.client() as c:
        for _ in range(jobs):
            submitted = c.post("/jobs", json=JOB)
            assert submitted.status_code == 201, submitted.text
            job_id = submitted.json()["id"]
            time.sleep(rng.uniform(0, CANCEL_WITHIN_S))
            answer = c.post(f"/jobs/{job_id}/cancel")
            out.append(Cancel(job_id, answer.status_code, answer.json().get("state", "")))
    return out


def _race(cp: Cluster, races: int) -> list[Cancel]:
    with ThreadPoolExecutor(CLIENTS) as pool:
        runs = [pool.submit(_client_run, cp, races // CLIENTS + (i < races % CLIENTS), i) for i in range(CLIENTS)]
        return [cancel for run in runs for cancel in run.result()]


def _settled(db: Database) -> bool:
    """Every allocation released, and metered to its release if it started (the ledger is complete; metering keeps
    whole milliseconds)."""
    with db.session() as s:
        rows = list(s.execute(select(Allocation.started_at, Allocation.released_at, Allocation.metered_until)))
    return all(released is not None and (started is None or (metered is not None and aware(metered) >= aware(released)))
               for started, released, metered in rows)


def _wait_settled(db: Database, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _settled(db):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass
class Verdict:
    started: set[str]  # jobs started (or placed, run, ended) after their 200 cancelled
    billed: set[str]  # jobs billed after it beyond an attempt that had started before it
    placed: int  # cancels that found their job already placed (the cancel came after a bind's commit)


def _verdict(db: Database, cancelled: set[str]) -> Verdict:
    """What the control plane's database says happened to the jobs answered `200 cancelled` after their cancel (the
    moment of the `cancelled` event it recorded before answering)."""
    with db.session() as s:
        jobs = {j.id: j.state for j in s.scalars(select(Job).where(Job.id.in_(cancelled)))}
        events = list(s.execute(select(JobEvent.id, JobEvent.job_id, JobEvent.kind, JobEvent.at).where(
            JobEvent.job_id.in_(cancelled)).order_by(JobEvent.id)))
        allocations = list(s.scalars(select(Allocation).where(Allocation.job_id.in_(cancelled))))
        ledger = list(s.scalars(select(LedgerEntry).where(LedgerEntry.job_id.in_(cancelled))))
    cancel = {}
    for event_id, job_id, kind, at in events:
        if kind == "cancelled":
            cancel.setdefault(job_id, (event_id, _utc(at)))
    kinds_after = {(job_id, kind) for event_id, job_id, kind, _ in events if event_id > cancel[job_id][0]}
    placed = {job_id for event_id, job_id, kind, _ in events if kind == "scheduled" and event_id < cancel[job_id][0]}
    started_at = {a.id: _utc(a.started_at) for a in allocations if a.started_at is not None}
    started = {j for j, state in jobs.items() if state != "cancelled"}
    started |= {j for j, kind in kinds_after if kind in ("scheduled", "running", "succeeded", "failed")}
    started |= {a.job_id for a in allocations if a.id in started_at and started_at[a.id] > cancel[a.job_id][1]}
    billed = {e.job_id for e in ledger if _utc(e.end) > cancel[e.job_id][1] and not (
        e.allocation_id in started_at and started_at[e.allocation_id] <= cancel[e.job_id][1])}
    return Verdict(started, billed, len(placed))


def test_s14_no_job_starts_or_is_billed_after_its_cancel(cluster: Cluster) -> None:
    races = RACES_SOAK if soak() else RACES_PR
    began = time.monotonic()
    answers = _race(cluster, races)
    assert {a.status for a in answers} == {200}, [a for a in answers if a.status != 200][:5]
    cancelled = {a.job_id for a in answers if a.state == "cancelled"}
    assert len(cancelled) == races, "a job ended before its cancel: the jobs must outlive CANCEL_WITHIN_S"
    db = Database(cluster.db_url)
    try:
        settled = _wait_settled(db, 60)
        verdict = _verdict(db, cancelled)
    finally:
        db.engine.dispose()
    violations = run_checks(cluster.db_url)
    backend = "pg" if cluster.database_url else "sqlite"
    figure(f"S14 races={len(cancelled)} cancelled_then_started={len(verdict.started)} "
           f"cancelled_then_billed={len(verdict.billed)} inv_viol={len(violations)} ({backend}; "
           f"cancelled_after_placement={verdict.placed}, {time.monotonic() - began:.0f} s)")
    assert not verdict.started, f"started after their 200 cancelled: {sorted(verdict.started)[:10]}"
    assert not verdict.billed, f"billed after their 200 cancelled: {sorted(verdict.billed)[:10]}"
    assert violations == []
    assert settled, "allocations still open or unmetered 60 s after the last cancel"
