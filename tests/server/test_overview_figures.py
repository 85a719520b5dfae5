"""Figures the dashboard's overview reads from the API: each queue's longest-waiting pending job, and each budget's
current period (for its burn). Over real HTTP, on SQLite and on PostgreSQL; no node joins, so jobs stay pending."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpupool.server.services.metering import period_end, period_start


def _job(client, queue: str) -> dict:
    response = client.post("/jobs", json={"command": ["true"], "gpus": "1", "cpus": "0.1", "memory_mib": 10,
                                          "queue": queue})
    assert response.status_code == 201, response.text
    return response.json()


def _queue(client, name: str) -> dict:
    return next(q for q in client.get("/queues").json() if q["name"] == name)


def test_a_queue_names_when_its_longest_waiting_pending_job_was_submitted(shared_server):
    with shared_server.client() as c:
        for name in ("waiting", "idle"):
            assert c.post("/queues", json={"name": name}).status_code == 201
        first, second = _job(c, "waiting"), _job(c, "waiting")
        assert _queue(c, "idle")["oldest_pending_at"] is None
        queue = _queue(c, "waiting")
        assert queue["pending_jobs"] == 2
        assert queue["oldest_pending_at"] == first["submitted_at"] <= second["submitted_at"]
        assert c.post(f"/jobs/{first['id']}/cancel").status_code == 200
        queue = _queue(c, "waiting")
        assert (queue["pending_jobs"], queue["oldest_pending_at"]) == (1, second["submitted_at"])


@pytest.mark.parametrize("period", ["day", "week", "month"])
def test_a_budget_says_when_its_period_started_and_when_it_renews(shared_server, period: str):
    with shared_server.client() as c:
        project = f"burn-{period}"
        assert c.post("/projects", json={"name": project}).status_code == 201
        before = datetime.now(UTC)
        made = c.post("/budgets", json={"scope": "project", "name": project, "gpu_hours": 10, "period": period})
        assert made.status_code == 201, made.text
        listed = next(b for b in c.get("/budgets").json() if b["name"] == project)
    for budget in (made.json(), listed):
        start = datetime.fromisoformat(budget["period_start"]).replace(tzinfo=UTC)
        end = datetime.fromisoformat(budget["period_end"]).replace(tzinfo=UTC)
        assert start <= before < end
        assert (start, end) == (period_start(period, before), period_end(period, before))


@pytest.mark.parametrize(("period", "now", "start", "end"), [
    ("day", "2026-12-31T23:59:59", "2026-12-31T00:00:00", "2027-01-01T00:00:00"),
    ("week", "2026-12-06T10:00:00", "2026-11-30T00:00:00", "2026-12-07T00:00:00"),  # a Sunday: the week of Monday
    ("month", "2026-12-06T10:00:00", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
    ("month", "2028-01-31T12:00:00", "2028-01-01T00:00:00", "2028-02-01T00:00:00"),
    ("month", "2028-02-29T12:00:00", "2028-02-01T00:00:00", "2028-03-01T00:00:00"),
])
def test_periods_end_where_the_next_begins(period: str, now: str, start: str, end: str) -> None:
    moment = datetime.fromisoformat(now).replace(tzinfo=UTC)
    assert period_start(period, moment) == datetime.fromisoformat(start).replace(tzinfo=UTC)
    assert period_end(period, moment) == datetime.fromisoformat(end).replace(tzinfo=UTC)
    assert period_start(period, period_end(period, moment)) == period_end(period, moment)
    assert period_end(period, moment) - moment <= timedelta(days=31)
