"""Usage reports at scale (issue 7: the usage page and `gpupool usage` answer in under 1 s with 30 days of
synthetic usage on 250 nodes).

Setup, all real: a control plane on SQLite; 250 nodes x 8 A100s registered through the agent endpoint; 8
projects with 5 users each. Thirty days of finished allocations (whole GPUs and 10 %-step fractions, lognormal
run times, about 70 % of the GPUs busy) are written as job and allocation rows, then the control plane's own
meter turns them into the ledger (one entry per allocation and clock hour). Measured: `GET /api/v1/usage` by
project, user, queue and tag; `gpupool usage` as a new process (the CLI's own start-up included); and the
dashboard's usage and showback pages in headless Chromium, from navigation to every panel drawn. The baseline
measured in the same run is the same query on an empty ledger, so the ratio shows what the data costs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from rich.progress import Progress
from sqlalchemy import insert, select

from control_plane import register_nodes
from gpupool.devtools.harness import Server, start_server, stop_server
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Allocation, Job, Node, Org, Project, User
from gpupool.server.services.metering import meter

NODES, GPUS, DAYS, BUSY = 250, 8, 30, 0.7
PROJECTS, USERS_PER_PROJECT, REPEAT = 8, 5, 5
SLOW_LIVENESS = {"GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "6000", "GPUPOOL_FENCE_S": "60",
                 "GPUPOOL_METERING_INTERVAL_S": "3600"}
SIZES_MILLI = np.array([100, 200, 300, 500, 1000, 1000, 1000, 2000, 4000, 8000])
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")


def _tenants(server: Server) -> list[tuple[str, str]]:
    """Projects and their users through the API; (project name, user name) pairs."""
    pairs = []
    with server.client() as c:
        org = c.get("/whoami").json()["org"]
        for p in range(PROJECTS):
            c.post("/projects", json={"name": f"proj-{p}", "org": org}).raise_for_status()
            for u in range(USERS_PER_PROJECT):
                name = f"user-{p}-{u}"
                c.post("/users", json={"name": name, "org": org, "role": "member", "projects": [f"proj-{p}"]})
                pairs.append((f"proj-{p}", name))
    return pairs


def _allocations(rng: np.random.Generator, now: datetime) -> list[tuple[int, int, datetime, datetime]]:
    """(node, gpu_milli, start, end) of finished work keeping about BUSY of every GPU allocated for DAYS."""
    out = []
    begin = now - timedelta(days=DAYS)
    for node in range(NODES):
        for lane in range(GPUS):  # each lane is one GPU's worth of back-to-back work
            t = begin + timedelta(seconds=float(rng.uniform(0, 3600)))
            while True:
                run = timedelta(seconds=float(min(rng.lognormal(np.log(3 * 3600), 1.0), 5 * 86400)))
                gap = run * (1 - BUSY) / BUSY
                if t + run >= now:
                    break
                out.append((node, int(rng.choice(SIZES_MILLI)) if lane == 0 else 1000, t, t + run))
                t += run + gap
    return out


def populate(url: str, now: datetime, seed: int = 7) -> int:
    """Write DAYS of finished jobs and allocations, then meter them with the server's own code; ledger rows."""
    db = Database(url)
    rng = np.random.default_rng(seed)
    with db.session() as s:
        org = s.scalar(select(Org.id).where(Org.name == "default"))
        nodes = list(s.scalars(select(Node.id).order_by(Node.name)))
        projects = {p.name: p.id for p in s.scalars(select(Project))}
        users = [(projects[f"proj-{u.name.split('-')[1]}"], u.id) for u in s.scalars(select(User))
                 if u.name.startswith("user-")]
    work = _allocations(rng, now)
    jobs, allocations = [], []
    for i, (node, milli, start, end) in enumerate(work):
        project, user = users[int(rng.integers(len(users)))]
        job_id = f"benchjob{i:012d}"
        jobs.append({"id": job_id, "seq": i + 1, "org_id": org, "project_id": project, "user_id": user,
                     "queue": "default", "spec": {}, "state": "succeeded", "attempt": 1, "tags": {"team": f"t{i % 6}"},
                     "submitted_at": start, "started_at": start, "finished_at": end})
        allocations.append({"id": f"benchalloc{i:012d}", "job_id": job_id, "task_index": 0, "attempt": 1,
                            "node_id": nodes[node], "state": "released", "gpu_milli": milli, "shares": [],
                            "created_at": start, "started_at": start, "released_at": end})
    with db.engine.begin() as conn:
        for table, rows in ((Job.__table__, jobs), (Allocation.__table__, allocations)):
            for k in range(0, len(rows), 20_000):
                conn.execute(insert(table), rows[k:k + 20_000])
    with db.session() as s:
        written = meter(s, now)
    db.engine.dispose()
    return written


