"""No input makes the API answer 5xx (RELIABILITY.md §3.2 S4), and request bodies forbid unknown fields (S3).

- Schemathesis generates requests for every operation of the live `/openapi.json` (SQLite only; bounded,
  seeded, no shrinking) as the operator and checks `not_a_server_error`, `response_schema_conformance` and
  `ignored_auth` (the spec declares the bearer token on every operation that needs one); then every such
  operation is probed without a token and with a forged one. Figure line S4.
- Every write route with a body answers 422 naming an unknown field, server-owned names included, and the
  operator's read-back of the world does not change. Figure line S3, per backend.
- Hostile inputs that once made 5xx (on SQLite or on PostgreSQL) no longer do, on both backends.

The server under schemathesis runs with the rate limit and the failed-authentication lockout far out of the way:
they are S5's and S6's subject, and their 429s would answer in place of the operations under test.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.devtools.figures import Parts, figure, session_folder
from gpupool.devtools.harness import Postgres, Server, free_port, start_server, stop_server

API = "/api/v1"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
EXAMPLES, SEED = 20, 20251129
CHECKS = "not_a_server_error,response_schema_conformance,ignored_auth"
#: schemathesis failure codes (`st explain`) by what S4 reports
SERVER_ERROR, SCHEMA_VIOLATION, IGNORED_AUTH = ("ST101", "ST102"), ("ST108",), ("ST401",)
UNGUARDED = {"GPUPOOL_RATE_LIMIT_PER_S": "100000", "GPUPOOL_RATE_LIMIT_BURST": "100000",
             "GPUPOOL_AUTH_FAILURES_PER_MIN": "100000"}


def _started(request: pytest.FixtureRequest, tmp: Path, backend: str, env: dict[str, str] | None = None) -> Server:
    url = None
    if backend == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"fuzz{free_port()}")
    return start_server(tmp / "data", url, env=env)


@pytest.fixture(scope="module")
def fuzzed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server for schemathesis alone (it leaves thousands of objects behind), on SQLite."""
    server = _started(request, tmp_path_factory.mktemp("fuzz"), "sqlite", env=UNGUARDED)
    yield server
    stop_server(server)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _started(request, tmp_path_factory.mktemp(f"live-{request.param}"), request.param)
    yield server
    stop_server(server)


