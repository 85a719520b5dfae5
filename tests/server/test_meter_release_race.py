"""The meter and a release racing on one allocation, on a real SQLite and PostgreSQL (I7: no ledger entry bills after
its allocation's release).

Seen in CI (S14, SQLite): the meter read a running allocation, a cancel's release committed, and the meter then billed
the allocation to a whole period past its release. Each test stops the meter at `metering.before_advance` (its hook
is replaced by the test's) and releases the allocation from another thread and session at that moment:

* before the meter has written anything: the release commits first, and the meter must see it and skip the
  allocation (its next pass bills it to the release exactly);
* after the meter advanced another allocation's `metered_until` (it holds the write lock): the release waits for the
  meter's commit and must then release no earlier than what was billed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.devtools.harness import Postgres, free_port
from gpupool.server.check import check_ledger
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Allocation, Job, LedgerEntry, Node, Org, Project, User
from gpupool.server.scheduler.binder import released_now
from gpupool.server.services import metering
from gpupool.server.services.metering import aware, meter

T0 = datetime(2026, 11, 2, 9, 40, tzinfo=UTC)
NOW = T0 + timedelta(hours=2)  # 11:40: the meter bills the running allocations to 11:00, the last whole hour
BILLED_TO = datetime(2026, 11, 2, 11, tzinfo=UTC)
RELEASED = T0 + timedelta(minutes=50)  # 10:30, before what the meter bills
WAITS_S = 0.5  # how long the release is given to show it waits for the meter's lock


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """Two running allocations, "a" and "b", started at T0 on one node that is still heard from."""
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"meter_race_{free_port()}")
    else:
        url = f"sqlite:///{tmp_path / 'race.db'}"
    migrate(url)
    database = Database(url)
    with database.session() as s:
        s.add_all([Org(id="o", name="acme"), Project(id="p", org_id="o", name="vision"),
                   User(id="u", org_id="o", name="ada", role="member"),
                   Node(id="n", name="gpu-1", cpu_milli=8000, memory_mib=65536, last_seen=T0 + timedelta(days=9))])
        s.flush()
        s.add_all([Job(id=j, seq=i, org_id="o", project_id="p", user_id="u", queue="q", spec={}, state="running",
                       attempt=1) for i, j in enumerate(("ja", "jb"), 1)])
        s.flush()
        s.add_all([Allocation(id=a, job_id=f"j{a}", task_index=0, attempt=1, node_id="n", state="running",
                              gpu_milli=500, created_at=T0, started_at=T0) for a in ("a", "b")])
    yield database
    database.engine.dispose()


def _release(db: Database, allocation_ids: list[str]) -> None:
    """Release the allocations at RELEASED, as a cancel or a lost node does, in one transaction."""
    with db.session() as s:
        for allocation_id in allocation_ids:
            allocation = s.get(Allocation, allocation_id)
            assert allocation is not None
            released_now(allocation, "cancelled", None, s, RELEASED)


def _meter_while(db: Database, monkeypatch: pytest.MonkeyPatch, at_hit: int, release: Callable[[], list[str]],
                 ) -> threading.Thread:
    """Meter at NOW; at the `at_hit`-th `metering.before_advance`, a thread releases `release()`'s allocations and
    is given WAITS_S to finish. Returns the thread (joined after the meter's commit)."""
    hits, releasers = [], []

    def hook(name: str) -> None:
        if name == "metering.before_advance":
            hits.append(name)
            if len(hits) == at_hit:
                releasers.append(threading.Thread(target=_release, args=(db, release()), daemon=True))
                releasers[0].start()
                releasers[0].join(WAITS_S)

    monkeypatch.setattr(metering, "failpoint", hook)
    with db.session() as s:
        meter(s, NOW)
    assert releasers, "the meter billed nothing"
    releasers[0].join(30)
    assert not releasers[0].is_alive()
    return releasers[0]


def _ledger(db: Database) -> tuple[list[str], dict[str, tuple[datetime, datetime | None, datetime | None]]]:
    """check_ledger's findings, and each allocation's (last billed end, metered_until, released_at)."""
    with db.session() as s:
        ends = dict(s.execute(select(LedgerEntry.allocation_id, func.max(LedgerEntry.end)).group_by(
            LedgerEntry.allocation_id)).all())
        return check_ledger(s), {a.id: (aware(ends[a.id]) if a.id in ends else T0, a.metered_until and aware(
            a.metered_until), a.released_at and aware(a.released_at)) for a in s.scalars(select(Allocation))}


def test_a_release_committed_while_the_meter_reads_is_never_billed_past(db: Database,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _meter_while(db, monkeypatch, 1, lambda: ["a", "b"])
    problems, billed = _ledger(db)
    assert problems == []
    assert billed == {a: (T0, None, RELEASED) for a in ("a", "b")}  # nothing billed: the next pass bills it
    with db.session() as s:
        assert meter(s, NOW) == 4  # 09:40-10:00 and 10:00-10:30 of each
    problems, billed = _ledger(db)
    assert problems == []
    assert billed == {a: (RELEASED, RELEASED, RELEASED) for a in ("a", "b")}


def test_a_release_waiting_for_the_meter_is_never_before_what_it_billed(db: Database,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    first: list[str] = []
    real = metering._advanced

    def advanced(session: Session, allocation_id: str, end: datetime) -> bool:
        first.append(allocation_id)
        return real(session, allocation_id, end)

    monkeypatch.setattr(metering, "_advanced", advanced)
    _meter_while(db, monkeypatch, 2, lambda: first[:1])
    problems, billed = _ledger(db)
    assert problems == []
    assert billed[first[0]] == (BILLED_TO, BILLED_TO, BILLED_TO)  # released at what was billed, not at RELEASED
    assert billed[first[1]] == (BILLED_TO, BILLED_TO, None)
