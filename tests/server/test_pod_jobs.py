"""Kubernetes pods as jobs and allocations (services/pod_jobs.py) on real SQLite and PostgreSQL databases: one job
per pod however often it is recorded, states that only move forward, the pod's own run interval billed once at its
node's GPU model, deleted pods ended, and none of it read by the scheduler as pending work."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gpupool.devtools.harness import Postgres
from gpupool.server.check import check_jobs, check_ledger
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Allocation, Job, LedgerEntry, Org, Project, User
from gpupool.server.db.repositories import pending_job_ids
from gpupool.server.services import jobs, pod_jobs
from gpupool.server.services.metering import meter
from gpupool.server.services.pod_jobs import PodRecord

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
POD = PodRecord("k8s:uid-1", "team-a", "trainer", "default", "pending", "2", 4000, 8192, 2000, 0,
                T0.timestamp(), reason={"kind": "no_node_fits", "message": "too few GPUs", "details": []})


def bound(state: str, **times: float) -> PodRecord:
    return replace(POD, state=state, node="gpu-a", shares=((0, 1000), (1, 1000)), gpu_model="A100", reason=None,
                   bound_at=(T0 + timedelta(seconds=10)).timestamp(), **times)


STARTED = (T0 + timedelta(seconds=20)).timestamp()
ENDED = (T0 + timedelta(seconds=620)).timestamp()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'pods.db'}"
    else:
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"pods_{tmp_path.name[-12:].lower().replace('-', '_')}")
    migrate(url)
    database = Database(url)
    with database.session() as s:
        s.add(Org(id="o", name="default"))
        s.flush()
        s.add(Project(id="p", org_id="o", name="default"))
        s.add(User(id="u", org_id="o", name="ada", role="member"))
        s.flush()
        s.add(Job(id="agent-job", seq=7, org_id="o", project_id="p", user_id="u", queue="default",
                  spec={"gpus": "1", "tasks": 1, "command": ["true"]}, state="pending"))
    yield database
    database.engine.dispose()


def write(db: Database, records: list[PodRecord], gone: tuple[str, ...] = (), at: datetime = T0) -> dict[str, str]:
    with db.session() as s:
        return pod_jobs.record(s, "o", records, gone, at)


def test_a_pod_is_one_job_however_often_it_is_recorded_and_never_pending_work(db: Database) -> None:
    assert write(db, [POD]) == {"k8s:uid-1": "pending"}
    assert write(db, [POD]) == {"k8s:uid-1": "pending"}
    with db.session() as s:
        [job] = s.scalars(select(Job).where(Job.external_id.is_not(None))).all()
        project = s.get_one(Project, job.project_id)
        user = s.get_one(User, job.user_id)
        assert (project.name, user.name, job.queue, job.reason) == ("team-a", "kubernetes", "default", POD.reason)
        assert job.seq == 8, "numbered after every job numbered before"
        assert pending_job_ids(s) == ["agent-job"], "the scheduler never reads a pod's job as pending work"
        assert s.scalar(jobs._pending, {"org": "o"}) == 1, "nor counts it against the pending cap"
    for _ in range(2):  # a restarted scheduler records the same bound pod again
        write(db, [bound("running", started_at=STARTED)])
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(Job).where(Job.external_id.is_not(None))) == 1
        [allocation] = s.scalars(select(Allocation)).all()
        assert (allocation.node_id, allocation.node_name, allocation.state) == (None, "gpu-a", "running")
        assert allocation.shares == [[0, 1000, 0], [1, 1000, 0]]
        assert check_jobs(s) == []


def test_the_pods_own_interval_is_billed_once_at_its_nodes_model(db: Database) -> None:
    write(db, [POD])
    write(db, [bound("scheduled")], at=T0 + timedelta(seconds=12))
    write(db, [bound("running", started_at=STARTED)], at=T0 + timedelta(seconds=25))
    write(db, [bound("scheduled")], at=T0 + timedelta(seconds=30))  # a stale view: never moves back
    with db.session() as s:
        assert s.scalar(select(Job.state).where(Job.external_id == POD.external_id)) == "running"
    # the scheduler was down when it ended: its end is the pod's, not the moment the write sees it
    states = write(db, [bound("succeeded", started_at=STARTED, finished_at=ENDED)], at=T0 + timedelta(hours=3))
    assert states == {"k8s:uid-1": "succeeded"}
    write(db, [bound("failed", started_at=STARTED, finished_at=ENDED)], at=T0 + timedelta(hours=4))
    for _ in range(2):
        with db.session() as s:
            meter(s, T0 + timedelta(hours=5))
    with db.session() as s:
        [entry] = s.scalars(select(LedgerEntry)).all()
        assert (entry.queue, entry.model, entry.gpu_milli_seconds) == ("default", "A100", 2000 * 600)
        assert s.scalar(select(Job.state).where(Job.external_id == POD.external_id)) == "succeeded"
        assert check_ledger(s) == []


def test_pods_gone_from_the_cluster_end_and_their_allocation_is_released(db: Database) -> None:
    other = replace(POD, external_id="k8s:uid-2", name="waiter")
    write(db, [POD, other])
    write(db, [bound("running", started_at=STARTED)], at=T0 + timedelta(seconds=30))
    with db.session() as s:
        assert set(pod_jobs.open_pods(s, "o")) == {"k8s:uid-1", "k8s:uid-2"}
    gone_at = T0 + timedelta(seconds=90)
    assert write(db, [], ("k8s:uid-1", "k8s:uid-2"), at=gone_at) == {"k8s:uid-1": "cancelled",
                                                                     "k8s:uid-2": "cancelled"}
    with db.session() as s:
        [allocation] = s.scalars(select(Allocation)).all()
        assert allocation.state == "released" and allocation.released_at.replace(tzinfo=UTC) == gone_at
        assert pod_jobs.open_pods(s, "o") == {}
