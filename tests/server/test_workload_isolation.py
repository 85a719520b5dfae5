"""Workload isolation through the real control plane (RELIABILITY.md §3.2 S8, CPU tier), on SQLite and PostgreSQL:

- a node whose agent did not vouch for its container toolkit (`untrusted_images` false) never runs a job with an
  image, and the job's "why pending" says so; jobs without an image run there; an agent that reconnects says it
  again in its Hello (a toolkit upgraded, or a node registered before the flag existed);
- fractions of one GPU go only to jobs of one organisation: another organisation's fraction waits, while the same
  organisation's fraction shares the GPU (why it waits is the scheduler's to say: "GPU shared by another group",
  or a reservation; tests/core/test_share_groups.py checks the phrase).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import Any

import httpx

from gpupool.devtools.hand_tls import HandTls, open_channel
from gpupool.devtools.harness import Server

IMAGE = "registry.example.com/team/train:1.0"


def register(c: httpx.Client, name: str, gpus: int, untrusted_images: bool,
             tls: HandTls | None = None) -> dict[str, Any]:
    """Join a node (with `tls`'s CSR when given: it may open its channel); the registration reply."""
    join = c.post("/join-tokens", json={}).json()["token"]
    body = {"join_token": join, "name": name, "boot_id": "boot", "cpu_milli": 64_000, "memory_mib": 65_536,
            "untrusted_images": untrusted_images, "csr": tls.csr(name) if tls else "",
            "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "A100", "memory_mib": 40_960, "fake": True}
                     for i in range(gpus)]}
    response = c.post("/agent/register", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def submit(c: httpx.Client, **fields: Any) -> str:
    response = c.post("/jobs", json={"command": ["sleep", "600"], **fields})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def settled(c: httpx.Client, job_id: str) -> dict[str, Any]:
    """The job once the scheduler has looked at it: placed, or pending with a reason other than "queued"."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = c.get(f"/jobs/{job_id}").json()
        if job["state"] != "pending" or (job.get("reason") or {}).get("kind", "queued") != "queued":
            return dict(job)
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} was never scheduled or given a reason")


def nodes_of(job: dict[str, Any]) -> list[str]:
    return [a["node"] for a in job["allocations"]]


def test_an_image_job_never_runs_on_a_node_without_a_trusted_toolkit(server: Server, s8) -> None:
    """The S8 part is recorded by the SQLite run (the PostgreSQL run checks the same)."""
    part = contextlib.nullcontext() if server.database_url else s8.case("toolkit_gate_scheduler")
    with part, server.client() as c:
        register(c, "gated", gpus=2, untrusted_images=False)
        image_job = submit(c, gpus="1", image=IMAGE)
        plain_job = submit(c, gpus="1")
        assert nodes_of(settled(c, plain_job)) == ["gated"]
        waiting = settled(c, image_job)
        assert waiting["state"] == "pending"
        why = c.get(f"/jobs/{image_job}/why").json()
        assert why["kind"] == "no_node_fits" and "1 node refuses untrusted images" in why["message"], why
        register(c, "vetted", gpus=1, untrusted_images=True)
        deadline = time.monotonic() + 30
        while c.get(f"/jobs/{image_job}").json()["state"] == "pending":
            assert time.monotonic() < deadline, "the image job was not placed on the vetted node"
            time.sleep(0.1)
        assert nodes_of(c.get(f"/jobs/{image_job}").json()) == ["vetted"]
        flags = {n["name"]: n["untrusted_images"] for n in c.get("/nodes").json()}
        assert flags == {"gated": False, "vetted": True}


def test_a_reconnecting_agent_updates_the_verdict_in_its_hello(server: Server) -> None:
    with server.client() as c:
        tls = HandTls()
        reply = register(c, "upgraded", gpus=1, untrusted_images=False, tls=tls)
        image_job = submit(c, gpus="1", image=IMAGE)
        assert settled(c, image_job)["state"] == "pending"
        for seq, (verdict, want) in enumerate(((None, False), (True, True), (False, False)), start=1):
            hello = {"type": "hello", "boot_id": "boot", "seq": seq, "running": []}
            with open_channel(server, tls.context(reply), reply["credential"]) as ws:
                ws.send(json.dumps(hello if verdict is None else {**hello, "untrusted_images": verdict}))
                while json.loads(ws.recv(timeout=30)) != {"type": "ack", "seq": seq}:
                    pass  # a launch order re-sent for the placed job
            flags = {n["name"]: n["untrusted_images"] for n in c.get("/nodes").json()}
            assert flags["upgraded"] is want, f"after a Hello saying {verdict}"
            if want:
                deadline = time.monotonic() + 30
                while c.get(f"/jobs/{image_job}").json()["state"] == "pending":
                    assert time.monotonic() < deadline, "the image job was not placed once the node vouched"
                    time.sleep(0.1)
                assert nodes_of(c.get(f"/jobs/{image_job}").json()) == ["upgraded"]


def test_a_shared_gpu_holds_jobs_of_one_organisation_only(server: Server) -> None:
    with server.client() as op:
        org = f"acme-{uuid.uuid4().hex[:6]}"
        assert op.post("/orgs", json={"name": org}).status_code == 201
        assert op.post("/projects", json={"name": "lab", "org": org}).status_code == 201
        assert op.post("/queues", json={"name": f"{org}-q", "org": org}).status_code == 201
        user = {"name": "alice", "org": org, "role": "member", "projects": ["lab"]}
        assert op.post("/users", json=user).status_code == 201
        token = op.post("/tokens", json={"user": "alice", "org": org}).json()["token"]
        register(op, "shared", gpus=1, untrusted_images=False)
        for job in (submit(op, gpus="0.5"), submit(op, gpus="0.2")):  # one organisation: both on the one GPU
            placed = settled(op, job)
            assert nodes_of(placed) == ["shared"] and placed["allocations"][0]["gpus"][0]["index"] == 0
        with server.client(token) as acme:  # 0.3 of the GPU is free, but not for another organisation
            other = submit(acme, gpus="0.3", queue=f"{org}-q")
            assert settled(acme, other)["state"] == "pending", "a GPU was shared across organisations"