def _spec(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/openapi.json", timeout=30).json()


# schemathesis -------------------------------------------------------------------------------------------------


def _schemathesis(server: Server, workdir: Path, *filters: str) -> dict[str, Any]:
    """Run `schemathesis run` on the live spec; its JSON report (the exit status and output are checked)."""
    report = workdir / "schemathesis.json"
    command = [str(SCHEMATHESIS), "run", f"{server.url}/openapi.json", "--checks", CHECKS,
               "--phases", "examples,coverage,fuzzing", "--max-examples", str(EXAMPLES), "--seed", str(SEED),
               "--no-shrink", "--workers", "1", "--request-timeout", "10", "--warnings", "off",
               "-H", f"Authorization: Bearer {server.token}", "--report", "json", "--report-json-path", str(report),
               *filters]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"})
    assert report.exists(), f"schemathesis wrote no report:\n{done.stdout[-8000:]}\n{done.stderr[-2000:]}"
    out = json.loads(report.read_text())
    out["output"] = done.stdout[-8000:] + done.stderr[-2000:]
    return dict(out)


def _found(reports: list[dict[str, Any]], codes: tuple[str, ...]) -> int:
    """How many failures with one of `codes` the reports hold."""
    return sum(f.get("count", 1) for r in reports for f in r["failures"] if f.get("code") in codes)


def _auth_probes(server: Server, spec: dict[str, Any]) -> tuple[int, list[str]]:
    """Every operation that declares the bearer token, without one and with a forged one: (probes, accepted)."""
    accepted, probes = [], 0
    fill = {"{job_id}": "0" * 32, "{token_id}": "0" * 32, "{name}": "nobody"}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or not op.get("security"):
                continue
            url = server.url + path
            for placeholder, value in fill.items():
                url = url.replace(placeholder, value)
            for headers in ({}, {"Authorization": "Bearer gp_0000000000_forged"}):
                probes += 1
                response = httpx.request(method.upper(), url, headers=headers, json={}, timeout=30)
                if response.status_code != 401:
                    accepted.append(f"{method.upper()} {path} {headers or 'no token'}: {response.status_code}")
    return probes, accepted


@pytest.mark.slow
@pytest.mark.skipif(not SCHEMATHESIS.exists(), reason="schemathesis is not installed in this environment")
def test_schemathesis_finds_no_server_error(fuzzed: Server, tmp_path: Path) -> None:
    """Every operation, about 20 generated requests each plus schemathesis' coverage cases, and no 5xx.

    DELETE /tokens/{token_id} runs on its own: in the same run schemathesis would feed it the token ids it
    read from GET /tokens and revoke its own token, leaving the rest of the run unauthenticated.
    """
    spec = _spec(fuzzed)
    total = sum(1 for item in spec["paths"].values() for method in item if method != "parameters")
    revoke = ("--include-name", "DELETE /api/v1/tokens/{token_id}")  # that operation alone
    rest = _schemathesis(fuzzed, tmp_path, "--exclude-path", "/api/v1/tokens/{token_id}")
    alone = _schemathesis(fuzzed, tmp_path, *revoke)
    reports = [rest, alone]
    probes, accepted = _auth_probes(fuzzed, spec)
    tested = sum(r["operations"]["tested"] for r in reports)
    examples = sum(r["test_cases"]["generated"] for r in reports)
    ignored_auth = _found(reports, IGNORED_AUTH) + len(accepted)
    figure(f"S4  ops={tested} examples={examples} 5xx={_found(reports, SERVER_ERROR)} "
           f"schema_viol={_found(reports, SCHEMA_VIOLATION)} ignored_auth={ignored_auth} "
           f"(auth_probes={probes}; checks={CHECKS}; {EXAMPLES}/op requested, seed {SEED}, sqlite)")
    for report in reports:
        assert report["complete"] and report["failures"] == [] and report["errors"] == [], report["output"]
        assert report["operations"]["errored"] == 0 and report["operations"]["skipped"] == 0
    assert accepted == [], "operations that answer without a valid token"
    assert tested == total
    assert rest["test_cases"]["generated"] >= EXAMPLES * total
    whoami = httpx.get(f"{fuzzed.url}{API}/whoami", headers={"Authorization": f"Bearer {fuzzed.token}"})
    assert whoami.status_code == 200, "the run lost its token, so it did not test what it claims"


# unknown fields -----------------------------------------------------------------------------------------------

# A valid body per write route; (route, nested key) puts the unknown field one level down.
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST /api/v1/orgs", ""): {"name": "o1"},
    ("POST /api/v1/projects", ""): {"name": "p1"},
    ("POST /api/v1/users", ""): {"name": "u1", "role": "viewer"},
    ("POST /api/v1/tokens", ""): {"name": "t1"},
    ("POST /api/v1/join-tokens", ""): {"ttl_s": 600},
    ("POST /api/v1/queues", ""): {"name": "q1"},
    ("POST /api/v1/queues", "guaranteed"): {"name": "q1", "guaranteed": {"gpus": "1"}},
    ("PATCH /api/v1/queues/{name}", ""): {"priority": 0},
    ("PATCH /api/v1/queues/{name}", "guaranteed"): {"guaranteed": {"gpus": "1"}},
    ("PATCH /api/v1/budgets/{budget_id}", ""): {"hard": False},
    ("POST /api/v1/jobs", ""): {"command": ["true"], "gpus": "0.5"},
    ("POST /api/v1/jobs/{job_id}/approve", ""): {"note": "ok"},
    ("POST /api/v1/jobs/{job_id}/deny", ""): {"note": "no"},
    ("POST /api/v1/agent/register", ""): {"join_token": "abcdef.0123456789abcdef", "name": "n1", "boot_id": "b",
                                          "cpu_milli": 1000, "memory_mib": 1024},
    ("POST /api/v1/agent/register", "gpus"): {
        "join_token": "abcdef.0123456789abcdef", "name": "n1", "boot_id": "b", "cpu_milli": 1000, "memory_mib": 1024,
        "gpus": [{"index": 0, "uuid": "GPU-1", "model": "A100", "memory_mib": 40_960}]},
    ("PUT /api/v1/prices", ""): {"model": "A100", "cents_per_gpu_hour": 100},
    ("PUT /api/v1/resource-prices", ""): {"resource": "cpu", "cents_per_hour": 4},
    ("PUT /api/v1/orgs/{name}/ceiling", ""): {"max_priority": 0},
    ("PUT /api/v1/orgs/{name}/ceiling", "guaranteed"): {"guaranteed": {"gpus": "1"}},
    ("POST /api/v1/budgets", ""): {"scope": "project", "name": "default", "gpu_hours": 10},
    ("POST /api/v1/nodes/{name}/drain", ""): {"deadline_s": 60, "dry_run": True},
}
# Server-owned names a client might try to set (S3), and a plain typo.
UNKNOWN = ("colour", "tenant_id", "org_id", "project_id", "owner", "status", "state", "node_id", "gpu_ids", "quota",
           "price", "cost", "is_admin", "attempt", "leader_epoch", "id", "created_at")


