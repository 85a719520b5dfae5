"""Tenancy holes of issue 41 (findings 5, 7, 12, 13 and 16), each attacked through the public HTTP API of a running
control plane, on SQLite and on PostgreSQL (RELIABILITY.md §3.2, S17).

- 5: a tenant admin grants its own queues capacity (a billion guaranteed GPUs, priority 1000, a heavy over-quota
  weight, a second top-level queue, a child of a shared queue): every attempt beyond its organisation's ceiling is
  refused with a 403 naming the field; what fits the ceiling an operator set, and what an operator grants, goes in.
- 7: a job asking for no GPU, no CPU and no memory (or next to none) gets a 422 naming the fields.
- 12: a member of another project (or another member of the same one) reusing an Idempotency-Key gets a new job of
  its own, never the other job or a hint that it exists.
- 13: queue names of another tenant: every probe (create one by that name, under it, submit to it, budget it, list
  by it) answers as for a name nobody has; both tenants keep a queue of the same name, and each one's jobs are
  scheduled in its own; an approval re-checks the queue (a queue that has become a parent refuses it, 409, and the
  job stays awaiting approval).
- 16: 80 concurrent PUT /prices (and /resource-prices) for a new model answer 200, never 500; concurrent creations
  of one queue name answer 201 once and 409 otherwise.

Each backend prints one S17 figure line, gathered from the tests' parts (gpupool.devtools.figures.Parts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.devtools.figures import Parts, figure, session_folder
from gpupool.devtools.harness import Postgres, Server, free_port, start_server, stop_server

LIFTED = {"GPUPOOL_RATE_LIMIT_PER_S": "100000", "GPUPOOL_RATE_LIMIT_BURST": "100000",
          "GPUPOOL_AUTH_FAILURES_PER_MIN": "100000", "GPUPOOL_MAX_PENDING_JOBS_PER_ORG": "100000"}
PARTS = ("ceiling", "zero", "idempotency", "probes", "approval", "races")
RACERS = 80
HELD = {"command": ["true"], "gpus": "8"}  # eight GPUs: no node here fits it, so it stays where it is put


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.request.method} {response.request.url}: " \
                                           f"{response.status_code} {response.text[:400]}"
    return response.json() if response.content else None


@dataclass
class Tenant:
    """An organisation made by the operator, with users (name -> role, projects) and a client per user."""

    org: str
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    def __getitem__(self, user: str) -> httpx.Client:
        return self.clients[user]


@dataclass
class World:
    server: Server
    backend: str
    parts: Parts
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, token: str) -> httpx.Client:
        made = httpx.Client(base_url=f"{self.server.url}/api/v1", timeout=60,
                            headers={"Authorization": f"Bearer {token}"})
        self.clients.append(made)
        return made

    @property
    def operator(self) -> httpx.Client:
        if not self.clients:
            self.client(self.server.token)
        return self.clients[0]

    def tenant(self, prefix: str, projects: tuple[str, ...] = ("p1",),
               users: dict[str, tuple[str, tuple[str, ...]]] | None = None) -> Tenant:
        """A fresh organisation with `projects` and `users` (name -> (role, projects)); default: a tenant admin."""
        op, t = self.operator, Tenant(unique(prefix))
        _ok(op.post("/orgs", json={"name": t.org}), 201)
        for project in projects:
            _ok(op.post("/projects", json={"name": project, "org": t.org}), 201)
        for name, (role, theirs) in (users or {"admin": ("tenant-admin", projects)}).items():
            _ok(op.post("/users", json={"name": name, "org": t.org, "role": role, "projects": list(theirs)}), 201)
            token = _ok(op.post("/tokens", json={"user": name, "org": t.org}), 201)["token"]
            t.clients[name] = self.client(token)
        return t

    def part(self, name: str, **numbers: Any) -> None:
        found = self.parts.add(name, **numbers)
        if found is None:
            return
        ceiling, zero, idem, probes, approval, races = (found[p] for p in PARTS)
        figure(f"S17 queue_capacity_escalations_refused={ceiling['refused']}/{ceiling['attempted']} "
               f"zero_request_jobs_422={'ok' if zero['ok'] else 'FAIL'} idem_cross_project_leak={idem['leaks']} "
               f"queue_name_probe_leak={probes['leaks']} approval_recheck={'ok' if approval['ok'] else 'FAIL'} "
               f"prices_500={races['prices_500']}/{races['prices']} "
               f"({'pg' if self.backend == 'postgres' else self.backend}; prices_503_busy={races['prices_busy']}, "
               f"other_upsert_races_500={races['other_500']}/{races['other']}, probes={probes['probes']}, "
               f"idempotency_reuses={idem['reuses']})")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[World]:
    url = None
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"tenancy{free_port()}")
    root: Path = tmp_path_factory.mktemp(f"tenancy-{request.param}")
    server = start_server(root / "data", url, env=LIFTED)
    folder = session_folder(tmp_path_factory.getbasetemp(), worker_id, f"s17-{request.param}")
    w = World(server, request.param, Parts(folder, PARTS))
    try:
        yield w
    finally:
        for client in w.clients:
            client.close()
        stop_server(server)


def _detail(response: httpx.Response) -> str:
    return str(response.json().get("detail", "")) if response.content else ""


# 5: only operators grant capacity -------------------------------------------------------------------------------

# (what the tenant admin tries, the queue it asks for, the field the refusal must name), under the default ceiling
BEYOND_DEFAULT = [
    ("a billion guaranteed GPUs", {"name": "grab", "guaranteed": {"gpus": "1000000000"}}, "guaranteed.gpus"),
    ("priority 1000", {"name": "vip", "priority": 1000}, "priority"),
    ("over-quota weight 1000", {"name": "heavy", "over_quota_weight": 1000}, "over_quota_weight"),
    ("guaranteed GPUs of one model", {"name": "h100s", "guaranteed": {"per_model": {"H100": "8"}}},
     "guaranteed.per_model.H100"),
    ("guaranteed CPUs", {"name": "cores", "guaranteed": {"cpus": "512"}}, "guaranteed.cpus"),
    ("a second top-level queue of weight 1 (weights add up)", {"name": "second"}, "over_quota_weight"),
]
# ... and under the ceiling {guaranteed 8 GPUs, limit 16 GPUs, weight 2, priority 10}, once "train" guarantees 6
BEYOND_SET = [
    ("guarantees adding up beyond the ceiling",
     {"name": "more", "guaranteed": {"gpus": "4"}, "limit": {"gpus": "16"}, "over_quota_weight": 0},
     "guaranteed.gpus"),
    ("a limit above the ceiling's", {"name": "wide", "limit": {"gpus": "32"}, "over_quota_weight": 0}, "limit.gpus"),
    ("no limit under a ceiling that caps limits", {"name": "open", "over_quota_weight": 0}, "limit.gpus"),
    ("priority above the ceiling's", {"name": "p11", "priority": 11, "limit": {"gpus": "16"},
                                      "over_quota_weight": 0}, "priority"),
    ("a child with a priority above the ceiling's", {"name": "kid", "parent": "train", "priority": 50,
                                                     "limit": {"gpus": "16"}}, "priority"),
]
CEILING = {"guaranteed": {"gpus": "8"}, "limit": {"gpus": "16"}, "over_quota_weight": 2, "max_priority": 10}


def _refused(admin: httpx.Client, body: dict[str, Any], named: str) -> bool:
    response = admin.post("/queues", json=body)
    assert response.status_code == 403 and _detail(response).startswith(f"{named}:"), \
        f"{body}: {response.status_code} {response.text[:300]}"
    return True


def test_a_tenant_admin_grants_no_capacity_beyond_its_ceiling(world: World) -> None:
    t, other, op = world.tenant("ceil"), world.tenant("neighbour"), world.operator
    admin, commons = t["admin"], unique("commons")
    _ok(op.post("/queues", json={"name": commons}), 201)  # shared: every tenant sees it
    _ok(admin.post("/queues", json={"name": "first"}), 201)  # the default ceiling: one top-level queue of weight 1
    attempts = [*BEYOND_DEFAULT, ("a child of a shared queue", {"name": "squat", "parent": commons,
                                                                 "over_quota_weight": 0}, "parent")]
    refused = sum(_refused(admin, body, named) for _, body, named in attempts)
    assert admin.put(f"/orgs/{t.org}/ceiling", json=CEILING).status_code == 403  # tenants cannot raise their own
    assert other["admin"].get(f"/orgs/{t.org}/ceiling").status_code == 404
    _ok(op.put(f"/orgs/{t.org}/ceiling", json=CEILING))
    _ok(admin.post("/queues", json={"name": "train", "guaranteed": {"gpus": "6"}, "limit": {"gpus": "16"},
                                    "priority": 10}), 201)  # within the ceiling: a tenant admin's to grant
    _ok(admin.post("/queues", json={"name": "train-a", "parent": "train", "guaranteed": {"gpus": "6"},
                                    "limit": {"gpus": "16"}}), 201)  # a child shares only its parent's share
    refused += sum(_refused(admin, body, named) for _, body, named in BEYOND_SET)
    granted = _ok(admin.get(f"/orgs/{t.org}/ceiling"))
    assert (granted["granted_guaranteed"], granted["granted_over_quota_weight"]) == ({"gpus": "6"}, 2)
    _ok(op.post("/queues", json={"name": "granted", "org": t.org, "guaranteed": {"gpus": "100"}}), 201)  # operators
    world.part("ceiling", refused=refused, attempted=len(attempts) + len(BEYOND_SET))


# 7: every job asks for something --------------------------------------------------------------------------------

NOTHING = [{"gpus": "0", "cpus": "0", "memory_mib": 0}, {"gpus": "0", "cpus": "0.001", "memory_mib": 1},
           {"gpus": "0", "cpus": "0", "memory_mib": 4096}, {"gpus": "0", "cpus": "2", "memory_mib": 0}]


def test_a_job_asking_for_nothing_is_refused_naming_the_fields(world: World) -> None:
    t, work = world.tenant("zero", users={"member": ("member", ("p1",))}), unique("work")
    _ok(world.operator.post("/queues", json={"name": work, "org": t.org}), 201)
    answers = [t["member"].post("/jobs", json={"command": ["true"], "queue": work, **asks}) for asks in NOTHING]
    wrong = [(a.status_code, a.text[:200]) for a in answers
             if a.status_code != 422 or not all(f in _detail(a) for f in ("gpus", "cpus", "memory_mib"))]
    assert wrong == [], "jobs asking for (next to) nothing were not refused naming the fields"
    small = {"command": ["true"], "queue": work, "gpus": "0", "cpus": "0.1", "memory_mib": 16}
    _ok(t["member"].post("/jobs", json=small), 201)  # the floor itself is enough
    prices = {p["resource"]: p["cents_per_hour"] for p in _ok(t["member"].get("/resource-prices"))}
    assert prices.keys() == {"cpu", "memory"} and min(prices.values()) > 0, prices  # CPU and memory are priced
    world.part("zero", ok=True)


# 12: Idempotency-Keys are per project and user ---------------------------------------------------------------------


def test_an_idempotency_key_reused_by_someone_else_reveals_nothing(world: World) -> None:
    t = world.tenant("idem", ("p1", "p2"), {"m1": ("member", ("p1",)), "m1b": ("member", ("p1",)),
                                            "m2": ("member", ("p2",)), "m3": ("member", ("p2",))})
    work = unique("work")
    _ok(world.operator.post("/queues", json={"name": work, "org": t.org}), 201)
    key, body = unique("key"), {**HELD, "queue": work}
    theirs = _ok(t["m1"].post("/jobs", json={**body, "project": "p1"}, headers={"Idempotency-Key": key}), 201)
    reuses = [t["m2"].post("/jobs", json={**body, "project": "p2"}, headers={"Idempotency-Key": key}),
              t["m3"].post("/jobs", json={**body, "project": "p2", "name": "other"}, headers={"Idempotency-Key": key}),
              t["m1b"].post("/jobs", json={**body, "project": "p1"}, headers={"Idempotency-Key": key})]
    leaks = [r.text[:200] for r in reuses if r.status_code != 201 or r.json()["id"] == theirs["id"]]
    world.part("idempotency", leaks=len(leaks), reuses=len(reuses))
    assert leaks == [], f"another member's Idempotency-Key gave away its job: {leaks}"
    assert t["m2"].get(f"/jobs/{theirs['id']}").status_code == 404  # it could not see that job otherwise
    assert [r.json()["project"] for r in reuses] == ["p2", "p2", "p1"]
    again = t["m1"].post("/jobs", json={**body, "project": "p1"}, headers={"Idempotency-Key": key})
    assert _ok(again, 201)["id"] == theirs["id"]  # its own retry still finds its job


# 13: queue names per organisation; approval re-checks the queue ----------------------------------------------------

Probe = Callable[[httpx.Client, str], httpx.Response]
PROBES: list[tuple[str, Probe]] = [  # in this order: the last one makes B a queue of that name
    ("a queue under it", lambda c, name: c.post("/queues", json={"name": unique("sub"), "parent": name})),
    ("a job into it", lambda c, name: c.post("/jobs", json={**HELD, "queue": name})),
    ("a budget on it", lambda c, name: c.post("/budgets", json={"scope": "queue", "name": name, "gpu_hours": 1})),
    ("the jobs listed by it", lambda c, name: c.get("/jobs", params={"queue": name})),
    ("a queue of that name", lambda c, name: c.post("/queues", json={"name": name, "over_quota_weight": 0})),
]


def _answer(response: httpx.Response, name: str) -> tuple[int, str]:
    """Status and error text with the probed name taken out (a success's body differs anyway)."""
    return response.status_code, "" if response.is_success else response.text.replace(name, "<name>")


def test_another_tenants_queue_names_answer_like_missing_ones_and_stay_its_own(world: World) -> None:
    a = world.tenant("qa", users={"admin": ("tenant-admin", ("p1",)), "member": ("member", ("p1",))})
    b = world.tenant("qb", users={"admin": ("tenant-admin", ("p1",)), "member": ("member", ("p1",))})
    name, first = unique("train"), unique("first-come")
    _ok(a["admin"].post("/queues", json={"name": name}), 201)
    leaks = []
    for what, probe in PROBES:
        ghost = unique("ghost")
        real, missing = _answer(probe(b["admin"], name), name), _answer(probe(b["admin"], ghost), ghost)
        if real != missing:
            leaks.append(f"{what}: {real} vs {missing}")
    world.part("probes", leaks=len(leaks), probes=len(PROBES))
    assert leaks == [], "another tenant's queue name answered unlike a missing one"
    assert [q for q in _ok(b["member"].get("/queues")) if q["org"] == a.org] == []
    _ok(b["admin"].post("/queues", json={"name": first}), 201)  # nobody squats a name for another tenant
    _ok(a["admin"].post("/queues", json={"name": first, "over_quota_weight": 0}), 201)
    _each_schedules_in_its_own_queue(a, b, name)


def _each_schedules_in_its_own_queue(a: Tenant, b: Tenant, name: str) -> None:
    """Both tenants now have a queue `name`: each one's job waits in its own, counted there, and the scheduler
    finds its queue (a job in a queue it does not know would wait with "unknown leaf queue")."""
    jobs = {t.org: _ok(t["member"].post("/jobs", json={**HELD, "queue": name}), 201)["id"] for t in (a, b)}
    for t in (a, b):
        mine = [q for q in _ok(t["member"].get("/queues")) if q["name"] == name]
        assert [(q["org"], q["pending_jobs"]) for q in mine] == [(t.org, 1)]
        why = _considered(t["member"], jobs[t.org])
        assert "unknown leaf queue" not in why["message"], why


def _considered(client: httpx.Client, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """The job's "why pending" once a scheduling cycle has considered it."""
    deadline = time.monotonic() + timeout_s
    while (reason := _ok(client.get(f"/jobs/{job_id}/why")))["kind"] == "queued":
        assert time.monotonic() < deadline, "no scheduling cycle considered the job"
        time.sleep(0.1)
    return dict(reason)


def test_an_approval_rechecks_the_queue(world: World) -> None:
    t = world.tenant("appr", users={"admin": ("tenant-admin", ("p1",)), "lead": ("project-admin", ("p1",)),
                                    "member": ("member", ("p1",))})
    gated = unique("gated")
    _ok(world.operator.post("/queues", json={"name": gated, "org": t.org, "approval_above_gpus": "1"}), 201)
    held = _ok(t["member"].post("/jobs", json={**HELD, "queue": gated}), 201)
    assert held["state"] == "pending_approval"
    _ok(t["admin"].post("/queues", json={"name": unique("child"), "parent": gated}), 201)  # a parent now
    approval = t["lead"].post(f"/jobs/{held['id']}/approve", json={"note": "go"})
    state = _ok(t["member"].get(f"/jobs/{held['id']}"))["state"]
    ok = approval.status_code == 409 and _detail(approval).startswith("queue:") and state == "pending_approval"
    world.part("approval", ok=ok)
    assert ok, f"approval into a queue that became a parent: {approval.status_code} {approval.text[:300]}; {state}"
    assert _ok(t["lead"].post(f"/jobs/{held['id']}/deny", json={"note": "resubmit"}))["state"] == "denied"


# 16: upsert races answer 409 or succeed, never 500 ------------------------------------------------------------------


def _race(world: World, send: Callable[[httpx.Client], httpx.Response], racers: int = RACERS) -> Counter[int]:
    """`racers` requests released at once, each on its own connection; their statuses."""
    start = threading.Barrier(racers)
    clients = [world.client(world.server.token) for _ in range(racers)]

    def one(client: httpx.Client) -> int:
        start.wait()
        return send(client).status_code

    with ThreadPoolExecutor(racers) as pool:
        return Counter(pool.map(one, clients))


def test_concurrent_upserts_never_answer_500(world: World) -> None:
    """Every racer succeeds or gets a 409; on SQLite a racer may also wait out the busy timeout behind the others and
    get a 503 with Retry-After (the database is busy: retry), which is no error of the upsert."""
    model, org = unique("GPU"), unique("racers")
    prices = _race(world, lambda c: c.put("/prices", json={"model": model, "cents_per_gpu_hour": 300}))
    _ok(world.operator.post("/orgs", json={"name": org}), 201)
    others = [_race(world, lambda c: c.put("/resource-prices", json={"resource": "cpu", "cents_per_hour": 5})),
              _race(world, lambda c: c.put(f"/orgs/{org}/ceiling", json=CEILING), 20),
              _race(world, lambda c, q=unique("rq"): c.post("/queues", json={"name": q, "org": org}), 20)]
    world.part("races", prices_500=_errors(prices), prices=RACERS, prices_busy=prices[503],
               other_500=sum(map(_errors, others)), other=sum(sum(o.values()) for o in others))
    busy = {503} if world.backend == "sqlite" else set()
    assert set(prices) <= {200} | busy and prices[200], prices
    assert [set(o) - busy for o in others] == [{200}, {200}, {201, 409}] and others[2][201] == 1, others
    assert any(p["model"] == model for p in _ok(world.operator.get("/prices")))


def _errors(statuses: Counter[int]) -> int:
    """Answers that are server errors: 5xx, less 503 (busy, retry)."""
    return sum(n for status, n in statuses.items() if status >= 500 and status != 503)


# the CLI of these settings ---------------------------------------------------------------------------------------


def _cli(world: World, *args: str) -> str:
    """`gpupool ARGS...` as the operator; its output."""
    env = {**os.environ, "GPUPOOL_URL": world.server.url, "GPUPOOL_TOKEN": world.server.token}
    done = subprocess.run([sys.executable, "-m", "gpupool.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_operators_set_ceilings_and_resource_prices_with_the_cli(world: World) -> None:
    if world.backend != "sqlite":
        pytest.skip("the CLI speaks HTTP only: one backend shows it")
    org = world.tenant("cli").org
    _cli(world, "org", "ceiling", org, "--guaranteed-gpus", "4", "--limit-gpus", "8")
    shown = json.loads(_cli(world, "org", "ceiling", org, "--weight", "3", "--max-priority", "5", "--json"))
    assert (shown["guaranteed"]["gpus"], shown["limit"], shown["over_quota_weight"], shown["max_priority"]) == (
        "4", {"gpus": "8", "per_model": {}}, 3, 5), shown  # the parts not given stay
    assert "7 cents per CPU-core-hour" in _cli(world, "price", "cpu", "7")
    prices = {p["what"]: p["cents_per_hour"] for p in json.loads(_cli(world, "price", "list", "--json"))}
    assert prices["cpu"] == 7 and prices["memory"] > 0, prices
