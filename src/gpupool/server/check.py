"""`python -m gpupool.server.check [--data-dir D] [--database-url URL]` (and `gpupool check`): verify RELIABILITY.md's
invariants on SQLite or PostgreSQL, read-only. Exit code 1 and one line per violation if any fails. The database is
found as the control plane finds it: --database-url, else $GPUPOOL_DATABASE_URL, else SQLite in the data dir.

I1  no GPU slot held by two allocations at once (open, and over time)
I3  one job per (organisation, idempotency key)
I4  attempts only grow: no allocation carries an attempt above its job's
I5  at most one attempt of a job holds resources at a time
I7  the ledger balances: each entry's amounts follow from its interval, each allocation's entries add up
    to its billable interval exactly, no entry bills after the allocation was released, and the daily
    usage totals (what reports read) equal the ledger summed per day and group
I8  no overlap billing: a job's attempts never bill the same instant
I10 cancel is final: a cancelled job stays cancelled, no event after its cancel places, starts or ends it again, no
    allocation of it confirms a start after the cancel, and no ledger entry bills past the cancel except for an
    allocation whose start was confirmed before it (billed to its stop: I7 bounds it by the release)
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, make_url, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from gpupool.server.db.engine import Database, debug, failure
from gpupool.server.db.models import Allocation, AllocationSlot, Job, JobEvent, LedgerEntry, UsageDaily
from gpupool.server.services.metering import aware, milliseconds
from gpupool.server.services.rollup import AMOUNTS, day_of, tags_key
from gpupool.server.settings import Settings

OPEN_END = datetime.max.replace(tzinfo=UTC)
#: the events that end a job by cancelling it (by request, or an idle reclaim)
CANCELS = ("cancelled", "reclaimed")
#: the events that place, start or end a job: none may follow its cancel
RESTARTS = ("scheduled", "running", "succeeded", "failed", "requeued", "preempted", "timed_out")


def _overlaps(intervals: list[tuple[datetime, datetime, str]]) -> list[tuple[str, str]]:
    intervals.sort()
    return [(a[2], b[2]) for a, b in zip(intervals, intervals[1:], strict=False) if b[0] < a[1] and a[2] != b[2]]


def check_slots(session: Session) -> list[str]:
    out = []
    open_dupes = session.execute(select(AllocationSlot.gpu_id, AllocationSlot.slot, func.count()).where(
        AllocationSlot.released_at.is_(None)).group_by(AllocationSlot.gpu_id, AllocationSlot.slot).having(
        func.count() > 1)).all()
    out += [f"I1: GPU {g} slot {s} is held by {n} open allocations" for g, s, n in open_dupes]
    created = {a.id: aware(a.created_at) for a in session.scalars(select(Allocation))}
    by_slot: dict[tuple[str, int], list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for slot in session.scalars(select(AllocationSlot)):
        end = aware(slot.released_at) if slot.released_at else OPEN_END
        by_slot[(slot.gpu_id, slot.slot)].append((created[slot.allocation_id], end, slot.allocation_id))
    for key, intervals in by_slot.items():
        out += [f"I1: GPU {key[0]} slot {key[1]} held by {a} and {b} at once" for a, b in _overlaps(intervals)]
    return out


def check_jobs(session: Session) -> list[str]:
    out = []
    keys = session.execute(select(Job.org_id, Job.idempotency_key, func.count()).where(
        Job.idempotency_key.is_not(None)).group_by(Job.org_id, Job.idempotency_key).having(func.count() > 1)).all()
    out += [f"I3: idempotency key {k!r} maps to {n} jobs" for _, k, n in keys]
    jobs = {j.id: j for j in session.scalars(select(Job))}
    active: dict[str, set[int]] = defaultdict(set)
    for allocation in session.scalars(select(Allocation)):
        job = jobs.get(allocation.job_id)
        if job is not None and allocation.attempt > job.attempt:
            out.append(f"I4: allocation {allocation.id} has attempt {allocation.attempt} > job's {job.attempt}")
        if allocation.state in ("starting", "running"):
            active[allocation.job_id].add(allocation.attempt)
    out += [f"I5: job {j} has attempts {sorted(a)} active at once" for j, a in active.items() if len(a) > 1]
    return out


def check_ledger(session: Session) -> list[str]:
    out = []
    allocations = {a.id: a for a in session.scalars(select(Allocation))}
    billed: dict[str, int] = defaultdict(int)
    by_job: dict[str, list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for entry in session.scalars(select(LedgerEntry)):
        start, end = aware(entry.start), aware(entry.end)
        held = (entry.gpu_milli, entry.cpu_milli, entry.memory_mib)
        if (entry.gpu_milli_seconds, entry.cpu_milli_seconds, entry.memory_mib_seconds) != tuple(
                amount * milliseconds(start, end) // 1000 for amount in held):
            out.append(f"I7: ledger {entry.source_key} amount does not follow from its interval")
        allocation = allocations.get(entry.allocation_id)
        if allocation is not None and allocation.released_at is not None and end > aware(allocation.released_at):
            out.append(f"I7: ledger {entry.source_key} bills after its allocation was released")
        billed[entry.allocation_id] += milliseconds(start, end)
        by_job[entry.job_id].append((start, end, f"{entry.allocation_id}:{entry.source_key.split(':')[1]}"))
    for allocation_id, billed_ms in billed.items():
        allocation = allocations.get(allocation_id)
        if allocation is None or allocation.started_at is None or allocation.metered_until is None:
            continue
        expected = milliseconds(aware(allocation.started_at), aware(allocation.metered_until))
        if expected != billed_ms:
            out.append(f"I7: allocation {allocation_id} billed {billed_ms} ms of {expected} ms metered")
    for job_id, intervals in by_job.items():
        attempts = [(s, e, a.rsplit(":", 1)[1]) for s, e, a in intervals]
        out += [f"I8: job {job_id} attempts {a} and {b} billed the same time" for a, b in _overlaps(attempts)]
    return out


def check_cancels(session: Session) -> list[str]:
    """I10 (see the module docstring). A job's cancel is its first cancelling event: the order of events is their
    ids', the moment of the cancel its `at`, compared with allocations' confirmed starts and ledger intervals."""
    cancelled = select(JobEvent.job_id).where(JobEvent.kind.in_(CANCELS))
    cancels: dict[str, tuple[int, datetime]] = {}
    for event_id, job_id, at in session.execute(select(JobEvent.id, JobEvent.job_id, JobEvent.at).where(
            JobEvent.kind.in_(CANCELS)).order_by(JobEvent.id)):
        cancels.setdefault(job_id, (event_id, aware(at)))
    out = [f"I10: job {job_id} was cancelled but is {state}" for job_id, state in session.execute(
        select(Job.id, Job.state).where(Job.id.in_(cancelled), Job.state != "cancelled"))]
    out += [f"I10: job {job_id} was {kind} after its cancel" for event_id, job_id, kind in session.execute(
        select(JobEvent.id, JobEvent.job_id, JobEvent.kind).where(JobEvent.job_id.in_(cancelled),
                                                                  JobEvent.kind.in_(RESTARTS)).order_by(JobEvent.id))
            if event_id > cancels[job_id][0]]
    started: dict[str, datetime | None] = {}
    for allocation in session.scalars(select(Allocation).where(Allocation.job_id.in_(cancelled))):
        start = started[allocation.id] = aware(allocation.started_at) if allocation.started_at else None
        if start is not None and start > cancels[allocation.job_id][1]:
            out.append(f"I10: allocation {allocation.id} of job {allocation.job_id} started after its cancel")
    billed: dict[tuple[str, str], int] = defaultdict(int)  # (job, allocation) -> ms billed after the cancel
    for entry in session.scalars(select(LedgerEntry).where(LedgerEntry.job_id.in_(cancelled))):
        cancelled_at, start = cancels[entry.job_id][1], started.get(entry.allocation_id)
        if aware(entry.end) > cancelled_at and (start is None or start > cancelled_at):
            billed[(entry.job_id, entry.allocation_id)] += milliseconds(max(aware(entry.start), cancelled_at),
                                                                        aware(entry.end))
    return out + [f"I10: allocation {allocation_id} of job {job_id} billed {ms} ms after its cancel"
                  for (job_id, allocation_id), ms in billed.items()]


def check_rollup(session: Session) -> list[str]:
    """I7 for reports: usage_daily holds exactly the ledger's sums per (day, org, project, user, queue, model,
    tags)."""
    expected: dict[tuple[object, ...], list[int]] = defaultdict(lambda: [0] * (len(AMOUNTS) + 1))
    for entry in session.scalars(select(LedgerEntry)):
        key = (day_of(aware(entry.start)), entry.org_id, entry.project_id, entry.user_id, entry.queue, entry.model,
               tags_key(entry.tags))
        total = expected[key]
        for i, amount in enumerate(AMOUNTS):
            total[i] += getattr(entry, amount)
        total[-1] += 1
    found = {(day_of(aware(r.day)), r.org_id, r.project_id, r.user_id, r.queue, r.model, r.tags_key):
             [*(getattr(r, a) for a in AMOUNTS), r.entries] for r in session.scalars(select(UsageDaily))}
    return [f"I7: daily usage {key[0]:%Y-%m-%d} {key[2]}/{key[4]} holds {found.get(key)} but the ledger sums to {sums}"
            for key, sums in expected.items() if found.get(key) != sums] + [
            f"I7: daily usage {key[0]:%Y-%m-%d} {key[2]}/{key[4]} has no ledger entries" for key in found
            if key not in expected]


def run_checks(url: str) -> list[str]:
    """Every violation found in the database at `url`, read from one snapshot (the control plane may be running)."""
    db = Database(url)
    try:
        with db.session() as session:
            _one_snapshot(session)
            return (check_slots(session) + check_jobs(session) + check_ledger(session) + check_rollup(session)
                    + check_cancels(session))
    finally:
        db.engine.dispose()


def _one_snapshot(session: Session) -> None:
    """Make every later query of `session` read the same snapshot, so that a live control plane's commits between
    two of them (an allocation and its slots, a ledger entry and its allocation's metered_until) cannot look like a
    violation. SQLite: an explicit BEGIN (pysqlite opens transactions only for writes); PostgreSQL: REPEATABLE READ."""
    if session.get_bind().dialect.name == "sqlite":
        session.connection().exec_driver_sql("BEGIN")
    else:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def database_url(data_dir: Path, url: str | None) -> str:
    """The database a control plane started with `data_dir` and `url` uses (`Settings.db_url`, with
    $GPUPOOL_DATABASE_URL as the server reads it). ValueError naming the file when that is an SQLite database that
    does not exist: checking one would create it empty."""
    found = Settings(data_dir=data_dir, database_url=url or os.environ.get("GPUPOOL_DATABASE_URL", "")).db_url
    parsed = make_url(found)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
            and not Path(parsed.database).is_file():
        raise ValueError(f"no gpupool database at {parsed.database}: pass --data-dir DIR (the control plane's data "
                         "dir) or --database-url URL")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool check", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("gpupool-data"))
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    try:
        url = database_url(args.data_dir, args.database_url)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"database: {make_url(url).render_as_string(hide_password=True)}")
    try:
        violations = run_checks(url)
    except DBAPIError as exc:  # a wrong password, a database down or missing: one line, the traceback on --debug
        if debug():
            traceback.print_exc()
        print(f"error: {failure(exc, url)}", file=sys.stderr)
        return 2
    for line in violations:
        print(line)
    print(f"{len(violations)} invariant violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