def _body_routes(spec: dict[str, Any]) -> set[str]:
    return {f"{method.upper()} {path}" for path, item in spec["paths"].items() for method, op in item.items()
            if isinstance(op, dict) and "requestBody" in op}


def test_every_write_route_with_a_body_has_a_valid_body_in_the_table(live: Server) -> None:
    routes = _body_routes(_spec(live))
    assert routes - {route for route, _ in BODIES} == set(), "write routes without a body in BODIES"
    assert {route for route, _ in BODIES} - routes == set(), "BODIES for routes that take no body (or are gone)"


def _put(body: dict[str, Any], nested: str, key: str) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    inner = body[nested] if nested else body
    (inner[0] if isinstance(inner, list) else inner)[key] = 1
    return body


READBACK = ("/orgs", "/projects", "/users", "/tokens", "/queues", "/jobs?limit=500", "/budgets", "/prices", "/nodes")


def _world(client: httpx.Client) -> dict[str, Any]:
    """Everything the operator can read that a write could have changed (the scheduler's job reasons left out)."""
    world = {path: client.get(path).json() for path in READBACK}
    for job in world["/jobs?limit=500"]["items"]:
        job.pop("reason", None)
    return world


@pytest.fixture(scope="module")
def s3(live: Server, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> tuple[str, Parts]:
    backend = "postgres" if live.database_url else "sqlite"
    folder = session_folder(tmp_path_factory.getbasetemp(), worker_id, f"s3-{backend}")
    return backend, Parts(folder, [f"{r} {n}" for r, n in BODIES])


def _s3_figure(backend: str, found: dict[str, dict[str, Any]]) -> None:
    parts = found.values()
    figure(f"S3  write_routes={len({r for r, _ in BODIES})} bodies={len(BODIES)} server_fields={len(UNKNOWN) - 1} "
           f"rejected={sum(p['rejected'] for p in parts)}/{sum(p['sent'] for p in parts)} "
           f"readback_changed={sum(p['readback_changed'] for p in parts)} ({backend})")


@pytest.mark.parametrize(("route", "nested"), list(BODIES), ids=[f"{r} {n}".strip() for r, n in BODIES])
def test_write_routes_reject_unknown_fields_by_name(live: Server, s3: tuple[str, Parts], route: str,
                                                    nested: str) -> None:
    method, path = route.split(" ", 1)
    url = live.url + path.replace("{job_id}", "0" * 32)
    base = BODIES[(route, nested)]
    loc_prefix = ["body", nested, 0] if nested == "gpus" else ["body", nested] if nested else ["body"]
    wrong = []
    with live.client() as reader, httpx.Client(timeout=30, headers={"Authorization": f"Bearer {live.token}"}) as client:
        before = _world(reader)
        for key in UNKNOWN:
            response = client.request(method, url, json=_put(base, nested, key))
            errors = response.json().get("detail") if response.status_code == 422 else None
            if not isinstance(errors, list) or [(e["type"], e["loc"]) for e in errors] != [
                    ("extra_forbidden", [*loc_prefix, key])]:
                wrong.append(f"{key}: {response.status_code} {response.text[:300]}")
        changed = _world(reader) != before
    found = s3[1].add(f"{route} {nested}", sent=len(UNKNOWN), rejected=len(UNKNOWN) - len(wrong),
                      readback_changed=int(changed))
    if found is not None:
        _s3_figure(s3[0], found)
    assert wrong == [], "\n".join(wrong)
    assert not changed, "a refused write changed what the operator reads back"


# hostile inputs that once answered 5xx ------------------------------------------------------------------------

NUL = "\x00"
HOSTILE = [  # (id, method, path, query, JSON body or raw bytes, expected status (None: any below 500), text named)
    ("cursor past a database integer", "GET", "/jobs", {"cursor": base64.b64encode(b"9" * 20).decode()}, None,
     422, "cursor"),
    ("NUL in a job id", "GET", "/jobs/%00", None, None, None, ""),
    ("NUL in a token id", "DELETE", "/tokens/%00", None, None, None, ""),
    ("NUL in a node name", "POST", "/nodes/%00/cordon", None, None, None, ""),
    ("NUL in a node name to drain", "POST", "/nodes/%00/drain", None, {"deadline_s": 1}, None, ""),
    ("NUL in a node name to remove", "DELETE", "/nodes/%00", {"force": "true"}, None, None, ""),
    ("NUL in a job list filter", "GET", "/jobs", {"queue": NUL}, None, None, ""),
    ("NUL in a job name", "POST", "/jobs", None, {"command": ["true"], "name": f"a{NUL}b"}, None, ""),
    ("NUL in a job's queue", "POST", "/jobs", None, {"command": ["true"], "queue": NUL}, None, ""),
    ("NUL in a token name", "POST", "/tokens", None, {"name": NUL}, None, ""),
    ("NUL in a token's user", "POST", "/tokens", None, {"user": NUL}, None, ""),
    ("NUL in a project's cost centre", "POST", "/projects", None, {"name": "nul-cc", "cost_centre": NUL}, None, ""),
    ("NUL in a user's projects", "POST", "/users", None, {"name": "nul-u", "projects": [NUL]}, None, ""),
    ("NUL in a queue's parent", "POST", "/queues", None, {"name": "nul-q", "parent": NUL}, None, ""),
    ("NUL in a join token", "POST", "/agent/register", None, {
        "join_token": NUL * 10, "name": "n1", "boot_id": "b", "cpu_milli": 1, "memory_mib": 1}, None, ""),
    ("lone surrogate in a job name", "POST", "/jobs", None, b'{"command": ["true"], "name": "\\ud800"}', 422, "name"),
    ("lone surrogate in a boot id", "POST", "/agent/register", None,
     b'{"join_token": "abcdef.0123", "name": "n1", "boot_id": "\\udfff", "cpu_milli": 1, "memory_mib": 1}',
     422, "boot_id"),
    ("approval threshold not a number", "POST", "/queues", None, {"name": "q-abc", "approval_above_gpus": "abc"},
     422, "approval_above_gpus"),
    ("per-model quota not a number", "POST", "/queues", None,
     {"name": "q-pm", "guaranteed": {"per_model": {"H100": "abc"}}}, 422, "per_model"),
    ("infinite quota", "POST", "/queues", None, {"name": "q-inf", "guaranteed": {"gpus": "Infinity"}}, 422, "gpus"),
    ("NaN quota", "POST", "/queues", None, {"name": "q-nan", "limit": {"cpus": "NaN"}}, 422, "cpus"),
    ("quota too big to turn into milli-GPUs", "POST", "/queues", None,
     {"name": "q-big", "guaranteed": {"gpus": "1e999999"}}, 422, "gpus"),
]


@pytest.mark.parametrize(("method", "path", "query", "body", "status", "named"),
                         [pytest.param(*case[1:], id=case[0]) for case in HOSTILE])
def test_hostile_inputs_never_get_a_5xx(live: Server, method: str, path: str, query: dict[str, str] | None,
                                            body: dict[str, Any] | bytes | None, status: int | None,
                                            named: str) -> None:
    raw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {}
    with live.client() as client:
        response = client.request(method, path, params=query, **(raw or {"json": body}))
    assert response.status_code < 500, response.text
    if status is not None:
        assert response.status_code == status and named in response.text, response.text
    assert httpx.get(f"{live.url}/readyz", timeout=10).status_code == 200
