"""Tenant isolation (S1, BOLA) and the role matrix (S2, BFLA) of RELIABILITY.md §3.2 over every route of the
live OpenAPI spec, on SQLite and on PostgreSQL.

The operator sets up two tenants through the API, acme (A) and globex (B): projects, a queue that holds jobs
above one GPU for a project admin's approval, a user of every tenant role with a token made by POST /tokens,
a budget, a job waiting for approval and a job placed on a shared node, which a stand-in agent starts (so the
job holds a GPU, has a log line and metered usage).

S1: a tenant admin and a member of B try every route against A's objects. Nothing succeeds on them; no answer
carries one of A's ids or log lines, or an object of A's organisation; A's state (as A's admin reads it) does
not change; and every answer equals the answer for a ghost tenant whose objects do not exist, so A's ids and
names cannot be enumerated (a known exception would be marked `oracle` and xfail; none is left). S2: every role
(viewer, member, project admin, tenant admin, operator, agent, anonymous) against every route on its own tenant,
against the table ROWS. `test_every_route_has_an_isolation_case_and_a_role_row` fails on a route of the spec missing
from either table, so a new route cannot slip in untested.

Each backend prints the S1 and S2 figure lines of RELIABILITY.md §3.3 with what the tests counted: every test
leaves its numbers as a part (gpupool.devtools.figures.Parts), and the test leaving the last part prints the line.
A case counts as a cross-tenant success when B got a success where the table expects a refusal, or an answer
carrying A's ids, log lines or objects; as a side effect when A's state changed.
"""

from __future__ import annotations

import itertools
import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gpupool.devtools.figures import Parts, figure, session_folder
from gpupool.devtools.hand_tls import HandTls, channel_url
from gpupool.devtools.harness import Postgres, Server, free_port, start_server, stop_server

API = "/api/v1"
NOT_API = ("/healthz", "/readyz", "/version", "/metrics", "/openapi.json", "/docs", "/redoc")
METHODS = {"get", "put", "post", "delete", "patch"}
TENANT_ROLES = ("viewer", "member", "project-admin", "tenant-admin")
#: the operator's queue for jobs that never fit (eight GPUs): it lets them wait instead of refusing them
HELD_QUEUE = "held"
# The node's agent speaks once and goes quiet: keep it from being declared lost; meter every second.
SERVER_ENV = {"GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "3600", "GPUPOOL_METERING_INTERVAL_S": "1",
              "GPUPOOL_METERING_PERIOD_S": "1"}
MONTH = datetime.now(UTC).strftime("%Y-%m")


def spec_routes(server: Server) -> set[str]:
    """Every "METHOD /path" of the live OpenAPI spec, less the system routes."""
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    return {f"{method.upper()} {path}" for path, item in spec["paths"].items() for method in item
            if method in METHODS and not path.startswith(NOT_API)}


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.request.method} {response.request.url}: {_show(response)}"
    return response.json() if response.content else None


def _show(response: httpx.Response) -> str:
    return f"{response.status_code} {response.text[:300]}"


def registration(join_token: str, name: str, gpus: int = 0) -> dict[str, Any]:
    return {"join_token": join_token, "name": name, "boot_id": "boot", "cpu_milli": 64_000, "memory_mib": 65_536,
            "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "A100", "memory_mib": 40_960, "fake": True}
                     for i in range(gpus)]}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# the world ---------------------------------------------------------------------------------------------------


@dataclass
class Tenant:
    org: str
    project: str = ""
    annex: str = ""  # a second project, only for B to take its name
    queue: str = ""
    users: dict[str, str] = field(default_factory=dict)  # role (or "victim") -> user name
    tokens: dict[str, str] = field(default_factory=dict)  # role -> API token
    token_ids: dict[str, str] = field(default_factory=dict)  # role -> token id
    job: str = ""  # placed on the node and running there (its log and usage exist), holding one of its GPUs
    held: str = ""  # waiting for a project admin's approval
    budget: str = ""  # the id of its project's budget
    idem: str = ""  # the Idempotency-Key `job` was submitted with
    cursor: str = ""  # a page cursor of this tenant's job list
    ids: set[str] = field(default_factory=set)  # every opaque id and token prefix of the tenant
    logs: set[str] = field(default_factory=set)  # the lines its running job logged

    def __post_init__(self) -> None:
        self.project, self.annex = self.project or f"{self.org}-lab", self.annex or f"{self.org}-annex"
        self.queue = self.queue or f"{self.org}-q"
        self.users = self.users or {role: f"{self.org}-{role}" for role in (*TENANT_ROLES, "victim")}

    @classmethod
    def ghost(cls) -> Tenant:
        """A tenant whose objects do not exist: the answers about it are what "not found" looks like."""
        fake = {role: uuid.uuid4().hex for role in TENANT_ROLES}
        return cls(unique("ghost"), token_ids=fake, job=uuid.uuid4().hex, held=uuid.uuid4().hex, idem=unique("ghost"),
                   cursor="OTk5OTk5", budget=uuid.uuid4().hex)  # base64 of 999999

    def placeholders(self) -> list[tuple[str, str]]:
        """(value, placeholder) for this tenant's ids and names, to compare its answers with another tenant's."""
        pairs = [(self.job, "<job>"), (self.held, "<held>"), (self.idem, "<idem>"), (self.cursor, "<cursor>"),
                 (self.budget, "<budget>")]
        pairs += [(token_id, f"<token {role}>") for role, token_id in self.token_ids.items()]
        return [*pairs, (self.org, "<org>")]


