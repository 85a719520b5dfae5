"""Helpers of the dashboard tests: a live control plane with agents (`Live`) and a browser tab that records what it
does (`Tab`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

try:
    from playwright.sync_api import expect
except ImportError:  # the tests skip (see conftest.py)
    expect = None

from gpupool.agent.runtime.process import load_handle
from gpupool.agent.runtime.procfs import host_boot_id, read_stat
from gpupool.devtools import jobdirs
from gpupool.devtools.harness import Server, stop_server, wait_for

CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")  # the ELF binary first: the wrapper script is noisy
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).parent / "artifacts"
#: where the docs' screenshots go (docs/dashboard.md shows them), written only when GPUPOOL_SCREENSHOTS=1
DOCS_SHOTS = Path(__file__).parents[2] / "docs" / "dashboard"
SERVER_ENV = {
    # usage and cluster samples show up within a second
    "GPUPOOL_METERING_INTERVAL_S": "0.5", "GPUPOOL_METERING_PERIOD_S": "1",
    "GPUPOOL_CYCLE_INTERVAL_S": "0.1",
    "GPUPOOL_HEARTBEAT_S": "0.5",
    "GPUPOOL_KILL_GRACE_S": "0.5",
}
AGENTS = {"node-a": "2xA100-80GB", "node-b": "4xH100-80GB"}
TERMINAL = ("succeeded", "failed", "cancelled", "denied")


@dataclass
class Live:
    """The running control plane, its agents, and an operator client of its API."""

    server: Server
    root: Path
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    clients: list[httpx.Client] = field(default_factory=list)
    folders: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    jobs_folder: Path | None = None

    def work_root(self, name: str) -> Path:
        """Agent `name`'s job work folders, where jobs running as transient uids can reach them (not under root)."""
        if self.jobs_folder is None:
            self.jobs_folder = self.folders.enter_context(jobdirs.open_folder())
        return self.jobs_folder / name

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, token: str | None = None) -> httpx.Client:
        client = self.server.client(token)
        self.clients.append(client)
        return client

    @property
    def operator(self) -> httpx.Client:
        if not self.clients:
            self.client()
        return self.clients[0]

    def ok(self, response: httpx.Response, status: int = 200) -> Any:
        assert response.status_code == status, f"{response.request.method} {response.request.url}: {response.text}"
        return response.json() if response.content else None

    def submit(self, client: httpx.Client | None = None, **body: Any) -> dict[str, Any]:
        body = {"gpus": "1", "cpus": "0.1", "memory_mib": 64, **body}
        return dict(self.ok((client or self.operator).post("/jobs", json=body), 201))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.ok(self.operator.get(f"/jobs/{job_id}")))

    def wait_job(self, job_id: str, states: tuple[str, ...] = TERMINAL, timeout_s: float = 30) -> dict[str, Any]:
        return dict(wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout_s,
                             f"job {job_id} to be {'/'.join(states)}"))

    def wait_metered(self, job_id: str, timeout_s: float = 15) -> None:
        """Until the ledger covers the finished job: every allocation released and metered, and the job's ledger
        total unchanged over three metering passes (however precisely the meter cuts its intervals)."""
        db = self.server.data_dir / "gpupool.db"
        seen: dict[str, Any] = {"total": None, "since": 0.0}

        def covered() -> bool:
            rows = sqlite(db, "SELECT metered_until, released_at FROM allocations WHERE job_id = ?", job_id)
            if not rows or any(m is None or r is None for m, r in rows):
                return False
            total = sqlite(db, "SELECT COALESCE(SUM(gpu_milli_seconds), 0) FROM ledger WHERE job_id = ?", job_id)
            if total != seen["total"]:
                seen.update(total=total, since=time.monotonic())
            return time.monotonic() - seen["since"] >= 3 * float(SERVER_ENV["GPUPOOL_METERING_INTERVAL_S"])
        wait_for(covered, timeout_s, f"the ledger to cover job {job_id}")

    def ledger_hours(self, by: str = "project") -> dict[str, float]:
        """GPU-hours per project (or user) straight from the ledger table, rounded as the API rounds them."""
        names = {"project": "SELECT p.name, SUM(l.gpu_milli_seconds) FROM ledger l JOIN projects p "
                            "ON p.id = l.project_id GROUP BY p.name",
                 "user": "SELECT u.name, SUM(l.gpu_milli_seconds) FROM ledger l JOIN users u "
                         "ON u.id = l.user_id GROUP BY u.name"}
        rows = sqlite(self.server.data_dir / "gpupool.db", names[by])
        return {name: round(total / 1000 / 3600, 6) for name, total in rows}


