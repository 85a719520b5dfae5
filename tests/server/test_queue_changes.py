"""Queues and budgets changed and deleted through the API (issue 43): the quota tree's rules on every change
(services.quota_tree), dry runs that change nothing, a deleted queue's waiting jobs moved, a hard budget undone, and
job id prefixes that never reach another tenant's jobs. A real control plane on loopback; the pool's two A100s come
from a node registered with a join token (no agent needed: nothing runs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.devtools.harness import Server, start_server, stop_server


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.request.method} {response.request.url}: {response.text}"
    return response.json() if response.content else None


def _refused(response: httpx.Response, status: int, starts: str) -> str:
    detail = str(response.json()["detail"])
    assert response.status_code == status and detail.startswith(starts), f"{response.status_code} {detail}"
    return detail


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("queue-changes") / "data")
    try:
        op = server.client()
        join = _ok(op.post("/join-tokens", json={}), 201)["token"]
        gpus = [{"index": i, "uuid": f"GPU-q-{i}", "model": "A100", "memory_mib": 40_960, "fake": True}
                for i in range(2)]
        _ok(op.post("/agent/register", json={"join_token": join, "name": "gpu-q", "boot_id": "b", "cpu_milli": 8000,
                                             "memory_mib": 65_536, "gpus": gpus, "csr": ""}))
        for org in ("acme", "globex"):
            _ok(op.post("/orgs", json={"name": org}), 201)
            _ok(op.post("/projects", json={"name": "lab", "org": org}), 201)
            _ok(op.post("/users", json={"name": "boss", "org": org, "role": "tenant-admin"}), 201)
        yield server
    finally:
        stop_server(server)


def _admin(server: Server, org: str) -> httpx.Client:
    token = _ok(server.client().post("/tokens", json={"user": "boss", "org": org}), 201)["token"]
    return server.client(token)


def test_a_child_never_guarantees_more_than_its_parent_allows(server: Server) -> None:
    op = server.client()
    _ok(op.post("/queues", json={"name": "vision", "org": "acme", "guaranteed": {"gpus": "1"},
                                 "limit": {"gpus": "1"}}), 201)
    detail = _refused(op.post("/queues", json={"name": "sub", "org": "acme", "parent": "vision",
                                               "guaranteed": {"gpus": "5"}}), 422, "guaranteed.gpus:")
    assert "5 GPUs is above the limit of its parent queue 'vision', 1 GPU" in detail
    _ok(op.post("/queues", json={"name": "sub", "org": "acme", "parent": "vision", "guaranteed": {"gpus": "1"}}), 201)
    half = {"name": "sub2", "org": "acme", "parent": "vision", "guaranteed": {"gpus": "0.5"}}
    _refused(op.post("/queues", json=half), 422,
             "guaranteed.gpus: queue 'sub2' would make the children of 'vision' guarantee 1.5 GPUs together")
    _refused(op.patch("/queues/vision", params={"org": "acme"}, json={"limit": {"gpus": "0.5"}}), 422,
             "limit.gpus: 0.5 GPU is below what its child queue 'sub' guarantees, 1 GPU")
    _refused(op.patch("/queues/sub", params={"org": "acme"}, json={"guaranteed": {"gpus": "2"}}), 422,
             "guaranteed.gpus: 2 GPUs is above the limit of its parent queue 'vision'")
    assert [q["guaranteed"]["gpus"] for q in _ok(op.get("/queues")) if q["name"] == "sub"] == ["1"]


def test_guarantees_above_the_pool_warn_with_the_figures(server: Server) -> None:
    op = server.client()
    out = _ok(op.post("/queues", json={"name": "huge", "org": "globex", "guaranteed": {"gpus": "4"}}), 201)
    assert out["warnings"] == ["guaranteed.gpus: queue 'huge' guarantees 4 GPUs, above the pool's 2 GPUs"]
    change = _ok(op.patch("/queues/huge", params={"org": "globex"}, json={"guaranteed": {"gpus": "2",
                                                                                          "per_model": {"H100": "1"}}}))
    assert "guaranteed.per_model.H100: queue 'huge' guarantees 1 H100 GPU, above the pool's 0 H100 GPUs" in \
        change["warnings"]
    _ok(op.delete("/queues/huge", params={"org": "globex"}))


def test_a_dry_run_says_what_would_change_and_changes_nothing(server: Server) -> None:
    op = server.client()
    _ok(op.post("/queues", json={"name": "dry", "org": "acme", "priority": 0}), 201)
    change = _ok(op.patch("/queues/dry", params={"org": "acme", "dry_run": "true"},
                          json={"priority": 5, "limit": {"gpus": "2"}}))
    assert change["dry_run"] and set(change["changes"]) == {"priority: 0 -> 5", "limit: none -> gpus=2"}
    assert [(q["priority"], q["limit"]) for q in _ok(op.get("/queues")) if q["name"] == "dry"] == [(0, None)]
    gone = _ok(op.delete("/queues/dry", params={"org": "acme", "dry_run": "true"}))
    assert gone["dry_run"] and "dry" in [q["name"] for q in _ok(op.get("/queues"))]
    _ok(op.delete("/queues/dry", params={"org": "acme"}))
    assert "dry" not in [q["name"] for q in _ok(op.get("/queues"))]


def test_a_deleted_queue_moves_its_waiting_jobs_and_refuses_without_a_destination(server: Server) -> None:
    admin = _admin(server, "acme")
    op = server.client()
    _ok(op.put("/orgs/acme/ceiling", json={"over_quota_weight": 100}))
    for name in ("old", "new"):
        _ok(admin.post("/queues", json={"name": name, "hold_unsatisfiable": True}), 201)  # its 8-GPU job waits
    job = _ok(admin.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": "old", "project": "lab"}), 201)
    _refused(admin.delete("/queues/old"), 409, "move_to: queue 'old' holds 1 waiting jobs")
    _refused(admin.delete("/queues/old", params={"move_to": "nowhere"}), 422, "move_to: queue 'nowhere' not found")
    out = _ok(admin.delete("/queues/old", params={"move_to": "new"}))
    assert out["jobs_moved"] == [job["id"]] and _ok(admin.get(f"/jobs/{job['id']}"))["queue"] == "new"


def test_a_tenant_admin_lowers_a_queue_an_operator_granted_above_the_ceiling(server: Server) -> None:
    op, admin = server.client(), _admin(server, "globex")
    _ok(op.post("/queues", json={"name": "gift", "org": "globex", "guaranteed": {"gpus": "2"}}), 201)
    _refused(admin.patch("/queues/gift", json={"priority": 10}), 403, "priority:")
    assert _ok(admin.patch("/queues/gift", json={"guaranteed": {"gpus": "1"}}))["changes"] == [
        "guaranteed: gpus=2 -> gpus=1"]


def test_a_hard_budget_set_by_mistake_is_undone(server: Server) -> None:
    admin = _admin(server, "acme")
    budget = _ok(admin.post("/budgets", json={"scope": "project", "name": "lab", "gpu_hours": 0.0001,
                                               "hard": True}), 201)
    dry = _ok(admin.patch(f"/budgets/{budget['id']}", params={"dry_run": "true"}, json={"hard": False}))
    assert dry["dry_run"] and dry["changes"] == ["hard: yes -> no"]
    assert _ok(admin.get("/budgets"))[0]["hard"] is True
    out = _ok(admin.patch(f"/budgets/{budget['id']}", json={"cents": 500}))
    assert out["changes"] == ["gpu_hours: 0.0001 -> none", "cents: none -> 500"] and out["budget"]["currency"] == "USD"
    _refused(admin.patch(f"/budgets/{budget['id']}", json={"cents": 1, "gpu_hours": 1}), 422, "[")
    _ok(admin.delete(f"/budgets/{budget['id']}"))
    assert _ok(admin.get("/budgets")) == []
    _refused(_admin(server, "globex").delete(f"/budgets/{budget['id']}"), 404, "budget")


def test_an_id_prefix_finds_only_the_callers_jobs(server: Server) -> None:
    """Tenant B lists by every one-digit prefix: it never sees one of A's jobs, and a prefix of A's job id finds
    nothing; A's own prefix finds A's job."""
    a, b = _admin(server, "acme"), _admin(server, "globex")
    _ok(server.client().put("/orgs/globex/ceiling", json={"over_quota_weight": 100}))
    _ok(b.post("/queues", json={"name": "mine", "over_quota_weight": 0, "hold_unsatisfiable": True}), 201)
    a_queue = next(q["name"] for q in _ok(a.get("/queues")) if q["org"] == "acme" and q["name"] == "new")
    theirs = _ok(a.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": a_queue,
                                    "project": "lab"}), 201)["id"]
    ours = _ok(b.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": "mine", "project": "lab"}), 201)["id"]
    assert _ok(b.get("/jobs", params={"id_prefix": theirs[:12]}))["items"] == []
    seen = {j["id"] for digit in "0123456789abcdef" for j in _ok(b.get("/jobs", params={"id_prefix": digit,
                                                                                         "limit": 500}))["items"]}
    assert ours in seen and theirs not in seen
    assert [j["id"] for j in _ok(a.get("/jobs", params={"id_prefix": theirs[:12]}))["items"]] == [theirs]
    _refused(b.get("/jobs", params={"id_prefix": "%"}), 422, "[")