def _timed(call: object, repeat: int = REPEAT) -> float:
    """The median wall time of `repeat` calls, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def api_times(server: Server) -> dict[str, float]:
    with server.client() as c:
        return {by: _timed(lambda by=by: c.get("/usage", params={"by": by}).raise_for_status())
                for by in ("project", "user", "queue", "tag:team")}


def cli_time(server: Server) -> float:
    env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token}
    cmd = [sys.executable, "-m", "gpupool.cli.main", "usage", "--by", "project"]
    return _timed(lambda: subprocess.run(cmd, env=env, check=True, capture_output=True))


def page_times(server: Server) -> dict[str, float]:
    """Navigation -> every panel on the page drawn, in headless Chromium; {} without Chromium or Playwright."""
    chromium = next((p for p in CHROMIUM if os.access(p, os.X_OK)), None)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {}
    if chromium is None:
        return {}
    out = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(f"{server.url}/#/login")
        page.fill("#token", server.token)
        page.click("#login button[type=submit]")
        page.wait_for_selector("#nav")
        for route in ("usage", "showback"):
            def load(route: str = route) -> None:
                page.goto(f"{server.url}/#/login")
                page.goto(f"{server.url}/#/{route}")
                _settled(page)
            out[route] = _timed(load)
        browser.close()
    return out


def _settled(page: object, timeout_s: float = 30) -> None:
    """Until the page has panels and none is still loading (a chart, or its empty state, is drawn)."""
    deadline = time.monotonic() + timeout_s
    panels, loading = page.locator(".panel-body"), page.locator(".panel-body > p.muted", has_text="Loading")  # type: ignore[attr-defined]
    while panels.count() < 2 or loading.count() > 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the page did not finish loading")
        time.sleep(0.005)


def measure(server: Server) -> dict[str, object]:
    return {"api": api_times(server), "cli": cli_time(server), "pages": page_times(server)}


def run() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        server = start_server(data, env=SLOW_LIVENESS)
        url = f"sqlite:///{(data / 'gpupool.db').resolve()}"
        try:
            with Progress() as progress:
                task = progress.add_task("usage bench", total=4)
                register_nodes(server, NODES, GPUS)
                _tenants(server)
                progress.advance(task)
                empty = measure(server)
                progress.advance(task)
                started = time.perf_counter()
                rows = populate(url, datetime.now(UTC).replace(microsecond=0))
                metering_s = time.perf_counter() - started
                progress.advance(task)
                full = measure(server)
                progress.advance(task)
        finally:
            stop_server(server)
    _report(empty, full, rows, metering_s)
    return {"empty": empty, "full": full, "ledger_rows": rows, "metering_s": metering_s}


def _report(empty: dict[str, object], full: dict[str, object], rows: int, metering_s: float) -> None:
    print(f"usage: {NODES} nodes x {GPUS} GPUs, {DAYS} days, {rows:,} ledger rows (metered in {metering_s:.1f} s, "
          f"{rows / metering_s:,.0f} rows/s); median of {REPEAT}; target < 1 s each")
    for by, t in full["api"].items():  # type: ignore[union-attr]
        print(f"  GET /usage?by={by:<9} {1000 * t:7.0f} ms  (empty ledger {1000 * empty['api'][by]:5.0f} ms)")  # type: ignore[index]
    print(f"  gpupool usage (new process) {1000 * full['cli']:5.0f} ms  (empty ledger {1000 * empty['cli']:5.0f} ms)")  # type: ignore[operator]
    for route, t in full["pages"].items():  # type: ignore[union-attr]
        print(f"  dashboard #/{route:<9} {1000 * t:7.0f} ms to every panel drawn "
              f"(empty ledger {1000 * empty['pages'][route]:5.0f} ms)")  # type: ignore[index]
    if not full["pages"]:
        print("  dashboard pages: not measured (Chromium or Playwright missing)")
    print("command: make bench BENCH_ARGS='--suite usage'")