@dataclass
class World:
    server: Server
    a: Tenant
    b: Tenant
    node: str  # two GPUs: A's and B's placed jobs hold one each
    spare: str  # no GPUs: operators cordon and uncordon it
    agent: str  # the node credential of `node`
    agent_tls: ssl.SSLContext | None = None  # the client context of its channel certificate
    clients: dict[str | None, httpx.Client] = field(default_factory=dict)
    a_state: dict[str, Any] = field(default_factory=dict)  # A's state after the last S1 case (see _snapshot)

    def as_(self, token: str | None) -> httpx.Client:
        """A client with `token` (None: no Authorization header at all), kept for the module."""
        if token not in self.clients:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            self.clients[token] = httpx.Client(base_url=f"{self.server.url}{API}", timeout=30, headers=headers)
        return self.clients[token]

    @property
    def operator(self) -> httpx.Client:
        return self.as_(self.server.token)

    def caller(self, column: str) -> httpx.Client:
        """The client of a role-matrix column, on tenant A."""
        token = {"operator": self.server.token, "agent": self.agent, "anonymous": None}.get(column)
        return self.as_(self.a.tokens[column] if column in TENANT_ROLES else token)

    def held_job(self, client: httpx.Client | None = None) -> str:
        """A fresh job of A waiting for approval (eight GPUs never fit, approved or not), by `client` or A's admin."""
        client = client or self.as_(self.a.tokens["tenant-admin"])
        return _ok(client.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": self.a.queue}), 201)["id"]

    def victim_token(self) -> str:
        body = {"user": self.a.users["victim"], "org": self.a.org, "name": "victim"}
        return _ok(self.operator.post("/tokens", json=body), 201)["id"]

    def join_token(self) -> str:
        return _ok(self.operator.post("/join-tokens", json={}), 201)["token"]

    def fresh_node(self) -> str:
        name = unique("gone")
        _register(self.operator, name, gpus=0)
        return name

    def fresh_queue(self) -> str:
        name = unique("q")
        _ok(self.operator.post("/queues", json={"name": name, "org": self.a.org}), 201)
        return name

    def fresh_budget(self) -> str:
        """A budget of A's (by A's tenant admin) on a fresh queue of A's."""
        body = {"scope": "queue", "name": self.fresh_queue(), "gpu_hours": 5}
        return str(_ok(self.as_(self.a.tokens["tenant-admin"]).post("/budgets", json=body), 201)["id"])


def _tenant(op: httpx.Client, org: str) -> Tenant:
    t = Tenant(org)
    t.ids.add(_ok(op.post("/orgs", json={"name": org}), 201)["id"])
    for project in (t.project, t.annex):
        t.ids.add(_ok(op.post("/projects", json={"name": project, "org": org}), 201)["id"])
    # its jobs of eight GPUs never fit, and the queue lets them wait rather than refusing them (hold_unsatisfiable)
    _ok(op.post("/queues", json={"name": t.queue, "org": org, "approval_above_gpus": "1", "hold_unsatisfiable": True}),
        201)
    for role, name in t.users.items():
        body = {"name": name, "org": org, "role": "member" if role == "victim" else role, "projects": [t.project]}
        t.ids.add(_ok(op.post("/users", json=body), 201)["id"])
        if role != "victim":
            token = _ok(op.post("/tokens", json={"user": name, "org": org, "name": "test"}), 201)
            t.tokens[role], t.token_ids[role] = token["token"], token["id"]
            t.ids |= {token["id"], token["prefix"]}
    return t


def _jobs(admin: httpx.Client, t: Tenant) -> None:
    t.idem = unique(t.org)
    body = {"command": ["sleep", "600"], "gpus": "1", "queue": t.queue, "tags": {"team": t.org}}
    t.job = _ok(admin.post("/jobs", json=body, headers={"Idempotency-Key": t.idem}), 201)["id"]
    body = {"command": ["true"], "gpus": "8", "queue": t.queue, "tags": {"team": t.org}}
    t.held = _ok(admin.post("/jobs", json=body), 201)["id"]
    t.cursor = _ok(admin.get("/jobs", params={"limit": 1}))["next_cursor"]
    budget = {"scope": "project", "name": t.project, "gpu_hours": 1000}
    t.budget = _ok(admin.post("/budgets", json=budget), 201)["id"]
    t.ids |= {t.job, t.held, t.budget}


def _register(op: httpx.Client, name: str, gpus: int, tls: HandTls | None = None) -> dict[str, Any]:
    """Join a node (with `tls`'s CSR when given: it may open its channel); the registration reply."""
    join = _ok(op.post("/join-tokens", json={}), 201)["token"]
    return dict(_ok(op.post("/agent/register", json={**registration(join, name, gpus),
                                                       "csr": tls.csr() if tls else ""})))


def _build(server: Server) -> World:
    w = World(server, Tenant("acme"), Tenant("globex"), "gpu-1", "spare-1", "")
    w.a, w.b = _tenant(w.operator, "acme"), _tenant(w.operator, "globex")
    _ok(w.operator.post("/queues", json={"name": HELD_QUEUE, "org": "default", "hold_unsatisfiable": True}), 201)
    tls = HandTls()
    reply = _register(w.operator, w.node, gpus=2, tls=tls)
    w.agent, w.agent_tls = reply["credential"], tls.context(reply)
    _register(w.operator, w.spare, gpus=0)
    for t in (w.a, w.b):
        _jobs(w.as_(t.tokens["tenant-admin"]), t)
    _until(lambda: all(_ok(w.operator.get(f"/jobs/{t.job}"))["state"] == "scheduled" for t in (w.a, w.b)))
    _run_placed_jobs(w)

    def metered() -> set[str]:
        return {row["key"] for row in _ok(w.operator.get("/usage", params={"by": "job"}))}

    _until(lambda: {w.a.job, w.b.job} <= metered())  # /usage and statements have something to hide
    return w


def _until(condition: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the world did not come about"
        time.sleep(0.05)


def _run_placed_jobs(w: World) -> None:
    """Be the node's agent for a moment: start both placed jobs, log a secret line each, heartbeat once."""
    seq = itertools.count(1)

    def frame(kind: str, **fields: Any) -> str:
        return json.dumps({"type": kind, "boot_id": "boot", "seq": next(seq), **fields})

    with connect(channel_url(w.server.url), proxy=None, ssl=w.agent_tls, open_timeout=30,
                 additional_headers={"Authorization": f"Bearer {w.agent}"}) as ws:
        ws.send(frame("hello", running=[]))
        launches: dict[str, dict[str, Any]] = {}
        while not {w.a.job, w.b.job} <= set(launches):
            order = json.loads(ws.recv(timeout=30))
            launches |= {order["job_id"]: order} if order["type"] == "launch" else {}
        for t in (w.a, w.b):
            order, line = launches[t.job], unique(f"{t.org}-log-line")
            grant = {"allocation_id": order["allocation_id"], "attempt": order["attempt"]}
            ws.send(frame("task_status", state="started", **grant))
            ws.send(frame("log", offset=0, data=line + "\n", **grant))
            t.ids.add(order["allocation_id"])
            t.logs.add(line)
        # billing ends at the node's last heartbeat: make it a whole metering period after both confirmed starts
        # (the control plane's clock: on a loaded machine it may handle the reports well after they were sent)
        _until(lambda: all(_ok(w.operator.get(f"/jobs/{t.job}"))["state"] == "running" for t in (w.a, w.b)))
        time.sleep(1.1)
        last = next(seq)
        ws.send(json.dumps({"type": "heartbeat", "boot_id": "boot", "seq": last}))
        while json.loads(ws.recv(timeout=30)) != {"type": "ack", "seq": last}:
            pass


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One control plane per backend for the module, with tenants acme (A) and globex (B)."""
    url = None
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"iso{free_port()}")
    root: Path = tmp_path_factory.mktemp(f"isolation-{request.param}")
    server = start_server(root / "data", url, env=SERVER_ENV)
    try:
        w = _build(server)
        yield w
        for client in w.clients.values():
            client.close()
    finally:
        stop_server(server)


# S1: tenant B against tenant A's objects ---------------------------------------------------------------------

Attempt = Callable[[httpx.Client, Tenant, World], httpx.Response]


@dataclass(frozen=True)
class Case:
    route: str  # "METHOD /path" as the OpenAPI spec names it
    what: str
    attempt: Attempt  # what B's user tries with target tenant t (A, or the ghost)
    admin: int  # the status B's tenant admin gets
    member: int  # the status B's member gets
    oracle: str = ""  # a known way the answer differs from "not found" (reported; the test xfails on it)


def _held_job_body(w: World) -> dict[str, Any]:
    return {"command": ["true"], "gpus": "8", "queue": w.b.queue}


CASES = [
    Case("GET /api/v1/whoami", "who am I", lambda c, t, w: c.get("/whoami"), 200, 200),
    Case("GET /api/v1/orgs", "list", lambda c, t, w: c.get("/orgs"), 200, 200),
    Case("POST /api/v1/orgs", "A's name", lambda c, t, w: c.post("/orgs", json={"name": t.org}), 403, 403),
    Case("GET /api/v1/projects", "list", lambda c, t, w: c.get("/projects"), 200, 200),
    Case("POST /api/v1/projects", "in A's org",
         lambda c, t, w: c.post("/projects", json={"name": "spy", "org": t.org}), 404, 403),
    Case("POST /api/v1/projects", "A's project name in B (names are per tenant)",
         lambda c, t, w: c.post("/projects", json={"name": t.annex}), 201, 403),
    Case("GET /api/v1/users", "list", lambda c, t, w: c.get("/users"), 200, 403),
    Case("POST /api/v1/users", "in A's org",
         lambda c, t, w: c.post("/users", json={"name": "spy", "org": t.org}), 404, 403),
    Case("POST /api/v1/users", "into A's project",
         lambda c, t, w: c.post("/users", json={"name": "spy", "projects": [t.project]}), 422, 403),
    Case("GET /api/v1/tokens", "list", lambda c, t, w: c.get("/tokens"), 200, 200),
    Case("POST /api/v1/tokens", "for A's user by name",
         lambda c, t, w: c.post("/tokens", json={"user": t.users["member"]}), 404, 403),
    Case("POST /api/v1/tokens", "for A's user in A's org",
         lambda c, t, w: c.post("/tokens", json={"user": t.users["member"], "org": t.org}), 404, 403),
    Case("POST /api/v1/tokens", "for oneself in A's org",
         lambda c, t, w: c.post("/tokens", json={"user": w.b.users["member"], "org": t.org}), 404, 403),
    Case("DELETE /api/v1/tokens/{token_id}", "A's member's token",
         lambda c, t, w: c.delete(f"/tokens/{t.token_ids['member']}"), 404, 404),
    Case("DELETE /api/v1/tokens/{token_id}", "A's tenant admin's token",
         lambda c, t, w: c.delete(f"/tokens/{t.token_ids['tenant-admin']}"), 404, 404),
    Case("POST /api/v1/join-tokens", "make one", lambda c, t, w: c.post("/join-tokens", json={}), 403, 403),
    Case("POST /api/v1/sessions", "one's own (it names nothing of A's)", lambda c, t, w: c.post("/sessions"), 201, 201),
    Case("DELETE /api/v1/sessions/current", "with an API token (no session of A's is B's to end)",
         lambda c, t, w: c.delete("/sessions/current"), 404, 404),
    Case("GET /api/v1/queues", "list", lambda c, t, w: c.get("/queues"), 200, 200),
    Case("POST /api/v1/queues", "in A's org",
         lambda c, t, w: c.post("/queues", json={"name": "spy-q", "org": t.org}), 404, 403),
    Case("POST /api/v1/queues", "under A's queue",
         lambda c, t, w: c.post("/queues", json={"name": "spy-q", "parent": t.queue}), 422, 403),
    Case("POST /api/v1/jobs", "into A's project",
         lambda c, t, w: c.post("/jobs", json={**_held_job_body(w), "project": t.project}), 404, 404),
    Case("POST /api/v1/jobs", "into A's queue",
         lambda c, t, w: c.post("/jobs", json={**_held_job_body(w), "queue": t.queue}), 404, 404),
    Case("POST /api/v1/jobs", "with A's Idempotency-Key (a new job of B's)",
         lambda c, t, w: c.post("/jobs", json=_held_job_body(w), headers={"Idempotency-Key": t.idem}), 201, 201),
    Case("GET /api/v1/jobs", "list", lambda c, t, w: c.get("/jobs", params={"limit": 500}), 200, 200),
    Case("GET /api/v1/jobs", "A's queue", lambda c, t, w: c.get("/jobs", params={"queue": t.queue}), 200, 200),
    Case("GET /api/v1/jobs", "A's project", lambda c, t, w: c.get("/jobs", params={"project": t.project}), 200, 200),
    Case("GET /api/v1/jobs", "A's tag", lambda c, t, w: c.get("/jobs", params={"tag": f"team={t.org}"}), 200, 200),
    Case("GET /api/v1/jobs", "awaiting approval",
         lambda c, t, w: c.get("/jobs", params={"state": "pending_approval"}), 200, 200),
    Case("GET /api/v1/jobs", "A's cursor",
         lambda c, t, w: c.get("/jobs", params={"cursor": t.cursor, "limit": 500}), 200, 200),
    Case("GET /api/v1/jobs/{job_id}", "A's placed job", lambda c, t, w: c.get(f"/jobs/{t.job}"), 404, 404),
    Case("GET /api/v1/jobs/{job_id}", "A's held job", lambda c, t, w: c.get(f"/jobs/{t.held}"), 404, 404),
    Case("POST /api/v1/jobs/{job_id}/cancel", "A's placed job",
         lambda c, t, w: c.post(f"/jobs/{t.job}/cancel"), 404, 404),
    Case("POST /api/v1/jobs/{job_id}/cancel", "A's held job",
         lambda c, t, w: c.post(f"/jobs/{t.held}/cancel"), 404, 404),
    Case("POST /api/v1/jobs/{job_id}/approve", "A's held job",
         lambda c, t, w: c.post(f"/jobs/{t.held}/approve", json={"note": "mine now"}), 404, 404),
    Case("POST /api/v1/jobs/{job_id}/deny", "A's held job",
         lambda c, t, w: c.post(f"/jobs/{t.held}/deny", json={"note": "no"}), 404, 404),
    Case("GET /api/v1/jobs/{job_id}/events", "A's placed job",
         lambda c, t, w: c.get(f"/jobs/{t.job}/events"), 404, 404),
    Case("GET /api/v1/jobs/{job_id}/why", "A's held job", lambda c, t, w: c.get(f"/jobs/{t.held}/why"), 404, 404),
    Case("GET /api/v1/jobs/{job_id}/logs", "A's placed job",
         lambda c, t, w: c.get(f"/jobs/{t.job}/logs", params={"offset": 0}), 404, 404),
    Case("GET /api/v1/nodes", "list", lambda c, t, w: c.get("/nodes"), 200, 200),
    Case("POST /api/v1/nodes/{name}/cordon", "the node A's job runs on",
         lambda c, t, w: c.post(f"/nodes/{w.node}/cordon"), 403, 403),
    Case("POST /api/v1/nodes/{name}/uncordon", "the node A's job runs on",
         lambda c, t, w: c.post(f"/nodes/{w.node}/uncordon"), 403, 403),
    Case("POST /api/v1/nodes/{name}/reset", "the node A's job runs on (its work would be requeued)",
         lambda c, t, w: c.post(f"/nodes/{w.node}/reset"), 403, 403),
    Case("POST /api/v1/nodes/{name}/down", "the node A's job runs on (its work would be requeued)",
         lambda c, t, w: c.post(f"/nodes/{w.node}/down"), 403, 403),
    Case("POST /api/v1/nodes/{name}/drain", "the node A's job runs on (its work would be evicted now)",
         lambda c, t, w: c.post(f"/nodes/{w.node}/drain", json={"deadline_s": 0}), 403, 403),
    Case("POST /api/v1/nodes/{name}/undrain", "the node A's job runs on",
         lambda c, t, w: c.post(f"/nodes/{w.node}/undrain"), 403, 403),
    Case("DELETE /api/v1/nodes/{name}", "the node A's job runs on, forced (its work would be requeued)",
         lambda c, t, w: c.delete(f"/nodes/{w.node}", params={"force": True}), 403, 403),
    Case("GET /api/v1/top", "who uses what", lambda c, t, w: c.get("/top"), 200, 200),
    Case("POST /api/v1/agent/register", "take over A's node with a user token, no join token",
         lambda c, t, w: c.post("/agent/register", json=registration(f"{t.org}-join.secret", w.node, 8)), 401, 401),
    Case("GET /api/v1/prices", "list", lambda c, t, w: c.get("/prices"), 200, 200),
    Case("PUT /api/v1/prices", "price A's GPUs",
         lambda c, t, w: c.put("/prices", json={"model": "A100", "cents_per_gpu_hour": 0}), 403, 403),
    Case("GET /api/v1/budgets", "list", lambda c, t, w: c.get("/budgets"), 200, 200),
    Case("POST /api/v1/budgets", "on A's project",
         lambda c, t, w: c.post("/budgets", json={"scope": "project", "name": t.project, "gpu_hours": 1}), 404, 403),
    Case("POST /api/v1/budgets", "on A's queue (a hard one would stop A's jobs)", lambda c, t, w: c.post(
        "/budgets", json={"scope": "queue", "name": t.queue, "cents": 1, "hard": True}), 404, 403),
    Case("GET /api/v1/usage", "by job", lambda c, t, w: c.get("/usage", params={"by": "job"}), 200, 200),
    Case("GET /api/v1/usage", "by project", lambda c, t, w: c.get("/usage", params={"by": "project"}), 200, 200),
    Case("GET /api/v1/usage", "by user", lambda c, t, w: c.get("/usage", params={"by": "user"}), 200, 200),
    Case("GET /api/v1/usage", "by A's tag", lambda c, t, w: c.get("/usage", params={"by": "tag:team"}), 200, 200),
    Case("GET /api/v1/usage/statement", "A's project, this month",
         lambda c, t, w: c.get("/usage/statement", params={"project": t.project, "month": MONTH}), 200, 200),
    Case("GET /api/v1/usage/statement", "A's project as HTML", lambda c, t, w: c.get(
        "/usage/statement", params={"project": t.project, "month": MONTH, "format": "html"}), 200, 200),
    Case("GET /api/v1/cluster/samples", "cluster figures", lambda c, t, w: c.get("/cluster/samples"), 200, 200),
    Case("GET /api/v1/audit", "A's organisation's requests",
         lambda c, t, w: c.get("/audit", params={"org": t.org}), 403, 403),
    Case("GET /api/v1/orgs/{name}/ceiling", "A's", lambda c, t, w: c.get(f"/orgs/{t.org}/ceiling"), 404, 404),
    Case("PUT /api/v1/orgs/{name}/ceiling", "raise A's", lambda c, t, w: c.put(
        f"/orgs/{t.org}/ceiling", json={"guaranteed": {"gpus": "64"}}), 403, 403),
    Case("GET /api/v1/resource-prices", "list", lambda c, t, w: c.get("/resource-prices"), 200, 200),
    Case("PUT /api/v1/resource-prices", "price A's CPUs",
         lambda c, t, w: c.put("/resource-prices", json={"resource": "cpu", "cents_per_hour": 0}), 403, 403),
    Case("PATCH /api/v1/queues/{name}", "A's queue by name (its guarantee)",
         lambda c, t, w: c.patch(f"/queues/{t.queue}", json={"guaranteed": {"gpus": "0"}}), 404, 403),
    Case("PATCH /api/v1/queues/{name}", "A's queue in A's org, as a dry run",
         lambda c, t, w: c.patch(f"/queues/{t.queue}", params={"org": t.org, "dry_run": "true"},
                                 json={"priority": 0}), 404, 403),
    Case("DELETE /api/v1/queues/{name}", "A's queue (its jobs moved to B's)",
         lambda c, t, w: c.delete(f"/queues/{t.queue}", params={"move_to": w.b.queue}), 404, 403),
    Case("DELETE /api/v1/queues/{name}", "A's queue in A's org, as a dry run",
         lambda c, t, w: c.delete(f"/queues/{t.queue}", params={"org": t.org, "dry_run": "true"}), 404, 403),
    Case("PATCH /api/v1/budgets/{budget_id}", "A's project budget made hard and tiny", lambda c, t, w: c.patch(
        f"/budgets/{t.budget}", json={"gpu_hours": 0.0001, "hard": True}), 404, 403),
    Case("DELETE /api/v1/budgets/{budget_id}", "A's project budget", lambda c, t, w: c.delete(f"/budgets/{t.budget}"),
         404, 403),
    Case("GET /api/v1/jobs", "A's job by a 12-character id prefix (none of B's begins so)",
         lambda c, t, w: c.get("/jobs", params={"id_prefix": t.job[:12]}), 200, 200),
    Case("GET /api/v1/jobs", "A's held job by a 1-character id prefix",
         lambda c, t, w: c.get("/jobs", params={"id_prefix": t.held[:1], "limit": 500}), 200, 200),
    # last: from here on B has a queue of A's queue's name (names are per organisation), and B's jobs go there
    Case("POST /api/v1/queues", "A's queue name (B gets one of its own)",
         lambda c, t, w: c.post("/queues", json={"name": t.queue, "over_quota_weight": 0}), 201, 403),
]
CALLERS = ("tenant-admin", "member")
S1_PARTS = ["routes"] + [f"case {i} as {caller}" for i in range(len(CASES)) for caller in CALLERS]


@dataclass
class Figures:
    """The parts of this backend's S1 and S2 lines (see the module docstring)."""

    backend: str
    s1: Parts
    s2: Parts

    def s1_part(self, name: str, **numbers: Any) -> None:
        found = self.s1.add(name, **numbers)
        if found is not None:
            routes, cases = found.pop("routes"), found.values()
            covered = len(routes["spec"]) - len(routes["without_case"])
            figure(f"S1  routes={covered}/{len(routes['spec'])} covered={100 * covered // len(routes['spec'])}% "
                   f"cases={len(cases)} cross_tenant_success={sum(c['success'] for c in cases)} "
                   f"side_effects={sum(c['side_effect'] for c in cases)} "
                   f"answered_like_missing={sum(c['like_missing'] for c in cases)}/{len(cases)} "
                   f"known_oracles={sum(c['oracle'] for c in cases)} ({self.backend})")

    def s2_part(self, name: str, **numbers: Any) -> None:
        found = self.s2.add(name, **numbers)
        if found is not None:
            routes, rows = found.pop("routes"), found.values()
            covered = len(routes["spec"]) - len(routes["without_row"])
            figure(f"S2  cells={sum(r['cells'] for r in rows)} mismatches={sum(r['mismatches'] for r in rows)} "
                   f"roles={len(COLUMNS)} rows={len(rows)} routes={covered}/{len(routes['spec'])} ({self.backend})")


@pytest.fixture(scope="module")
def figures(world: World, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Figures:
    backend = "postgres" if world.server.database_url else "sqlite"
    base = tmp_path_factory.getbasetemp()
    return Figures(backend, Parts(session_folder(base, worker_id, f"s1-{backend}"), S1_PARTS),
                   Parts(session_folder(base, worker_id, f"s2-{backend}"), S2_PARTS))


def _snapshot(w: World) -> dict[str, Any]:
    """A's state as A's tenant admin reads it: what a cross-tenant write would change (a revoked token too)."""
    c = w.as_(w.a.tokens["tenant-admin"])
    paths = ["/orgs", "/projects", "/users", "/tokens", "/queues", "/jobs?limit=500", "/budgets"]
    state: dict[str, Any] = {path: _read(c.get(path)) for path in paths}
    status, page = state["/jobs?limit=500"]
    for job in page["items"] if status == 200 else []:
        job.pop("reason", None)  # the scheduler's, not B's
    state |= {j: _read(c.get(f"/jobs/{j}/events")) for j in (w.a.job, w.a.held)}
    return state


def _read(response: httpx.Response) -> tuple[int, Any]:
    return response.status_code, response.json() if response.is_success else response.text


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _objects(item)


def _leaks(response: httpx.Response, t: Tenant) -> list[str]:
    """A's ids or log lines in an answer that the request did not carry, and objects of A's organisation."""
    sent = str(response.request.url) + response.request.content.decode(errors="replace")
    found = [f"id {i}" for i in sorted(t.ids | t.logs) if i in response.text and i not in sent]
    if response.is_success and response.headers.get("content-type", "").startswith("application/json"):
        found += [f"object {o}" for o in _objects(response.json()) if o.get("org") == t.org]
    return found


def _answer(response: httpx.Response, t: Tenant) -> tuple[int, str]:
    """Status and error text with t's ids and names replaced by placeholders (a success's body may vary)."""
    text = "" if response.is_success else response.text
    for value, placeholder in t.placeholders():
        text = text.replace(value, placeholder) if value else text
    return response.status_code, text


@pytest.mark.parametrize(("index", "caller"), [
    pytest.param(i, caller, id=f"{case.route} {case.what} as {caller}")
    for i, case in enumerate(CASES) for caller in CALLERS])
def test_tenant_b_cannot_reach_tenant_a(world: World, figures: Figures, index: int, caller: str) -> None:
    case = CASES[index]
    client = world.as_(world.b.tokens[caller])
    before = world.a_state or _snapshot(world)
    real = case.attempt(client, world.a, world)
    ghost_tenant = Tenant.ghost()
    ghost = case.attempt(client, ghost_tenant, world)
    world.a_state = after = _snapshot(world)  # the next case starts from here, so only the culprit fails
    expected = case.admin if caller == "tenant-admin" else case.member
    unexpected_success = real.is_success and not 200 <= expected < 300
    like_missing = _answer(real, world.a) == _answer(ghost, ghost_tenant)
    figures.s1_part(f"case {index} as {caller}", success=bool(unexpected_success or _leaks(real, world.a)),
                    side_effect=after != before, like_missing=like_missing,
                    oracle=bool(case.oracle and caller == "tenant-admin" and not like_missing))
    assert real.status_code == expected, _show(real)
    assert not _leaks(real, world.a), f"A's objects in B's answer: {_leaks(real, world.a)}\n{real.text[:2000]}"
    assert after == before, "B's request changed A's state"
    if case.oracle and caller == "tenant-admin":
        assert _answer(real, world.a) != _answer(ghost, ghost_tenant), "fixed: drop `oracle` from this case"
        pytest.xfail(case.oracle)
    assert _answer(real, world.a) == _answer(ghost, ghost_tenant), "A's objects answer unlike missing ones"


def test_every_route_has_an_isolation_case_and_a_role_row(world: World, figures: Figures) -> None:
    routes = spec_routes(world.server)
    spec = sorted(routes)
    figures.s1_part("routes", spec=spec, without_case=sorted(routes - {c.route for c in CASES}))
    figures.s2_part("routes", spec=spec, without_row=sorted(routes - {r.route for r in ROWS}))
    assert routes - {c.route for c in CASES} == set(), "routes without an S1 case in CASES"
    assert routes - {r.route for r in ROWS} == set(), "routes without an S2 row in ROWS"
    assert ({c.route for c in CASES} | {r.route for r in ROWS}) - routes == set(), "table rows for no route"


def test_ids_are_random_uuids(world: World) -> None:
    for t in (world.a, world.b):
        prefixes = {i for i in t.ids if len(i) == 10}  # token prefixes: 40 random bits
        assert len(prefixes) == len(t.tokens)
        assert {uuid.UUID(hex=i).version for i in t.ids - prefixes} == {4}


# S2: every role against every route, on its own tenant -------------------------------------------------------

COLUMNS = ("viewer", "member", "project-admin", "tenant-admin", "operator", "agent", "anonymous")
Call = Callable[[httpx.Client, str, World], httpx.Response]


@dataclass(frozen=True)
class Row:
    route: str
    what: str
    call: Call  # (the caller's client, its column, the world) -> the answer
    expect: tuple[int, ...]  # one status per column of COLUMNS


def _own_job(c: httpx.Client, column: str, w: World) -> str:
    """A job of the caller's own (roles that cannot submit get one of A's tenant admin's); the operator's is in its
    own organisation's queue (queue names are per organisation)."""
    if column == "operator":
        return str(_ok(c.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": HELD_QUEUE}), 201)["id"])
    return w.held_job(c) if column in ("member", "project-admin", "tenant-admin") else w.held_job()


def _queue_of(column: str) -> str:
    """The queue a role submits to: A's, or for the operator (of organisation "default") its own."""
    return HELD_QUEUE if column == "operator" else "acme-q"


def _own_token(c: httpx.Client, column: str, w: World) -> str:
    return _ok(c.post("/tokens", json={"name": "mine"}), 201)["id"] if column in COLUMNS[:5] else w.victim_token()


def _log_out(c: httpx.Client, column: str, w: World) -> httpx.Response:
    """Open a session with the caller's token (where it may) and end it with the session's own token."""
    opened = c.post("/sessions")
    session = {"Authorization": f"Bearer {opened.json()['token']}"} if opened.status_code == 201 else {}
    return c.delete("/sessions/current", headers=session)


USERS = (200,) * 5  # every user role
ROWS = [  # viewer, member, project-admin, tenant-admin, operator, agent, anonymous
    Row("GET /api/v1/whoami", "", lambda c, r, w: c.get("/whoami"), (*USERS, 200, 401)),
    Row("GET /api/v1/orgs", "", lambda c, r, w: c.get("/orgs"), (*USERS, 200, 401)),
    Row("GET /api/v1/orgs/{name}/ceiling", "its own organisation's", lambda c, r, w: c.get("/orgs/acme/ceiling"),
        (*USERS, 403, 401)),
    Row("PUT /api/v1/orgs/{name}/ceiling", "the default one", lambda c, r, w: c.put("/orgs/acme/ceiling", json={}),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("POST /api/v1/orgs", "", lambda c, r, w: c.post("/orgs", json={"name": unique("org")}),
        (403, 403, 403, 403, 201, 403, 401)),
    Row("GET /api/v1/projects", "", lambda c, r, w: c.get("/projects"), (*USERS, 200, 401)),
    Row("POST /api/v1/projects", "", lambda c, r, w: c.post("/projects", json={"name": unique("p"), "org": "acme"}),
        (403, 403, 403, 201, 201, 403, 401)),
    Row("GET /api/v1/users", "", lambda c, r, w: c.get("/users"), (403, 403, 200, 200, 200, 403, 401)),
    Row("POST /api/v1/users", "", lambda c, r, w: c.post("/users", json={
        "name": unique("u"), "org": "acme", "projects": ["acme-lab"]}), (403, 403, 403, 201, 201, 403, 401)),
    Row("GET /api/v1/tokens", "", lambda c, r, w: c.get("/tokens"), (*USERS, 200, 401)),
    Row("POST /api/v1/tokens", "for oneself", lambda c, r, w: c.post("/tokens", json={"name": "mine"}),
        (201, 201, 201, 201, 201, 403, 401)),
    Row("POST /api/v1/tokens", "for another user", lambda c, r, w: c.post("/tokens", json={
        "user": "acme-victim", "org": "acme"}), (403, 403, 403, 201, 201, 403, 401)),
    Row("DELETE /api/v1/tokens/{token_id}", "one's own",
        lambda c, r, w: c.delete(f"/tokens/{_own_token(c, r, w)}"), (204, 204, 204, 204, 204, 404, 401)),
    Row("DELETE /api/v1/tokens/{token_id}", "another user's",
        lambda c, r, w: c.delete(f"/tokens/{w.victim_token()}"), (404, 404, 404, 204, 204, 404, 401)),
    Row("POST /api/v1/join-tokens", "", lambda c, r, w: c.post("/join-tokens", json={}),
        (403, 403, 403, 403, 201, 403, 401)),
    Row("POST /api/v1/sessions", "", lambda c, r, w: c.post("/sessions"), (201, 201, 201, 201, 201, 403, 401)),
    Row("DELETE /api/v1/sessions/current", "one's own session", _log_out, (204, 204, 204, 204, 204, 404, 401)),
    Row("GET /api/v1/queues", "", lambda c, r, w: c.get("/queues"), (*USERS, 403, 401)),
    Row("POST /api/v1/queues", "a top-level queue within its organisation's ceiling", lambda c, r, w: c.post(
        "/queues", json={"name": unique("q"), "org": "acme", "over_quota_weight": 0}),
        (403, 403, 403, 201, 201, 403, 401)),
    Row("POST /api/v1/queues", "a top-level queue with a guarantee above its organisation's ceiling",
        lambda c, r, w: c.post("/queues", json={"name": unique("q"), "org": "acme", "guaranteed": {"gpus": "1"},
                                                "over_quota_weight": 0}), (403, 403, 403, 403, 201, 403, 401)),
    Row("POST /api/v1/jobs", "into the queue of one's organisation", lambda c, r, w: c.post("/jobs", json={
        "command": ["true"], "gpus": "8", "queue": _queue_of(r)}), (403, 201, 201, 201, 201, 403, 401)),
    Row("GET /api/v1/jobs", "", lambda c, r, w: c.get("/jobs"), (*USERS, 200, 401)),
    Row("GET /api/v1/jobs/{job_id}", "", lambda c, r, w: c.get(f"/jobs/{w.held_job()}"), (*USERS, 404, 401)),
    Row("POST /api/v1/jobs/{job_id}/cancel", "someone else's job",
        lambda c, r, w: c.post(f"/jobs/{w.held_job()}/cancel"), (403, 403, 200, 200, 200, 404, 401)),
    Row("POST /api/v1/jobs/{job_id}/cancel", "one's own job",
        lambda c, r, w: c.post(f"/jobs/{_own_job(c, r, w)}/cancel"), (403, 200, 200, 200, 200, 404, 401)),
    Row("POST /api/v1/jobs/{job_id}/approve", "", lambda c, r, w: c.post(f"/jobs/{w.held_job()}/approve", json={}),
        (403, 403, 200, 200, 200, 404, 401)),
    Row("POST /api/v1/jobs/{job_id}/deny", "", lambda c, r, w: c.post(f"/jobs/{w.held_job()}/deny", json={}),
        (403, 403, 200, 200, 200, 404, 401)),
    Row("GET /api/v1/jobs/{job_id}/events", "", lambda c, r, w: c.get(f"/jobs/{w.held_job()}/events"),
        (*USERS, 404, 401)),
    Row("GET /api/v1/jobs/{job_id}/why", "", lambda c, r, w: c.get(f"/jobs/{w.held_job()}/why"), (*USERS, 404, 401)),
    Row("GET /api/v1/jobs/{job_id}/logs", "", lambda c, r, w: c.get(f"/jobs/{w.held_job()}/logs"),
        (*USERS, 404, 401)),
    Row("GET /api/v1/nodes", "", lambda c, r, w: c.get("/nodes"), (*USERS, 403, 401)),
    Row("POST /api/v1/nodes/{name}/cordon", "", lambda c, r, w: c.post(f"/nodes/{w.spare}/cordon"),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("POST /api/v1/nodes/{name}/uncordon", "", lambda c, r, w: c.post(f"/nodes/{w.spare}/uncordon"),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("POST /api/v1/nodes/{name}/reset", "", lambda c, r, w: c.post(f"/nodes/{w.spare}/reset"),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("POST /api/v1/nodes/{name}/down", "a node never registered: the role passes, the name is unknown",
        lambda c, r, w: c.post("/nodes/never-registered/down"), (403, 403, 403, 403, 404, 403, 401)),
    Row("POST /api/v1/nodes/{name}/drain", "", lambda c, r, w: c.post(f"/nodes/{w.spare}/drain", json={}),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("POST /api/v1/nodes/{name}/undrain", "", lambda c, r, w: c.post(f"/nodes/{w.spare}/undrain"),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("DELETE /api/v1/nodes/{name}", "an empty node joined for the call",
        lambda c, r, w: c.delete(f"/nodes/{w.fresh_node()}"), (403, 403, 403, 403, 200, 403, 401)),
    Row("GET /api/v1/top", "", lambda c, r, w: c.get("/top"), (*USERS, 403, 401)),
    Row("POST /api/v1/agent/register", "with a fresh join token (it, not the bearer, authenticates)",
        lambda c, r, w: c.post("/agent/register", json=registration(w.join_token(), unique("node"))), (200,) * 7),
    Row("GET /api/v1/prices", "", lambda c, r, w: c.get("/prices"), (*USERS, 403, 401)),
    Row("PUT /api/v1/prices", "", lambda c, r, w: c.put("/prices", json={"model": "H100", "cents_per_gpu_hour": 250}),
        (403, 403, 403, 403, 200, 403, 401)),
    Row("GET /api/v1/resource-prices", "", lambda c, r, w: c.get("/resource-prices"), (*USERS, 403, 401)),
    Row("PUT /api/v1/resource-prices", "", lambda c, r, w: c.put("/resource-prices", json={
        "resource": "memory", "cents_per_hour": 1}), (403, 403, 403, 403, 200, 403, 401)),
    Row("GET /api/v1/budgets", "", lambda c, r, w: c.get("/budgets"), (*USERS, 403, 401)),
    Row("POST /api/v1/budgets", "on a fresh queue of A's (an operator's budget is in its own organisation)",
        lambda c, r, w: c.post("/budgets", json={"scope": "queue", "name": w.fresh_queue(), "gpu_hours": 5}),
        (403, 403, 403, 201, 404, 403, 401)),
    Row("GET /api/v1/usage", "", lambda c, r, w: c.get("/usage"), (*USERS, 403, 401)),
    Row("GET /api/v1/usage/statement", "", lambda c, r, w: c.get("/usage/statement", params={
        "project": "acme-lab", "month": MONTH}), (*USERS, 403, 401)),
    Row("GET /api/v1/cluster/samples", "", lambda c, r, w: c.get("/cluster/samples"), (*USERS, 403, 401)),
    Row("PATCH /api/v1/queues/{name}", "A's queue, its priority as it is",
        lambda c, r, w: c.patch("/queues/acme-q", params={"org": "acme"}, json={"priority": 0}),
        (403, 403, 403, 200, 200, 403, 401)),
    Row("DELETE /api/v1/queues/{name}", "a fresh queue of A's",
        lambda c, r, w: c.delete(f"/queues/{w.fresh_queue()}"), (403, 403, 403, 200, 200, 403, 401)),
    Row("PATCH /api/v1/budgets/{budget_id}", "A's project budget, as it is",
        lambda c, r, w: c.patch(f"/budgets/{w.a.budget}", json={}), (403, 403, 403, 200, 200, 403, 401)),
    Row("DELETE /api/v1/budgets/{budget_id}", "a fresh budget of A's",
        lambda c, r, w: c.delete(f"/budgets/{w.fresh_budget()}"), (403, 403, 403, 200, 200, 403, 401)),
    Row("GET /api/v1/audit", "operators only", lambda c, r, w: c.get("/audit"), (403, 403, 403, 403, 200, 403, 401)),
]


S2_PARTS = ["routes"] + [f"row {i}" for i in range(len(ROWS))]


@pytest.mark.parametrize("index", range(len(ROWS)), ids=[f"{r.route} {r.what}".strip() for r in ROWS])
def test_role_matrix(world: World, figures: Figures, index: int) -> None:
    row = ROWS[index]
    world.a_state.clear()  # A's own users change A: S1's saved state of A is stale from here
    answers = {column: row.call(world.caller(column), column, world) for column in COLUMNS}
    wrong = [f"{column}: expected {expected}, got {_show(answers[column])}"
             for column, expected in zip(COLUMNS, row.expect, strict=True) if answers[column].status_code != expected]
    figures.s2_part(f"row {index}", cells=len(COLUMNS), mismatches=len(wrong))
    assert not wrong, "\n".join(wrong)


def test_a_tenant_admin_cannot_mint_or_revoke_an_operators_token(world: World) -> None:
    """The operator lives in organisation "default"; a tenant admin there must not become it."""
    op = world.operator
    name = unique("default-admin")
    _ok(op.post("/users", json={"name": name, "role": "tenant-admin"}), 201)
    admin = world.as_(_ok(op.post("/tokens", json={"user": name}), 201)["token"])
    bootstrap = next(t for t in _ok(op.get("/tokens")) if t["user"] == "admin" and t["name"] == "bootstrap")
    assert admin.post("/tokens", json={"user": "admin"}).status_code == 403
    assert admin.delete(f"/tokens/{bootstrap['id']}").status_code == 403
    assert op.get("/whoami").status_code == 200
    member = unique("default-member")
    _ok(op.post("/users", json={"name": member}), 201)
    assert admin.post("/tokens", json={"user": member}).status_code == 201  # a lower role still works


def test_only_a_node_credential_opens_the_agent_channel(world: World) -> None:
    """The one WebSocket of the API: a user's token (B's tenant admin, or the operator's) is refused."""
    url = channel_url(world.server.url)  # with the node's own client certificate: the credential decides
    for token, status in ((world.b.tokens["tenant-admin"], 403), (world.server.token, 403),
                          ("gp_0000000000_forged", 401)):
        with pytest.raises(InvalidStatus) as refused:
            connect(url, proxy=None, ssl=world.agent_tls, open_timeout=30,
                    additional_headers={"Authorization": f"Bearer {token}"}).close()
        assert refused.value.response.status_code == status


def test_the_same_names_in_two_tenants_do_not_collide(world: World) -> None:
    """Project and user names are per tenant, so whatever hangs off them must be too (budgets)."""
    name = unique("twin")
    world.a_state.clear()
    for t in (world.a, world.b):
        _ok(world.operator.post("/projects", json={"name": name, "org": t.org}), 201)
        _ok(world.operator.post("/users", json={"name": name, "org": t.org, "projects": [name]}), 201)
        admin = world.as_(t.tokens["tenant-admin"])
        _ok(admin.post("/budgets", json={"scope": "project", "name": name, "gpu_hours": 1}), 201)
        assert [b["name"] for b in _ok(admin.get("/budgets")) if b["name"] == name] == [name]


def test_a_project_budget_counts_and_holds_only_its_own_tenants_project(tmp_path: Path) -> None:
    """Two tenants each with a project "twin": globex's spending must neither show in nor exhaust acme's budget,
    and an exhausted budget of acme's must hold acme's "twin" only (the scheduler keys holds by project id)."""
    from gpupool.server.db.engine import Database, migrate
    from gpupool.server.db.models import Budget, LedgerEntry, Org, Project
    from gpupool.server.services import rollup
    from gpupool.server.services.metering import budget_use, exhausted_hard_budgets

    db = Database(f"sqlite:///{tmp_path / 'budgets.db'}")
    migrate(db.url)
    now = datetime.now(UTC)
    with db.session() as session:
        orgs = [Org(name="acme"), Org(name="globex")]
        session.add_all(orgs)
        session.flush()
        twins = [Project(org_id=org.id, name="twin") for org in orgs]
        session.add_all(twins)
        session.flush()
        entry = LedgerEntry(source_key="globex-1", org_id=orgs[1].id, project_id=twins[1].id, user_id="u",
                            queue="q", job_id="j", allocation_id="a", model="A100", start=now, end=now,
                            gpu_milli=1000, gpu_milli_seconds=3_600_000, cost_micro_cents=10**8, tags={})
        session.add(entry)
        rollup.add(session, [entry])  # as the meter writes every entry
        budgets = [Budget(org_id=org.id, scope="project", name="twin", period="month", gpu_hours=0.5, hard=True)
                   for org in orgs]  # the same name in two tenants is two budgets
        session.add_all(budgets)
        session.flush()
        assert budget_use(session, budgets[0], now) == (0, 0)
        assert budget_use(session, budgets[1], now) == (1, 100)
        assert list(exhausted_hard_budgets(session, now)) == [("project", twins[1].id)]


def test_a_queue_budget_counts_and_holds_only_its_own_tenants_queue(tmp_path: Path) -> None:
    """Queue names are per organisation: two tenants each with a queue "twin", globex's spending neither shows in
    nor exhausts acme's budget, and globex's exhausted budget holds globex's "twin" only (the scheduler keys holds by
    the core's queue key, which names the organisation)."""
    from gpupool.server.db.engine import Database, migrate
    from gpupool.server.db.models import Budget, LedgerEntry, Org, Project, QueueRow
    from gpupool.server.services import rollup
    from gpupool.server.services.metering import budget_use, exhausted_hard_budgets

    db = Database(f"sqlite:///{tmp_path / 'budgets.db'}")
    migrate(db.url)
    now = datetime.now(UTC)
    with db.session() as session:
        orgs = [Org(name="acme"), Org(name="globex")]
        session.add_all(orgs)
        session.flush()
        session.add_all([QueueRow(name="twin", org_id=org.id, guaranteed={}) for org in orgs])
        project = Project(org_id=orgs[1].id, name="lab")
        session.add(project)
        session.flush()
        entry = LedgerEntry(source_key="globex-1", org_id=orgs[1].id, project_id=project.id, user_id="u",
                            queue="twin", job_id="j", allocation_id="a", model="A100", start=now, end=now,
                            gpu_milli=1000, gpu_milli_seconds=3_600_000, cost_micro_cents=10**8, tags={})
        session.add(entry)
        rollup.add(session, [entry])
        budgets = [Budget(org_id=org.id, scope="queue", name="twin", period="month", gpu_hours=0.5, hard=True)
                   for org in orgs]
        session.add_all(budgets)
        session.flush()
        assert budget_use(session, budgets[0], now) == (0, 0)
        assert budget_use(session, budgets[1], now) == (1, 100)
        assert list(exhausted_hard_budgets(session, now)) == [("queue", "globex:twin")]
