"""The metering ledger on a real SQLite database: period-aligned entries, whole periods for running work,
idempotent re-runs, exact balance against the allocation interval (I7), CPU and memory priced beside GPUs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gpupool.server.check import check_ledger, check_rollup
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Allocation, Job, LedgerEntry, Node, Org, Price, Project, ResourcePrice, User
from gpupool.server.services.metering import DEFAULT_RESOURCE_CENTS, meter
from gpupool.server.services.rollup import totals

T0 = datetime(2026, 11, 2, 9, 40, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url)
    database = Database(url)
    with database.session() as s:
        s.add_all([Org(id="o", name="acme"), Project(id="p", org_id="o", name="vision"),
                   User(id="u", org_id="o", name="ada", role="member"),
                   Node(id="n", name="gpu-1", cpu_milli=8000, memory_mib=65536, last_seen=T0 + timedelta(days=9))])
        s.flush()
        s.add(Job(id="j", seq=1, org_id="o", project_id="p", user_id="u", queue="q", spec={}, state="running",
                  attempt=1))
        s.flush()
        s.add(Allocation(id="a", job_id="j", task_index=0, attempt=1, node_id="n", state="running",
                         gpu_milli=500, created_at=T0, started_at=T0))
    return database


def _entries(db: Database) -> list[tuple[datetime, datetime, int]]:
    with db.session() as s:
        return [(e.start.replace(tzinfo=UTC), e.end.replace(tzinfo=UTC), e.gpu_milli_seconds)
                for e in s.scalars(select(LedgerEntry).order_by(LedgerEntry.start))]


def test_running_allocation_is_metered_in_whole_periods_only(db: Database) -> None:
    with db.session() as s:
        assert meter(s, T0 + timedelta(minutes=15)) == 0  # 09:40 -> 09:55: the hour is not over
    with db.session() as s:
        assert meter(s, T0 + timedelta(minutes=50)) == 1  # 10:30: 09:40-10:00 is
    assert _entries(db) == [(T0, datetime(2026, 11, 2, 10, tzinfo=UTC), 500 * 20 * 60)]


def test_each_entry_stays_inside_one_period_and_rerunning_bills_nothing(db: Database) -> None:
    now = T0 + timedelta(hours=3, minutes=5)  # 12:45
    with db.session() as s:
        written = meter(s, now)
    with db.session() as s:
        assert meter(s, now) == 0
    entries = _entries(db)
    assert written == len(entries) == 3  # 09:40-10:00, 10-11, 11-12
    assert [(e[0].hour, e[1].hour, e[1].minute) for e in entries] == [(9, 10, 0), (10, 11, 0), (11, 12, 0)]
    assert [e[2] for e in entries] == [500 * 1200, 500 * 3600, 500 * 3600]


def test_a_released_allocation_is_metered_to_its_release_exactly(db: Database) -> None:
    released = T0 + timedelta(hours=1, minutes=7, seconds=3, milliseconds=250)  # 10:47:03.250
    with db.session() as s:
        meter(s, T0 + timedelta(minutes=30))
        allocation = s.get(Allocation, "a")
        assert allocation is not None
        allocation.released_at, allocation.state = released, "released"
    with db.session() as s:
        meter(s, released + timedelta(hours=5))
        assert check_ledger(s) == []
        total = s.scalar(select(func.sum(LedgerEntry.gpu_milli_seconds)))
    assert total == 500 * (released - T0) // timedelta(milliseconds=1) // 1000
    assert _entries(db)[-1][1] == released


def test_a_shorter_period_meters_running_work_sooner(db: Database) -> None:
    with db.session() as s:
        assert meter(s, T0 + timedelta(seconds=2, milliseconds=500), period_s=1) == 2
    assert [e[2] for e in _entries(db)] == [500, 500]


def _spread_allocations(db: Database) -> None:
    """Five more allocations over three days, two projects' worth of tags, one still running."""
    with db.session() as s:
        s.add(Project(id="p2", org_id="o", name="nlp"))
        s.flush()
        for k in range(5):
            start = T0 + timedelta(hours=17 * k, minutes=7 * k)
            job = Job(id=f"j{k}", seq=10 + k, org_id="o", project_id="p" if k % 2 else "p2", user_id="u", queue="q",
                      spec={}, state="running", attempt=1, tags={"team": f"t{k % 3}"})
            s.add(job)
            s.flush()
            s.add(Allocation(id=f"a{k}", job_id=job.id, task_index=0, attempt=1, node_id="n", state="running",
                             gpu_milli=100 * (k + 1), created_at=start, started_at=start,
                             released_at=None if k == 4 else start + timedelta(hours=5 + 3 * k, seconds=k)))


@pytest.mark.parametrize("by", ["project", "user", "queue", "model", "tag:team", "job"])
def test_usage_over_any_window_equals_the_ledger_summed_directly(db: Database, by: str) -> None:
    _spread_allocations(db)
    with db.session() as s:
        meter(s, T0 + timedelta(days=3, hours=4))
        assert check_rollup(s) == []
    with db.session() as s:
        meter(s, T0 + timedelta(days=4))  # a second pass adds to existing days
        assert check_rollup(s) == []
        entries = list(s.scalars(select(LedgerEntry)))
        for lo_h, hi_h in [(0, 200), (-20, 30), (3.5, 50.25), (14.33, 14.9), (24, 72), (60, 500)]:
            lo, hi = T0 + timedelta(hours=lo_h), T0 + timedelta(hours=hi_h)
            direct = sum(e.gpu_milli_seconds for e in entries if lo <= e.start.replace(tzinfo=UTC) < hi)
            assert sum(r[2] for r in totals(s, lo, hi, by)) == direct, (lo_h, hi_h)


def test_cpu_and_memory_are_metered_and_priced_like_gpus(db: Database) -> None:
    """An allocation's CPU and memory are billed over the same intervals as its GPUs, at the CPU-core-hour and
    GiB-hour prices (the operator's, else the defaults), in exact integers; the checks of I7 still balance."""
    with db.session() as s:
        allocation = s.get(Allocation, "a")
        assert allocation is not None
        allocation.cpu_milli, allocation.memory_mib = 2500, 3072
        s.add_all([ResourcePrice(resource="cpu", cents_per_hour=36), Price(model="", cents_per_gpu_hour=0)])
    with db.session() as s:
        meter(s, T0 + timedelta(hours=2, minutes=30))  # 12:10: 09:40-10:00, 10-11, 11-12
        assert check_ledger(s) == [] and check_rollup(s) == []
        entries = list(s.scalars(select(LedgerEntry).order_by(LedgerEntry.start)))
    seconds = [1200, 3600, 3600]
    assert [(e.cpu_milli_seconds, e.memory_mib_seconds) for e in entries] == [(2500 * t, 3072 * t) for t in seconds]
    memory_cents = DEFAULT_RESOURCE_CENTS["memory"]  # 1 cent per GiB-hour: 3 GiB cost 3 cents an hour
    assert [e.cost_micro_cents for e in entries] == [
        2500 * t * 36 * 10**6 // 3_600_000 + 3072 * t * memory_cents * 10**6 // (1024 * 3600) for t in seconds]
