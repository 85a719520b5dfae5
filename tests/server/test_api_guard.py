"""Issue 41's findings on the API guard (6, 10, 14 in part, 17, 20, 21), each performed as the attack over real HTTP
against a running control plane (SQLite; PostgreSQL where the backend matters: the audit table's retention).

Each test leaves its numbers as one part of the S16 figure line (tests/conftest.py `s16`); the dashboard's half of
finding 21 (a session token is refused after "Log out" in Chromium) is tests/dashboard/test_dashboard_guard.py.
"""

from __future__ import annotations

import math
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.exc import DBAPIError

from gpupool.devtools.harness import Server, wait_for


def _as(server: Server, token: str | None, scheme: str = "Bearer", headers: dict[str, str] | None = None,
        **options: Any) -> httpx.Client:
    auth = {"Authorization": f"{scheme} {token}"} if token else {}
    return httpx.Client(base_url=f"{server.url}/api/v1", timeout=30, headers={**auth, **(headers or {})}, **options)


def _from(server: Server, token: str | None, local_address: str) -> httpx.Client:
    """A client whose connections leave from `local_address` (any 127.0.0.0/8 address is this machine's)."""
    return _as(server, token, transport=httpx.HTTPTransport(local_address=local_address))


def _audit_rows(op: httpx.Client, **filters: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = op.get("/audit", params={"limit": 500, **filters, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        rows += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return rows


def _guesses(client: httpx.Client, count: int, headers: dict[str, str] | None = None) -> list[int]:
    """`count` requests with made-up tokens (each a failed authentication); their statuses."""
    return [client.get("/whoami", headers={"Authorization": f"Bearer gp_{i:010d}_guess", **(headers or {})})
            .status_code for i in range(count)]


# finding 6: failed-authentication limits per client, never against a valid token --------------------------------


def test_ten_bad_tokens_from_an_address_do_not_lock_out_a_valid_token(launch: Any, s16: Any) -> None:
    server = launch(GPUPOOL_AUTH_FAILURES_PER_MIN="10")
    op = _as(server, server.token)
    anonymous = _as(server, None)
    locked = _guesses(anonymous, 11)
    valid = [op.get("/whoami").status_code for _ in range(3)]
    with s16.part("lockout") as numbers:
        numbers["lockout_blocks_valid_token"] = sum(status != 200 for status in valid)
        assert locked == [401] * 10 + [429], locked  # the lockout itself still holds for guesses
        assert valid == [200] * 3, valid
        assert _guesses(anonymous, 1) == [429]
        assert anonymous.get("/whoami").status_code == 401  # presenting nothing is no failed guess


def test_failures_are_counted_per_client_behind_a_trusted_proxy_only(launch: Any) -> None:
    """Through a trusted proxy (127.0.0.1 here) each forwarded client has its own failure window, the client being
    the right-most address the proxies did not add themselves; another peer's header is ignored."""
    server = launch(GPUPOOL_AUTH_FAILURES_PER_MIN="3", GPUPOOL_TRUSTED_PROXIES="127.0.0.1,10.9.0.0/16")
    proxy = _from(server, None, "127.0.0.1")
    first = _guesses(proxy, 4, {"X-Forwarded-For": "198.51.100.7"})
    spoofed = _guesses(proxy, 1, {"X-Forwarded-For": "203.0.113.1, 198.51.100.7, 10.9.3.4"})
    second = _guesses(proxy, 1, {"X-Forwarded-For": "198.51.100.8"})
    assert (first, spoofed, second) == ([401, 401, 401, 429], [429], [401])
    stranger = _from(server, None, "127.0.0.2")  # not a trusted proxy: its header says nothing
    assert _guesses(stranger, 4, {"X-Forwarded-For": "198.51.100.9"}) == [401, 401, 401, 429]
    assert _guesses(stranger, 1, {"X-Forwarded-For": "198.51.100.10"}) == [429]
    op = _as(server, server.token, headers={"X-Forwarded-For": "198.51.100.11"})
    assert op.post("/orgs", json={"name": "proxied"}).status_code == 201
    assert [r["source"] for r in _audit_rows(op, route="/api/v1/orgs")] == ["198.51.100.11"]


def test_a_client_address_header_is_ignored_without_trusted_proxies(launch: Any) -> None:
    server = launch(GPUPOOL_AUTH_FAILURES_PER_MIN="3")
    anonymous = _as(server, None)
    rotated = [_guesses(anonymous, 1, {"X-Forwarded-For": f"198.51.100.{i}"})[0] for i in range(4)]
    assert rotated == [401, 401, 401, 429]


def test_a_custom_client_address_header(launch: Any) -> None:
    server = launch(GPUPOOL_AUTH_FAILURES_PER_MIN="2", GPUPOOL_TRUSTED_PROXIES="127.0.0.1",
                    GPUPOOL_CLIENT_IP_HEADER="X-Real-IP")
    proxy = _as(server, None)
    assert _guesses(proxy, 3, {"X-Real-IP": "198.51.100.1", "X-Forwarded-For": "198.51.100.2"}) == [401, 401, 429]
    assert _guesses(proxy, 1, {"X-Real-IP": "198.51.100.1", "X-Forwarded-For": "198.51.100.9"}) == [429]
    assert _guesses(proxy, 1, {"X-Real-IP": "198.51.100.3", "X-Forwarded-For": "198.51.100.2"}) == [401]


# finding 10: one rate-limit bucket per token, whatever the scheme's case ------------------------------------------


def test_the_schemes_case_gives_a_token_no_extra_bucket(launch: Any, s16: Any) -> None:
    server = launch(GPUPOOL_RATE_LIMIT_PER_S="0.001", GPUPOOL_RATE_LIMIT_BURST="5")
    answered = {scheme: [_as(server, server.token, scheme).get("/whoami").status_code for _ in range(5)]
                for scheme in ("Bearer", "bearer", "BEARER", "bEaReR", "Bearer ")}
    with s16.part("scheme") as numbers:
        numbers["scheme_buckets"] = sum(200 in statuses for statuses in answered.values())
        assert answered["Bearer"] == [200] * 5, answered
        assert numbers["scheme_buckets"] == 1, answered


# finding 14 (part): slow bodies and idle connections ----------------------------------------------------------------


def _round_trip_s(server: Server) -> float:
    """The slowest of a few plain requests on this (possibly loaded) machine: the unit of the margins below."""
    times = []
    for _ in range(5):
        start = time.monotonic()
        httpx.get(f"{server.url}/healthz", timeout=30)
        times.append(time.monotonic() - start)
    return max(times)


def _trickle(server: Server, give_up_s: float) -> tuple[float, bytes]:
    """A POST that declares 1,000 body bytes and sends one every 0.2 s: (seconds until the server answered or
    closed, what it answered); give_up_s when it did neither."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + server.token.encode() + b"\r\nContent-Length: 1000\r\n\r\n{")
        start = time.monotonic()
        sock.settimeout(0.2)
        while time.monotonic() - start < give_up_s:
            try:
                answer = sock.recv(4096)
                return time.monotonic() - start, answer
            except TimeoutError:
                pass
            try:
                sock.sendall(b" ")
            except OSError:  # closed under us
                return time.monotonic() - start, b""
    return give_up_s, b""


def _idle_close_s(server: Server, request: bytes, give_up_s: float) -> float:
    """Seconds until the server closes a connection that sent `request` (maybe nothing) and then stays quiet."""
    start = time.monotonic()  # before the server can start its clock
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        sock.settimeout(give_up_s)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return give_up_s
        return time.monotonic() - start


def test_a_slow_body_and_idle_connections_are_cut_off(launch: Any, s16: Any) -> None:
    timeout_s, idle_s = 2.0, 2
    server = launch(GPUPOOL_REQUEST_BODY_TIMEOUT_S=str(timeout_s), GPUPOOL_KEEP_ALIVE_TIMEOUT_S=str(idle_s))
    margin = 2 + 20 * _round_trip_s(server)
    early = 0.01  # asyncio's timers may fire up to the loop's clock resolution before their deadline
    cut_s, answer = _trickle(server, timeout_s + margin + 10)
    fresh = _idle_close_s(server, b"", idle_s + margin + 10)
    slow_head = _idle_close_s(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", idle_s + margin + 10)
    kept = _idle_close_s(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", idle_s + margin + 10)
    with s16.part("slow") as numbers:
        numbers["slow_body_cut_s"] = round(cut_s, 1)
        assert timeout_s - early <= cut_s <= timeout_s + margin, (cut_s, answer)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert idle_s - early <= fresh <= idle_s + margin and idle_s - early <= slow_head <= idle_s + margin, \
            (fresh, slow_head)
        assert idle_s - early <= kept <= idle_s + margin, kept
    assert _as(server, server.token).get("/whoami").status_code == 200


# finding 17: the audit log ------------------------------------------------------------------------------------------


def _metric(body: str, name: str, **labels: str) -> float:
    """The value of one sample of `name` with exactly these labels in a Prometheus text page (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in body.splitlines():
        sample, _, value = line.rpartition(" ")
        metric, _, rest = sample.partition("{")
        if metric == name and ",".join(sorted(rest.rstrip("}").split(","))) == wanted:
            return float(value)
    return 0.0


def test_anonymous_floods_are_counted_and_sampled_not_written(launch: Any, s16: Any) -> None:
    per_min, flood = 10, 3000
    server = launch(GPUPOOL_AUDIT_SAMPLE_PER_MIN=str(per_min))
    op = _as(server, server.token)
    before = len(_audit_rows(op))
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=f"{server.url}/api/v1", timeout=30) as anonymous:
        statuses = list(pool.map(lambda _: anonymous.post("/jobs", json={"command": ["true"]}).status_code,
                                 range(flood)))
    minutes = math.ceil((time.monotonic() - started) / 60) + 1  # minute windows the flood may have touched
    bound = per_min * minutes
    added = len(_audit_rows(op)) - before
    counted = _metric(httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.token}"}).text,
                      "gpupool_api_unauthenticated_requests_total", route="/api/v1/jobs", status="401")
    with s16.part("audit") as numbers:
        numbers.update(audit_rows_from_anon=f"{added}/{flood}", bound=bound)
        assert statuses == [401] * flood
        assert added <= bound, added
        assert counted == flood, counted
    org = op.post("/orgs", json={"name": "still-audited"})  # authenticated: always a row
    assert org.status_code == 201 and [r["object_id"] for r in _audit_rows(op, route="/api/v1/orgs")] == [
        org.json()["id"]]


def test_audit_rows_carry_only_verified_identities_and_the_servers_request_id(launch: Any, s16: Any) -> None:
    server = launch()
    op = _as(server, server.token, headers={"X-Request-ID": "client-chosen-1"})
    created = op.post("/orgs", json={"name": "traced"})
    prefix = server.token.split("_")[1]
    forged = _as(server, f"gp_{prefix}_not-the-secret").post("/orgs", json={"name": "forged"})
    join = op.post("/agent/register", json={"join_token": "abcdef.0123456789abcdef", "name": "n", "boot_id": "b",
                                             "cpu_milli": 1, "memory_mib": 1})
    audited = _audit_rows(_as(server, server.token))
    mine = next(r for r in audited if r["route"] == "/api/v1/orgs" and r["status"] == 201)
    refused = next(r for r in audited if r["route"] == "/api/v1/orgs" and r["status"] == 401)
    register = next(r for r in audited if r["route"] == "/api/v1/agent/register")
    with s16.part("request_id") as numbers:
        numbers["client_request_id_stored_as_id"] = int(mine["request_id"] == "client-chosen-1")
        assert created.status_code == 201 and created.headers["x-request-id"] == mine["request_id"]
        assert mine["request_id"] != "client-chosen-1" and mine["client_request_id"] == "client-chosen-1"
        assert (mine["actor_kind"], mine["token_prefix"]) == ("user", prefix)
    assert forged.status_code == 401 and (refused["actor_kind"], refused["token_prefix"]) == ("anonymous", "")
    assert join.status_code == 401 and (register["actor_kind"], register["actor"]) == ("anonymous", "")


#: the audit table's columns as every schema since migration 0003 has them (a test's own view, not the model's)
AUDIT = Table("audit", MetaData(), Column("id", Integer, primary_key=True), Column("at", DateTime(timezone=True)),
              *(Column(name, String) for name in ("request_id", "actor_kind", "actor", "actor_name", "token_prefix",
                                                  "method", "route", "object_id", "source")),
              Column("status", Integer))


def _seed(engine: Any, ages_days: list[float]) -> None:
    """Audit rows made `ages_days` ago, written straight to the database (as an older control plane left them)."""
    now = datetime.now(UTC)
    with engine.begin() as connection:
        for age in ages_days:
            connection.execute(insert(AUDIT), {"at": now - timedelta(days=age), "request_id": f"seeded-{age}",
                                               "actor_kind": "user", "actor": "u", "actor_name": "u",
                                               "token_prefix": "", "method": "POST", "route": "/api/v1/seeded",
                                               "object_id": "", "status": 201, "source": ""})


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_audit_rows_are_kept_for_the_retention_and_no_longer(launch: Any, backend: str) -> None:
    server = launch(backend, GPUPOOL_AUDIT_RETENTION_DAYS="2", GPUPOOL_AUDIT_PRUNE_INTERVAL_S="0.5")
    op = _as(server, server.token)
    engine = create_engine(server.database_url or f"sqlite:///{server.data_dir / 'gpupool.db'}")
    _seed(engine, [400, 3, 1.5, 0.1])
    wait_for(lambda: {r["request_id"] for r in _audit_rows(op, route="/api/v1/seeded")} == {
        "seeded-1.5", "seeded-0.1"}, 30, "the rows past the retention to be pruned")
    for statement in ("UPDATE audit SET status = 200", "DELETE FROM audit"):  # what is kept stays as written
        with engine.begin() as connection, pytest.raises(DBAPIError, match="append-only"):
            connection.execute(text(statement))
    engine.dispose()


# finding 20: /metrics ------------------------------------------------------------------------------------------------


def test_metrics_show_no_tenant_names_without_a_scrape_token(launch: Any, s16: Any) -> None:
    server = launch()
    op = _as(server, server.token)
    assert op.post("/queues", json={"name": "hidden-queue"}).status_code == 201
    assert op.post("/jobs", json={"command": ["true"], "gpus": "1", "queue": "hidden-queue"}).status_code == 201
    wait_for(lambda: "hidden-queue" in httpx.get(f"{server.url}/metrics", headers=op.headers).text, 30,
             "the queue's gauges for an operator")
    anonymous = httpx.get(f"{server.url}/metrics")
    member = op.post("/users", json={"name": "scraper-m", "projects": ["default"]})
    member_token = op.post("/tokens", json={"user": "scraper-m"}).json()["token"]
    as_member = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {member_token}"})
    with s16.part("metrics_anon") as numbers:
        numbers["metrics_anon_org_names"] = int("hidden-queue" in anonymous.text)
        assert member.status_code == 201
        assert anonymous.status_code == 401 and numbers["metrics_anon_org_names"] == 0, anonymous.text[:300]
        assert as_member.status_code == 403 and "hidden-queue" not in as_member.text
    public = launch(GPUPOOL_METRICS_PUBLIC="true")
    assert _as(public, public.token).post("/queues", json={"name": "also-hidden"}).status_code == 201
    time.sleep(1)
    page = httpx.get(f"{public.url}/metrics")
    assert page.status_code == 200 and "gpupool_gpu_allocation_ratio" in page.text
    assert "also-hidden" not in page.text and 'queue="' not in page.text


def test_the_per_queue_gauges_are_filled_each_cycle(launch: Any, s16: Any) -> None:
    """Pending jobs per queue without any node; allocated and used GPUs per queue with agents are in
    tests/dashboard/test_dashboard_guard.py."""
    server = launch()
    op = _as(server, server.token)
    assert op.post("/queues", json={"name": "gauged"}).status_code == 201
    for _ in range(3):
        assert op.post("/jobs", json={"command": ["true"], "gpus": "1", "queue": "gauged"}).status_code == 201

    def pending() -> float:
        page = httpx.get(f"{server.url}/metrics", headers=op.headers).text
        return _metric(page, "gpupool_queue_pending_jobs", org="", queue="gauged")
    with s16.part("queue_gauges_pending") as numbers:
        numbers["pending"] = wait_for(lambda: pending() == 3 and 3, 30, "the pending gauge to show 3 jobs")
    for job in op.get("/jobs", params={"state": "pending"}).json()["items"]:
        op.post(f"/jobs/{job['id']}/cancel")
    wait_for(lambda: pending() == 0, 30, "the pending gauge to drop to 0 after the cancels")


# finding 21: headers and sessions ------------------------------------------------------------------------------------

DASHBOARD_CSP = re.compile(r"frame-ancestors 'none'")
EVERY = {"x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


def _missing(response: httpx.Response, api: bool) -> list[str]:
    """The security headers `response` lacks (or holds with another value)."""
    missing = [f"{k}: {v}" for k, v in EVERY.items() if response.headers.get(k) != v]
    if not DASHBOARD_CSP.search(response.headers.get("content-security-policy", "")):
        missing.append("content-security-policy frame-ancestors 'none'")
    if api and "no-store" not in response.headers.get("cache-control", ""):
        missing.append("cache-control: no-store")
    return missing


def test_every_dashboard_and_api_response_carries_the_security_headers(launch: Any, s16: Any) -> None:
    server = launch(GPUPOOL_RATE_LIMIT_PER_S="0.001", GPUPOOL_RATE_LIMIT_BURST="40")
    op, anonymous = _as(server, server.token), _as(server, None)
    dashboard = [httpx.get(f"{server.url}{path}") for path in (
        "/", "/index.html", "/js/app.js", "/js/api.js", "/js/pages/login.js", "/css/dashboard.css")]
    month = datetime.now(UTC).strftime("%Y-%m")
    answers = [op.get("/whoami"), op.get("/jobs"), anonymous.get("/whoami"), op.get("/jobs/" + "0" * 32),
               op.post("/orgs", json={"name": "BAD NAME"}), op.get("/usage/statement", params={
                   "project": "default", "month": month, "format": "html"}),
               op.get("/usage/statement", params={"project": "default", "month": month}),
               op.post("/jobs", content=b"x" * (2 << 20)), op.get("/no/such/route"),
               httpx.get(f"{server.url}/metrics", headers=op.headers)]
    answers += [op.get("/whoami") for _ in range(40)][-1:]  # over the burst: a 429 of the rate limit
    dashboard += [httpx.get(f"{server.url}{path}") for path in ("/openapi.json", "/docs")]  # no tenant's data
    statuses = [a.status_code for a in dashboard + answers]
    missing = {str(a.request.url): m for a, api in [(d, False) for d in dashboard] + [(a, True) for a in answers]
               if (m := _missing(a, api))}
    checks = len(dashboard) * 4 + len(answers) * 5
    with s16.part("headers") as numbers:
        numbers["headers_missing"] = f"{sum(len(m) for m in missing.values())}/{checks}"
        assert {200, 401, 404, 413, 422, 429} <= set(statuses), statuses
        assert not missing, missing
    csp = dashboard[0].headers["content-security-policy"]
    assert "script-src 'self'" in csp and "object-src 'none'" in csp


def test_a_session_token_is_refused_once_logged_out(launch: Any) -> None:
    server = launch(GPUPOOL_SESSION_TTL_S="3600")
    op = _as(server, server.token)
    opened = op.post("/sessions")
    assert opened.status_code == 201, opened.text
    session = opened.json()
    expires = datetime.fromisoformat(session["expires_at"])
    assert timedelta(minutes=59) < expires - datetime.now(UTC) <= timedelta(hours=1)
    as_session = _as(server, session["token"])
    assert as_session.get("/whoami").json()["user"] == "admin"
    assert as_session.post("/sessions").status_code == 403  # a session cannot prolong itself
    assert as_session.delete("/sessions/current").status_code == 204
    assert as_session.get("/whoami").status_code == 401
    assert op.get("/whoami").status_code == 200  # the token it was opened with stays valid
    assert op.delete("/sessions/current").status_code == 404  # an API token is not a session: revoke it by id
    second = op.post("/tokens", json={"name": "pasted"}).json()
    from_second = _as(server, second["token"]).post("/sessions").json()["token"]
    assert op.delete(f"/tokens/{second['id']}").status_code == 204  # revoking a token ends its sessions too
    assert _as(server, from_second).get("/whoami").status_code == 401
