"""I10 of `gpupool check` (cancel is final) on hand-built SQLite databases: the histories the cancel-versus-bind race
left on main (found by an outside test, issue 41 findings 3 and 15) are violations; a cancel before placement and a
cancel of a running job billed to its stop are not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpupool.server.check import check_cancels, main, run_checks
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Allocation, Job, JobEvent, LedgerEntry, Node, Org, Project, User
from gpupool.server.services import rollup

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def _s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    url = f"sqlite:///{tmp_path / 'check.db'}"
    migrate(url)
    database = Database(url)
    with database.session() as s:
        s.add_all([Org(id="o", name="acme"), Project(id="p", org_id="o", name="vision"),
                   User(id="u", org_id="o", name="ada", role="member"),
                   Node(id="n", name="gpu-1", cpu_milli=8000, memory_mib=65536, last_seen=_s(3600))])
    return database


def _job(db: Database, job_id: str, state: str, events: list[tuple[str, float]],
         allocation: tuple[float | None, float | None] | None = None) -> None:
    """A job whose events happened in the order given (kind, seconds after T0); with `allocation` (confirmed start,
    release: seconds after T0, None for none) one allocation of attempt 1, billed from its start to its release."""
    with db.session() as s:
        s.add(Job(id=job_id, seq=len(job_id), org_id="o", project_id="p", user_id="u", queue="q", spec={},
                  state=state, attempt=1 if allocation else 0))
        s.flush()
        s.add_all([JobEvent(job_id=job_id, kind=kind, at=_s(at)) for kind, at in events])
        if allocation is None:
            return
        started, released = allocation
        s.add(Allocation(id=f"a-{job_id}", job_id=job_id, task_index=0, attempt=1, node_id="n",
                         state="released" if released is not None else "stopping", gpu_milli=1000, created_at=_s(0.5),
                         started_at=_s(started) if started is not None else None,
                         released_at=_s(released) if released is not None else None,
                         metered_until=_s(released) if started is not None and released is not None else None))
        if started is not None and released is not None:
            ms = int((released - started) * 1000)
            entry = LedgerEntry(source_key=f"a-{job_id}:1:{_s(started).isoformat()}", org_id="o", project_id="p",
                                user_id="u", queue="q", job_id=job_id, allocation_id=f"a-{job_id}", model="A100",
                                tags={}, start=_s(started), end=_s(released), gpu_milli=1000, gpu_milli_seconds=ms,
                                cost_micro_cents=0)
            s.add(entry)
            rollup.add(s, [entry])  # the daily totals reports read (I7), as metering keeps them


def _sound(db: Database) -> None:
    """Histories that keep cancel final: cancelled while pending; cancelled while running, billed to its stop;
    a start report after the cancel that was stopped unstarted (no started_at, no billing); never cancelled."""
    _job(db, "pending-cancel", "cancelled", [("submitted", 0), ("cancelled", 1)])
    _job(db, "running-cancel", "cancelled", [("submitted", 0), ("scheduled", 0.5), ("running", 1), ("cancelled", 10)],
         allocation=(1, 12))
    _job(db, "late-start", "cancelled", [("submitted", 0), ("scheduled", 0.5), ("cancelled", 1)],
         allocation=(None, 3))
    _job(db, "finished", "succeeded", [("submitted", 0), ("scheduled", 0.5), ("running", 1), ("succeeded", 5)],
         allocation=(1, 5))


def test_sound_histories_pass(db: Database) -> None:
    _sound(db)
    with db.session() as s:
        assert check_cancels(s) == []
    assert run_checks(db.url) == []


def test_a_cancel_overwritten_by_the_binder_is_a_violation(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    """SQLite on main: the cancel committed between the binder's read and its write; the binder set the job
    "scheduled" over "cancelled" and it ran, was billed and succeeded."""
    _sound(db)
    _job(db, "overwritten", "succeeded",
         [("submitted", 0), ("cancelled", 1), ("scheduled", 1.2), ("running", 2), ("succeeded", 6)], allocation=(2, 6))
    with db.session() as s:
        found = check_cancels(s)
    assert found == ["I10: job overwritten was cancelled but is succeeded",
                     "I10: job overwritten was scheduled after its cancel",
                     "I10: job overwritten was running after its cancel",
                     "I10: job overwritten was succeeded after its cancel",
                     "I10: allocation a-overwritten of job overwritten started after its cancel",
                     "I10: allocation a-overwritten of job overwritten billed 4000 ms after its cancel"]
    assert main(["--database-url", db.url]) == 1
    assert "I10: job overwritten was cancelled but is succeeded" in capsys.readouterr().out


def test_a_cancel_that_missed_the_allocation_is_a_violation(db: Database) -> None:
    """PostgreSQL on main: the cancel read the job before the binder committed and overwrote "scheduled" with
    "cancelled"; it saw no open allocation, sent no stop, and the attempt started and was billed."""
    _sound(db)
    _job(db, "missed", "cancelled", [("submitted", 0), ("scheduled", 0.5), ("cancelled", 1)], allocation=(2, 6))
    with db.session() as s:
        assert check_cancels(s) == [
            "I10: allocation a-missed of job missed started after its cancel",
            "I10: allocation a-missed of job missed billed 4000 ms after its cancel"]