def sqlite(path: Path, query: str, *args: object) -> list[tuple[Any, ...]]:
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as conn:
        return list(conn.execute(query, args))


def start_agent(live: Live, name: str, gpus: str) -> None:
    folder = live.root / "agents" / name
    folder.mkdir(parents=True, exist_ok=True)
    join = live.ok(live.operator.post("/join-tokens", json={}), 201)["token"]
    command = [sys.executable, "-m", "gpupool.cli.main", "agent", "--server", live.url, "--join-token", join,
               "--data-dir", str(folder / "data"), "--name", name, "--fake-gpus", gpus,
               "--work-dir", str(live.work_root(name))]
    with open(folder / "agent.log", "ab") as log:
        live.agents[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_live(live: Live) -> None:
    """Cancel what still runs, stop the agents (and any workload they left), then the server."""
    cancelled = [job["id"] for job in live.operator.get("/jobs", params={"limit": 500}).json().get("items", [])
                 if job["state"] not in TERMINAL]
    for job_id in cancelled:
        live.operator.post(f"/jobs/{job_id}/cancel")
    for job_id in cancelled:
        try:
            live.wait_job(job_id, timeout_s=10)
        except AssertionError:
            pass  # killed below
    for process in live.agents.values():
        process.send_signal(signal.SIGTERM)
    for process in live.agents.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _kill_workloads(live.root / "agents")
    for client in live.clients:
        client.close()
    stop_server(live.server)
    live.folders.close()


def _kill_workloads(agents: Path) -> None:
    """SIGKILL workload process groups the agents left behind (checked against pid reuse)."""
    boot = host_boot_id()
    for state in agents.glob("*/data/workloads/*/state.json"):
        handle = load_handle(state)
        if handle is None or handle.host_boot_id != boot:
            continue
        stat = read_stat(handle.pgid)
        if stat is not None and stat.start_ticks == handle.start_ticks and not stat.is_dead:
            try:
                os.killpg(handle.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Tab:
    """A browser page plus what it did: JavaScript errors and every request it sent."""

    page: Any
    base: str
    errors: list[str] = field(default_factory=list)
    requests: list[tuple[str, str, float]] = field(default_factory=list)  # (method, url, time.monotonic())
    failures: list[tuple[int, str]] = field(default_factory=list)  # (status, url) of 4xx/5xx answers

    def go(self, route: str) -> None:
        self.page.goto(f"{self.base}/#/{route}")

    def login(self, token: str) -> None:
        self.go("login")
        self.page.fill("#token", token)
        self.page.click("#login button[type=submit]")
        expect(self.page.locator("#nav")).to_be_visible()

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def doc_shot(self, name: str) -> Path | None:
        """The visible part of the page as docs/dashboard/NAME.png, in at most 256 colours (small in git), when
        GPUPOOL_SCREENSHOTS=1 is set; otherwise nothing is written (the pages' times and ids differ on every run)."""
        if os.environ.get("GPUPOOL_SCREENSHOTS") != "1":
            return None
        from io import BytesIO

        from PIL import Image

        self.page.mouse.move(0, 0)  # no hover effect in the picture
        image = Image.open(BytesIO(self.page.screenshot(animations="disabled", caret="hide")))
        path = DOCS_SHOTS / f"{name}.png"
        path.parent.mkdir(exist_ok=True)
        image.convert("RGB").quantize(256).save(path, optimize=True)
        return path

    def settle(self) -> None:
        """Until no panel is still loading."""
        expect(self.page.locator(".panel-body > p.muted", has_text=re.compile("^Loading"))).to_have_count(0)

    def script_errors(self) -> list[str]:
        return [e for e in self.errors if not e.startswith("Failed to load resource")]
