"""Who a node's process jobs run as (issue 41): its agent says it at registration and in every Hello, the control plane
keeps it, and `gpupool nodes` shows it (a "jobs as" column, ROOT loudly; `jobs_as` in `--json`). An agent from before
the field says nothing and shows "unknown"; a value outside the protocol's is refused naming the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx

from gpupool.devtools.hand_tls import HandTls, open_channel
from gpupool.devtools.harness import Server

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]


def register(c: httpx.Client, name: str, tls: HandTls | None = None, **extra: Any) -> httpx.Response:
    join = c.post("/join-tokens", json={}).json()["token"]
    body = {"join_token": join, "name": name, "boot_id": "boot", "cpu_milli": 8000, "memory_mib": 8192,
            "csr": tls.csr(name) if tls else "", **extra,
            "gpus": [{"index": 0, "uuid": f"GPU-{name}-0", "model": "A100", "memory_mib": 40_960, "fake": True}]}
    return c.post("/agent/register", json=body)


def shown(c: httpx.Client) -> dict[str, str]:
    return {n["name"]: n["jobs_as"] for n in c.get("/nodes").json()}


def cli_nodes(server: Server, *args: str) -> str:
    env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token, "COLUMNS": "200"}
    done = subprocess.run([*GPUPOOL, "nodes", *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_nodes_show_who_their_jobs_run_as(server: Server) -> None:
    with server.client() as c:
        tls = HandTls()
        reply = register(c, "n-root", tls, jobs_as="root")
        assert reply.status_code == 200, reply.text
        assert register(c, "n-old").status_code == 200  # an agent from before the field
        refused = register(c, "n-bad", jobs_as="superuser")
        assert refused.status_code == 422 and "jobs_as" in refused.text
        assert shown(c) == {"n-root": "root", "n-old": "unknown"}

        table = cli_nodes(server)
        assert "jobs as" in table and "ROOT" in table and "unknown" in table
        assert {n["name"]: n["jobs_as"] for n in json.loads(cli_nodes(server, "--json"))} == shown(c)

        for seq, (said, want) in enumerate(((None, "root"), ("dynamic-uid", "dynamic-uid")), start=1):
            hello = {"type": "hello", "boot_id": "boot", "seq": seq, "running": []}
            with open_channel(server, tls.context(reply.json()), reply.json()["credential"]) as ws:
                ws.send(json.dumps(hello if said is None else {**hello, "jobs_as": said}))
                while json.loads(ws.recv(timeout=30)) != {"type": "ack", "seq": seq}:
                    pass
            assert shown(c)["n-root"] == want, f"after a Hello saying {said}"
