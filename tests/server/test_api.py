"""The public API over real HTTP on loopback, on SQLite and on PostgreSQL (the same tests).

Tests that need an empty control plane take `server` (a fresh one each); the others share one per backend
(`shared_server`) and look only at what they made."""

from __future__ import annotations

import pytest

from gpupool.server.db.engine import Database
from gpupool.server.scheduler.pending import PendingJobs


def test_fresh_server_has_a_default_org_project_queue_and_operator(server):
    with server.client() as c:
        assert c.get("/whoami").json() == {"user": "admin", "org": "default", "role": "operator",
                                           "projects": ["default"]}
        assert [q["name"] for q in c.get("/queues").json()] == ["default"]
        assert [p["name"] for p in c.get("/projects").json()] == ["default"]


def test_submit_list_show_cancel_and_events(shared_server):
    with shared_server.client() as c:
        job = c.post("/jobs", json={"command": ["sleep", "1"], "gpus": "0.5", "tags": {"cost-centre": "cc1"}})
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        assert c.get("/jobs", params={"tag": "cost-centre=cc1"}).json()["items"][0]["id"] == job_id
        refused = c.get("/jobs", params={"tag": 'a"b=v'})
        assert refused.status_code == 422 and "tag" in refused.text
        assert c.get(f"/jobs/{job_id}").json()["state"] == "pending"
        assert c.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
        kinds = [e["kind"] for e in c.get(f"/jobs/{job_id}/events").json()]
        assert kinds == ["submitted", "cancelled"]
        why = c.get(f"/jobs/{job_id}/why").json()
        assert why["kind"] == "not_pending"


def test_why_pending_names_the_missing_nodes(server):
    import time
    with server.client() as c:
        made = c.post("/jobs", json={"command": ["true"], "gpus": "8"})
        assert made.status_code == 201, made.text  # once failed without saying why (a busy 2-core machine)
        job_id = made.json()["id"]
        for _ in range(50):
            why = c.get(f"/jobs/{job_id}/why").json()
            if why["kind"] != "queued":
                break
            time.sleep(0.1)
        assert why["kind"] == "no_node_fits" and "0/0 nodes" in why["message"]


def test_idempotency_key_returns_the_same_job_and_refuses_a_different_body(shared_server):
    with shared_server.client() as c:
        body = {"command": ["echo", "x"], "gpus": "1", "tags": {"test": "idempotency"}}
        first = c.post("/jobs", json=body, headers={"Idempotency-Key": "k1"}).json()
        again = c.post("/jobs", json=body, headers={"Idempotency-Key": "k1"}).json()
        assert first["id"] == again["id"]
        other = c.post("/jobs", json={**body, "gpus": "2"}, headers={"Idempotency-Key": "k1"})
        assert other.status_code == 422 and "Idempotency-Key" in other.text
        assert len(c.get("/jobs", params={"tag": "test=idempotency"}).json()["items"]) == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"command": ["x"], "gpus": "0.55"}, "gpus"), ({"command": [], "gpus": "1"}, "command"),
    ({"command": ["x"], "gpus": "1.5"}, "gpus"), ({"command": ["x"], "colour": "red"}, "colour"),
    ({"command": ["x"], "tasks": 0}, "tasks"), ({"command": ["x"], "env": {"1BAD": "v"}}, "env"),
    ({"command": ["x"], "queue": "nope"}, "queue"), ({"command": ["x"], "tasks": 2, "min_tasks": 3}, "min_tasks"),
    ({"command": ["x"], "tags": {'a"b': "v"}}, "tags"), ({"command": ["x"], "tags": {"k": "v" * 257}}, "tags"),
], ids=["gpus not a 10% step", "empty command", "fractional multi-GPU", "unknown field", "zero tasks",
        "bad env name", "unknown queue", "min above tasks", "tag key not a label key", "tag value too long"])
def test_bad_job_fields_get_a_4xx_naming_the_field(shared_server, body, field):
    with shared_server.client() as c:
        response = c.post("/jobs", json=body)
    assert 400 <= response.status_code < 500 and field in response.text


def test_cursor_pagination_walks_every_job_once(shared_server):
    """Pages of a filtered listing: the other tests' jobs on the shared server are skipped, never shown."""
    with shared_server.client() as c:
        body = {"command": ["true"], "gpus": "0.1", "tags": {"suite.test/pages": "yes"}}
        ids = {c.post("/jobs", json=body).json()["id"] for _ in range(7)}
        c.post("/jobs", json={"command": ["true"], "gpus": "0.1"})
        seen, cursor = [], None
        while True:
            query = {"limit": 3, "tag": "suite.test/pages=yes", **({"cursor": cursor} if cursor else {})}
            page = c.get("/jobs", params=query).json()
            seen += [j["id"] for j in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids)


