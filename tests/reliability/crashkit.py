"""Tools of the crash tests: a client that keeps submitting through control-plane crashes (its 2xx answers are the
acknowledged set, RELIABILITY.md I2), read-only database checks (integrity, jobs per idempotency key,
double-allocated GPU-seconds) and percentiles."""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import func, select, text

from gpupool.server.check import OPEN_END
from gpupool.server.db.engine import Database
from gpupool.server.db.migrating import sqlite_file
from gpupool.server.db.models import Allocation, AllocationSlot, Job
from gpupool.server.services.metering import aware


@dataclass
class Submission:
    key: str
    body: dict[str, Any]
    job_id: str | None = None  # from the first 201 answer
    acked_at: float = 0.0
    tries: int = 0


@dataclass(eq=False)
class Submitter(threading.Thread):
    """Submits `submissions` in order, each with its Idempotency-Key, retrying through refused connections, resets,
    timeouts and 5xx answers until a 201 comes back; at most `allowed` of them (raise it with `allow`). Records
    every HTTP status seen and every key that was ever answered with two different job ids (`conflicts`)."""

    base_url: str
    token: str
    submissions: list[Submission]
    pace_s: float = 0.05
    give_up_s: float = 120.0
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    conflicts: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="submitter", daemon=True)
        self._allowed = 0
        self._cond = threading.Condition()
        self._halt = threading.Event()

    def allow(self, count: int) -> None:
        with self._cond:
            self._allowed = min(len(self.submissions), self._allowed + count)
            self._cond.notify_all()

    def stop(self) -> None:
        self._halt.set()
        self.allow(0)

    @property
    def acked(self) -> dict[str, str]:
        return {s.key: s.job_id for s in self.submissions if s.job_id is not None}

    def run(self) -> None:
        try:
            with httpx.Client(base_url=f"{self.base_url}/api/v1", timeout=10,
                              headers={"Authorization": f"Bearer {self.token}"}) as client:
                for index, submission in enumerate(self.submissions):
                    with self._cond:
                        self._cond.wait_for(lambda i=index: self._allowed > i or self._halt.is_set())
                    if self._halt.is_set():
                        return
                    self._submit(client, submission)
                    time.sleep(self.pace_s)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _submit(self, client: httpx.Client, submission: Submission) -> None:
        deadline = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline and not self._halt.is_set():
            submission.tries += 1
            try:
                response = client.post("/jobs", json=submission.body, headers={"Idempotency-Key": submission.key})
            except httpx.TransportError:
                self.transport_errors += 1
                time.sleep(0.05)
                continue
            self.statuses[response.status_code] += 1
            if response.status_code == 201:
                self._acked(submission, str(response.json()["id"]))
                return
            if response.status_code < 500:
                raise AssertionError(f"submit {submission.key}: {response.status_code} {response.text}")
            time.sleep(min(1.0, float(response.headers.get("Retry-After", "0.2"))))
        raise AssertionError(f"submit {submission.key} not acknowledged in {self.give_up_s} s")

    def _acked(self, submission: Submission, job_id: str) -> None:
        if submission.job_id is None:
            submission.job_id, submission.acked_at = job_id, time.time()
        elif submission.job_id != job_id:
            self.conflicts.append(f"{submission.key}: {submission.job_id} then {job_id}")


# database checks (read-only; run with the control plane stopped or alongside it) ----------------------------


def integrity_ok(url: str) -> bool:
    """SQLite: PRAGMA integrity_check says ok. PostgreSQL: amcheck's bt_index_check passes on every B-tree index
    of the database (the extension is created if missing)."""
    path = sqlite_file(url)
    if path is not None:
        connection = sqlite3.connect(path, timeout=30)
        try:
            return connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            connection.close()
    db = Database(url)
    try:
        with db.engine.begin() as connection:
            connection.execute(text("CREATE EXTENSION IF NOT EXISTS amcheck"))
            connection.execute(text(
                "SELECT bt_index_check(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_am a ON a.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE a.amname = 'btree' AND n.nspname = 'public'")).all()
        return True
    except Exception:  # noqa: BLE001 - any failure of the check is a failed check
        return False
    finally:
        db.engine.dispose()


def jobs_per_key(url: str) -> dict[str, list[str]]:
    """Idempotency key -> the ids of the jobs stored under it (I3 wants exactly one each)."""
    db = Database(url)
    try:
        with db.session() as session:
            out: dict[str, list[str]] = defaultdict(list)
            for key, job_id in session.execute(select(Job.idempotency_key, Job.id)):
                out[str(key)].append(job_id)
            return dict(out)
    finally:
        db.engine.dispose()


def job_count(url: str) -> int:
    db = Database(url)
    try:
        with db.session() as session:
            return int(session.scalar(select(func.count()).select_from(Job)) or 0)
    finally:
        db.engine.dispose()


def double_allocated_gpu_seconds(url: str, now: datetime | None = None) -> float:
    """Seconds during which one GPU slot was held by two allocations at once, summed over slots (I1 over time)."""
    now = now or datetime.now(UTC)
    db = Database(url)
    try:
        with db.session() as session:
            created = {a.id: aware(a.created_at) for a in session.scalars(select(Allocation))}
            by_slot: dict[tuple[str, int], list[tuple[datetime, datetime, str]]] = defaultdict(list)
            for slot in session.scalars(select(AllocationSlot)):
                end = aware(slot.released_at) if slot.released_at else min(OPEN_END, now)
                by_slot[(slot.gpu_id, slot.slot)].append((created[slot.allocation_id], end, slot.allocation_id))
    finally:
        db.engine.dispose()
    total = 0.0
    for intervals in by_slot.values():
        intervals.sort()
        for i, (_, end, owner) in enumerate(intervals):
            for other_start, other_end, other in intervals[i + 1:]:
                if other != owner and other_start < end:
                    total += (min(end, other_end) - other_start).total_seconds()
    return total


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
