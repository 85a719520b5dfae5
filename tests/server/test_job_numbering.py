"""Job numbers (`jobs.seq`: the submission order the scheduler and the list's page cursor read) are unique, even for
submissions that arrive at the same moment, on SQLite and on PostgreSQL.

Regression: `max(seq) + 1` read outside the inserting transaction's lock gave two concurrent submissions the same
number, and a page cursor (`seq < cursor`) then skipped one of them."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
from sqlalchemy import select

from gpupool.devtools.harness import Server
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Job

THREADS, EACH = 8, 12


def _submit_concurrently(server: Server) -> list[str]:
    start, ids, errors = threading.Barrier(THREADS), [], []

    def worker() -> None:
        with server.client() as client:
            start.wait()
            for _ in range(EACH):
                response = client.post("/jobs", json={"command": ["true"], "gpus": "0", "cpus": "0.1"})
                (ids if response.status_code == 201 else errors).append(response.json().get("id", response.text))

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    return ids


def _every_page(client: httpx.Client) -> list[str]:
    seen, cursor = [], None
    while True:
        page = client.get("/jobs", params={"limit": 5, **({"cursor": cursor} if cursor else {})}).json()
        seen += [job["id"] for job in page["items"]]
        cursor = page.get("next_cursor")
        if not cursor:
            return seen


def test_concurrent_submissions_get_unique_numbers_and_every_page_shows_each_once(server: Server) -> None:
    ids = _submit_concurrently(server)
    assert len(ids) == len(set(ids)) == THREADS * EACH
    db = Database(server.database_url or f"sqlite:///{server.data_dir / 'gpupool.db'}")
    with db.session() as session:
        seqs = Counter(session.scalars(select(Job.seq)))
    db.engine.dispose()
    assert sum(seqs.values()) == THREADS * EACH
    assert [seq for seq, n in seqs.items() if n > 1] == []
    assert sorted(seqs) == list(range(1, THREADS * EACH + 1))  # no gaps either: a refused number is not skipped
    with server.client() as client:
        listed = _every_page(client)
    assert Counter(listed) == Counter(ids)
