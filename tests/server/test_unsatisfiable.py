"""Issue 43 item 3: a job that no node of the pool could hold, even with every node empty, is refused at submission
(422 naming the field, the largest fit and the models present; nothing stored), unless its queue holds such jobs
(`hold_unsatisfiable`). Through the API on SQLite and PostgreSQL, and through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from gpupool.protocol.agent import Registration
from gpupool.protocol.devices import GpuInfo

CLI = [sys.executable, "-m", "gpupool.cli.main"]


def _register(server, name: str, gpus: int, model: str = "A100", cpu_milli: int = 16_000) -> None:
    with server.client() as c:
        token = c.post("/join-tokens", json={"ttl_s": 600}).json()["token"]
    reg = Registration(join_token=token, name=name, boot_id="b", cpu_milli=cpu_milli, memory_mib=65_536,
                       gpus=[GpuInfo(index=i, uuid=f"GPU-unsat-{name}-{i}", model=model, memory_mib=40_960, fake=True)
                             for i in range(gpus)])
    response = httpx.post(f"{server.url}/api/v1/agent/register", content=reg.model_dump_json(),
                          headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def _job_count(c: httpx.Client) -> int:
    return len(c.get("/jobs", params={"limit": 500}).json()["items"])


CASES = {
    "gpus above the largest node": ({"gpus": "8"}, ["gpus: 8 GPUs per task", "the largest node, big, has 2",
                                                    "at most 2 GPUs", "A100 (2 nodes)"]),
    "a model nobody has": ({"gpus": "1", "gpu_models": ["H100"]}, ["gpu_models:", "model H100",
                                                                   "models present: A100 (2 nodes)"]),
    "cpus above every node": ({"gpus": "1", "cpus": "64"}, ["cpus: 64 CPUs per task", "has 16"]),
    "memory above every node": ({"gpus": "1", "memory_mib": 1 << 20}, ["memory_mib:", "has 65536 MiB"]),
    "a share with more GPU memory than any GPU": ({"gpus": "0.5", "gpu_memory_mib": 81_920},
                                                  ["gpu_memory_mib:", "has 40960 MiB"]),
    "a gang larger than the pool": ({"gpus": "1", "tasks": 4}, ["tasks: 4 tasks", "holds at most 3"]),
}


@pytest.mark.parametrize(("body", "want"), CASES.values(), ids=CASES.keys())
def test_a_job_no_node_could_ever_hold_is_refused_naming_the_field_and_nothing_is_stored(server, body, want):
    _register(server, "big", 2)
    _register(server, "small", 1)
    with server.client() as c:
        before = _job_count(c)
        refused = c.post("/jobs", json={"command": ["true"], **body})
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert all(w in detail for w in want), detail
        assert "{'" not in detail and "['" not in detail
        assert _job_count(c) == before  # nothing stored
        assert c.post("/jobs", json={"command": ["true"], "gpus": "2"}).status_code == 201  # what fits is taken


def test_a_queue_that_holds_unsatisfiable_jobs_lets_them_wait(server):
    _register(server, "big", 2)
    with server.client() as c:
        made = c.post("/queues", json={"name": "elastic", "hold_unsatisfiable": True})
        assert made.status_code == 201 and made.json()["hold_unsatisfiable"] is True, made.text
        assert {q["name"]: q["hold_unsatisfiable"] for q in c.get("/queues").json()} == {"default": False,
                                                                                         "elastic": True}
        held = c.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": "elastic"})
        assert held.status_code == 201 and held.json()["state"] == "pending", held.text
        assert c.post("/jobs", json={"command": ["true"], "gpus": "8"}).status_code == 422


def test_an_empty_pool_refuses_nothing(server):
    with server.client() as c:
        assert c.post("/jobs", json={"command": ["true"], "gpus": "8"}).status_code == 201


def test_a_reset_node_leaves_the_pool_but_an_unreachable_one_stays(server):
    from gpupool.server.db.engine import Database
    from gpupool.server.db.models import Node
    _register(server, "big", 2)
    _register(server, "gone", 4)
    db = Database(server.database_url or f"sqlite:///{server.data_dir / 'gpupool.db'}")
    try:
        with db.session() as session:
            for node in session.query(Node):
                node.state = {"big": "lost", "gone": "reset"}[node.name]
    finally:
        db.engine.dispose()
    with server.client() as c:
        assert c.post("/jobs", json={"command": ["true"], "gpus": "2"}).status_code == 201  # a lost node counts
        refused = c.post("/jobs", json={"command": ["true"], "gpus": "4"})
        assert refused.status_code == 422 and "the largest node, big, has 2" in refused.text


def _cli(server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token,
                               "COLUMNS": "200"})


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)
def test_the_cli_refuses_what_can_never_fit_and_a_queue_can_hold_it_or_stop_holding_it(server):
    _register(server, "big", 2)
    eight = _cli(server, "submit", "--gpus", "8", "--", "true")
    assert eight.returncode != 0
    out = " ".join((eight.stdout + eight.stderr).split())
    assert "the largest node, big, has 2" in out and "Traceback" not in out, out
    h100 = _cli(server, "submit", "--gpu-model", "H100", "--", "true")
    out = " ".join((h100.stdout + h100.stderr).split())
    assert h100.returncode != 0 and "models present: A100 (1 node)" in out, out
    with server.client() as c:
        assert _job_count(c) == 0
    made = _cli(server, "queue", "create", "ondemand", "--hold-unsatisfiable")
    assert made.returncode == 0, made.stdout + made.stderr
    held = _cli(server, "submit", "--gpus", "8", "--queue", "ondemand", "--", "true")
    assert held.returncode == 0, held.stdout + held.stderr
    updated = _cli(server, "queue", "update", "ondemand", "--refuse-unsatisfiable")
    assert updated.returncode == 0 and "hold_unsatisfiable: yes -> no" in updated.stdout, updated.stdout
    assert _cli(server, "submit", "--gpus", "8", "--queue", "ondemand", "--", "true").returncode != 0
    assert _cli(server, "queue", "update", "ondemand", "--hold-unsatisfiable").returncode == 0
    assert _cli(server, "submit", "--gpus", "8", "--queue", "ondemand", "--", "true").returncode == 0


def test_an_image_job_waits_for_a_node_that_runs_images_rather_than_being_refused(server):
    # whether a node runs images its agent says anew on every connection (a toolkit upgraded): not a capacity
    _register(server, "big", 2)
    with server.client() as c:
        made = c.post("/jobs", json={"command": ["true"], "gpus": "1", "image": "docker.io/library/busybox:1.36"})
        assert made.status_code == 201, made.text