def test_tokens_are_shown_once_listed_by_prefix_and_revocable(shared_server):
    with shared_server.client() as c:
        made = c.post("/tokens", json={"name": "ci"}).json()
        assert made["token"].startswith(f"gp_{made['prefix']}_")
        listed = [t for t in c.get("/tokens").json() if t["id"] == made["id"]]
        assert listed and listed[0]["token"] is None
        with shared_server.client(made["token"]) as mine:
            assert mine.get("/whoami").status_code == 200
            assert c.delete(f"/tokens/{made['id']}").status_code == 204
            assert mine.get("/whoami").status_code == 401


def test_queue_approval_threshold_holds_big_jobs_for_an_admin(shared_server):
    with shared_server.client() as c:
        assert c.post("/queues", json={"name": "gated", "approval_above_gpus": "2"}).status_code == 201
        small = c.post("/jobs", json={"command": ["true"], "gpus": "1", "queue": "gated"}).json()
        big = c.post("/jobs", json={"command": ["true"], "gpus": "4", "queue": "gated"}).json()
        assert small["state"] == "pending" and big["state"] == "pending_approval"
        assert c.get(f"/jobs/{big['id']}/why").json()["kind"] == "approval"
        assert c.post(f"/jobs/{big['id']}/approve", json={"note": "ok"}).json()["state"] == "pending"
        kinds = [e["kind"] for e in c.get(f"/jobs/{big['id']}/events").json()]
        assert kinds == ["submitted", "approved"]


def test_metrics_expose_the_cluster_figures(shared_server):
    import httpx
    text = httpx.get(f"{shared_server.url}/metrics", headers={"Authorization": f"Bearer {shared_server.token}"}).text
    for name in ("gpupool_gpu_allocation_ratio", "gpupool_gpu_fragmentation_ratio",
                 "gpupool_scheduler_cycle_seconds", "gpupool_scheduler_decisions_total"):
        assert name in text


def test_requests_without_a_valid_token_are_refused(shared_server):
    import httpx
    assert httpx.get(f"{shared_server.url}/api/v1/jobs").status_code == 401
    assert httpx.get(f"{shared_server.url}/api/v1/jobs", headers={"Authorization": "Bearer gp_x_y"}).status_code == 401


def _register_node(server, name="n1", gpus=1):
    import httpx

    from gpupool.protocol.agent import Registration
    from gpupool.protocol.devices import GpuInfo
    with server.client() as c:
        token = c.post("/join-tokens", json={"ttl_s": 600}).json()["token"]
    reg = Registration(join_token=token, name=name, boot_id="b", cpu_milli=64_000, memory_mib=65_536,
                       gpus=[GpuInfo(index=i, uuid=f"GPU-test-{name}-{i}", model="A100", memory_mib=40_960, fake=True)
                             for i in range(gpus)])
    response = httpx.post(f"{server.url}/api/v1/agent/register", content=reg.model_dump_json(),
                          headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    again = httpx.post(f"{server.url}/api/v1/agent/register", content=reg.model_dump_json(),
                       headers={"content-type": "application/json"})
    assert again.status_code == 401  # join tokens are single use


def test_ten_tenths_share_one_gpu_and_an_eleventh_waits(server):
    import time
    _register_node(server)
    with server.client() as c:
        ids = [c.post("/jobs", json={"command": ["sleep", "60"], "gpus": "0.1", "cpus": "0.1", "memory_mib": 10}
                      ).json()["id"] for _ in range(11)]
        for _ in range(100):
            states = [c.get(f"/jobs/{i}").json()["state"] for i in ids]
            if states.count("scheduled") == 10:
                break
            time.sleep(0.1)
        assert states.count("scheduled") == 10 and states.count("pending") == 1
        node = c.get("/nodes").json()[0]
        assert node["gpus"][0]["allocated_milli"] == 1000


def test_pending_jobs_of_equal_shape_share_one_shape_object(shared_server):
    """The scheduler's view of pending jobs gives equal task shapes one object (the core's lookups by shape then
    succeed by identity); different shapes stay apart."""
    with shared_server.client() as c:
        ids = [c.post("/jobs", json={"command": ["true"], "gpus": gpus, "tags": {"test": "shapes"}}).json()["id"]
               for gpus in ("0.5", "0.5", "2")]
    db = Database(shared_server.database_url or f"sqlite:///{shared_server.data_dir / 'gpupool.db'}")
    try:
        with db.session() as session:
            specs = {p.spec.id: p.spec for p in PendingJobs().read(session)}
    finally:
        db.engine.dispose()
    half, other_half, two = (specs[i].tasks[0].shape for i in ids)
    assert half is other_half and half == other_half != two
