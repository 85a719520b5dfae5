"""`gpupool node drain | undrain | remove` and `gpupool nodes` against a live control plane (issue 43, item 2): a job
placed on a registered node (no agent: it stays "starting" there), drained with a deadline, shown as draining, a
removal refused naming it, dry runs that change nothing, undrain, and an empty node removed; each leaves its audit
row. No output carries a Python repr or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from gpupool.devtools.harness import Server

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]
REPRS = ("{'", "['", "Value error,", "Traceback")


def gpupool(server: Server, *args: str, code: int = 0) -> str:
    env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token, "COLUMNS": "200"}
    done = subprocess.run([*GPUPOOL, *args], capture_output=True, text=True, env=env, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == code, f"gpupool {' '.join(args)} exited {done.returncode}: {out}"
    assert not [r for r in REPRS if r in out], out
    return out


def register(c: httpx.Client, name: str) -> None:
    join = c.post("/join-tokens", json={}).json()["token"]
    body = {"join_token": join, "name": name, "boot_id": "boot", "cpu_milli": 8000, "memory_mib": 8192,
            "gpus": [{"index": 0, "uuid": f"GPU-{name}-0", "model": "A100", "memory_mib": 40_960, "fake": True}]}
    assert c.post("/agent/register", json=body).status_code == 200


def placed(c: httpx.Client, job_id: str) -> None:
    deadline = time.monotonic() + 30
    while c.get(f"/jobs/{job_id}").json()["state"] != "scheduled":
        assert time.monotonic() < deadline, "the job was not placed"
        time.sleep(0.1)


def test_drain_undrain_and_remove_from_the_cli(server: Server) -> None:
    with server.client() as c:
        register(c, "busy")
        job = c.post("/jobs", json={"command": ["sleep", "60"], "gpus": "1", "cpus": "0.1"}).json()["id"]
        placed(c, job)

        dry = gpupool(server, "node", "drain", "busy", "--deadline", "2h", "--dry-run")
        assert "would" in dry and job[:12] in dry
        assert c.get("/nodes").json()[0]["drain_since"] is None

        drained = json.loads(gpupool(server, "node", "drain", "busy", "--deadline", "2h", "--json"))
        assert drained["action"] == "drain" and [w["job"] for w in drained["work"]] == [job]
        table = gpupool(server, "nodes")
        assert "draining (deadline" in table and "in 1h 59m" in table, table

        refused = gpupool(server, "node", "remove", "busy", code=1)
        assert job[:12] in refused and "force" in refused
        would = gpupool(server, "node", "remove", "busy", "--force", "--dry-run")
        assert "would be removed" in would and job[:12] in would
        assert c.get(f"/jobs/{job}").json()["state"] == "scheduled"

        assert "takes work again" in gpupool(server, "node", "undrain", "busy")
        assert "draining" not in gpupool(server, "nodes")
        bad = gpupool(server, "node", "drain", "busy", "--deadline", "soon", code=2)
        assert "--deadline" in bad
        assert "not found" in gpupool(server, "node", "drain", "nowhere", code=1)

        register(c, "empty")
        assert "removed" in gpupool(server, "node", "remove", "empty")
        assert [n["name"] for n in c.get("/nodes").json()] == ["busy"]

        audited = {(r["method"], r["route"], r["object_id"], r["status"])
                   for r in c.get("/audit", params={"limit": 200}).json()["items"]}
        node = "/api/v1/nodes/{name}"
        assert {("POST", f"{node}/drain", "busy", 200), ("POST", f"{node}/undrain", "busy", 200),
                ("DELETE", node, "busy", 409), ("DELETE", node, "empty", 200)} <= audited, audited
