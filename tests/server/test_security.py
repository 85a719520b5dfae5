"""The API guard and secrets at rest (RELIABILITY.md S5, S6, S9, S10), over real HTTP on loopback; S6, S9 and S10 on
SQLite and on PostgreSQL.

Each test starts its own control plane with the limits it tests (the harness lifts them for every other suite) and
reports one figure line. The end-to-end half of S9 (a real agent's workload sees its secret, before and after a
rotation) is tests/integration/test_secrets.py.
"""

from __future__ import annotations

import base64
import hmac
import inspect
import math
import secrets
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from gpupool.devtools.figures import figure
from gpupool.devtools.harness import Postgres, Server, start_server, stop_server
from gpupool.server import agents, auth
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Job, Org, Project, Token, User
from gpupool.server.guard import FailureWindow, TokenBuckets
from gpupool.server.keyring import Keyring, rotate_master_key
from gpupool.server.settings import Settings


def _user_token(op: httpx.Client, name: str, role: str = "member", org: str | None = None) -> str:
    body = {"name": name, "role": role, "projects": ["default"] if org is None else []}
    assert op.post("/users", json={**body, **({"org": org} if org else {})}).status_code == 201
    response = op.post("/tokens", json={"user": name, **({"org": org} if org else {})})
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


def _as(server: Server, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"{server.url}/api/v1", timeout=30, headers=headers)


# S10: every mutating request leaves exactly one audit row ----------------------------------------------------


def _mutations(server: Server) -> tuple[list[httpx.Response], int]:
    """A mix of mutating requests (successes and refusals of every kind) and reads; (mutating answers, reads)."""
    op, reads = _as(server, server.token), 0
    sent = [op.post("/users", json={"name": "audited-member", "projects": ["default"]}),
            op.post("/tokens", json={"user": "audited-member"})]
    member = sent[-1].json()["token"]
    mc, anonymous, forged = _as(server, member), _as(server, None), _as(server, "gp_0123456789_forged")
    sent += [op.post("/orgs", json={"name": "audited"}), op.post("/projects", json={"name": "p1", "org": "audited"})]
    sent += [op.post("/queues", json={"name": "audited-q", "org": "audited"}),
             op.put("/prices", json={"model": "A100", "cents_per_gpu_hour": 300})]
    job = mc.post("/jobs", json={"command": ["true"], "gpus": "8", "secret_env": {"K": "v"}})
    sent += [job, mc.post(f"/jobs/{job.json()['id']}/cancel"), mc.post("/jobs/" + "0" * 32 + "/cancel")]
    token = op.post("/tokens", json={"name": "short-lived"})
    sent += [token, op.delete(f"/tokens/{token.json()['id']}"), op.post("/join-tokens", json={})]
    sent += [mc.post("/orgs", json={"name": "nope"}),  # 403
             anonymous.post("/jobs", json={"command": ["true"]}), forged.delete("/tokens/x"),  # 401
             mc.post("/jobs", json={"command": []}), op.post("/nodes/ghost/cordon"),  # 422, 404
             op.post("/agent/register", json={"join_token": "abcdef.0123456789abcdef", "name": "n", "boot_id": "b",
                                              "cpu_milli": 1, "memory_mib": 1}),  # 401: a join token that is not
             op.post("/jobs", content=b"x" * (2 << 20), headers={"content-type": "application/json"}),  # 413
             op.patch("/jobs"), op.post("/no/such/route"), op.post("/jobs/%00/cancel"),  # 405, 404, 404 (a NUL)
             httpx.post(f"{server.url}/")]  # the dashboard's 405
    sent += [mc.post("/jobs/" + "1" * 32 + "/cancel") for _ in range(60)]  # burst 45: some 429
    for path in ("/jobs", "/orgs", "/tokens", "/queues", "/whoami", "/nodes"):
        reads += op.get(path).status_code == 200
    return sent, reads


def _audit_rows(op: httpx.Client) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = op.get("/audit", params={"limit": 7, **({"cursor": cursor} if cursor else {})})  # small pages: walk
        assert page.status_code == 200, page.text
        rows += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return rows


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_mutating_request_writes_one_audit_row_and_reads_none(launch: Any, backend: str) -> None:
    """Every mutating request with a verified identity leaves its row; those without one (refused before or by
    authentication) are sampled, at most GPUPOOL_AUDIT_SAMPLE_PER_MIN per route and minute: here only the 429s of
    one route's flood outnumber that."""
    started = time.monotonic()
    server = launch(backend, GPUPOOL_RATE_LIMIT_PER_S="1", GPUPOOL_RATE_LIMIT_BURST="45",
                    GPUPOOL_AUDIT_SAMPLE_PER_MIN="10")
    sent, reads = _mutations(server)
    statuses = Counter(r.status_code for r in sent)
    assert {200, 201, 204, 401, 403, 404, 405, 413, 422, 429} <= set(statuses), statuses
    rows = _audit_rows(_as(server, server.token))
    sampled_429 = sum(r["status"] == 429 for r in rows)
    figure(f"S10 mutating={len(sent)} audit_rows={len(rows)} ({backend}; reads={reads} not audited; "
           f"{sampled_429} of {statuses[429]} anonymous 429s sampled)")
    assert Counter(r["status"] for r in rows if r["status"] != 429) == statuses - Counter({429: statuses[429]})
    assert 1 <= sampled_429 <= 10 * (math.ceil((time.monotonic() - started) / 60) + 1)
    assert {r["request_id"] for r in rows} <= {r.headers["x-request-id"] for r in sent}
    assert len({r["id"] for r in rows}) == len(rows) and [r["id"] for r in rows] == sorted(r["id"] for r in rows)[::-1]
    by_id = {r["request_id"]: r for r in rows}
    job = sent[6]
    created = by_id[job.headers["x-request-id"]]
    assert (created["route"], created["object_id"], created["actor_name"], created["org"]) == (
        "/api/v1/jobs", job.json()["id"], "audited-member", "default")
    cancel = by_id[sent[7].headers["x-request-id"]]
    assert (cancel["route"], cancel["object_id"]) == ("/api/v1/jobs/{job_id}/cancel", job.json()["id"])
    assert by_id[sent[-61].headers["x-request-id"]]["route"] == "/"  # the dashboard answered 405
    forged = next(r for r in rows if r["route"] == "/api/v1/tokens/{token_id}" and r["status"] == 401)
    assert (forged["actor_kind"], forged["token_prefix"]) == ("anonymous", "")  # the prefix did not verify
    join = next(r for r in rows if r["route"] == "/api/v1/agent/register")
    assert (join["actor_kind"], join["actor"], join["status"]) == ("anonymous", "", 401)  # nor did the join token


def test_the_audit_api_filters_pages_and_refuses_big_pages(launch: Any) -> None:
    server = launch()
    op = _as(server, server.token)
    job_ids = [op.post("/jobs", json={"command": ["true"], "gpus": "8"}).json()["id"] for _ in range(3)]
    op.post(f"/jobs/{job_ids[0]}/cancel")
    assert op.post("/orgs", json={"name": "BAD NAME"}).status_code == 422
    assert [r["object_id"] for r in op.get("/audit", params={"route": "/api/v1/jobs"}).json()["items"]] == \
        job_ids[::-1]
    assert [r["status"] for r in op.get("/audit", params={"status": 422}).json()["items"]] == [422]
    assert len(op.get("/audit", params={"object": job_ids[0]}).json()["items"]) == 2
    assert op.get("/audit", params={"org": "default", "method": "POST"}).json()["items"]
    assert op.get("/audit", params={"since": "2999-01-01"}).json()["items"] == []
    assert op.get("/audit", params={"limit": 501}).status_code == 422
    assert op.get("/audit", params={"since": "yesterday"}).status_code == 422
    assert op.get("/audit", params={"cursor": base64.urlsafe_b64encode(b"-5").decode()}).status_code == 422
    member = _as(server, _user_token(op, "curious"))
    assert member.get("/audit").status_code == 403


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_audit_table_refuses_updates_and_deletes(launch: Any, backend: str) -> None:
    server = launch(backend)
    _as(server, server.token).post("/orgs", json={"name": "one"})
    engine = create_engine(server.database_url or f"sqlite:///{server.data_dir / 'gpupool.db'}")
    for statement in ("UPDATE audit SET status = 200", "DELETE FROM audit"):
        with engine.begin() as connection, pytest.raises(DBAPIError, match="append-only"):
            connection.execute(text(statement))
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM audit")).scalar() == 1
    engine.dispose()


def test_the_audit_row_costs_one_insert(tmp_path: Path) -> None:
    """The middleware's write of one row on a SQLite file (synchronous=FULL), timed: a figure for the report, and a
    bound (rows of concurrent requests share one such write)."""
    from gpupool.server.services.audit import write

    db = Database(f"sqlite:///{tmp_path / 'a.db'}")
    migrate(db.url)
    entry = {"request_id": "r", "actor_kind": "user", "actor": "u", "method": "POST", "route": "/api/v1/jobs",
             "status": 201, "source": "127.0.0.1"}
    start = time.perf_counter()
    for _ in range(200):
        write(db, [entry])
    mean_ms = (time.perf_counter() - start) / 200 * 1000
    print(f"audit insert: {mean_ms:.2f} ms mean over 200 (SQLite, synchronous=FULL)")
    assert mean_ms < 50


# S5: resource consumption --------------------------------------------------------------------------------------


def test_body_size_rate_limit_page_size_and_pending_cap(launch: Any) -> None:
    server = launch(GPUPOOL_RATE_LIMIT_PER_S="2", GPUPOOL_RATE_LIMIT_BURST="20",
                    GPUPOOL_MAX_PENDING_JOBS_PER_ORG="3")
    op = _as(server, server.token)
    big = b'{"command": ["true"], "name": "' + b"x" * (2 << 20) + b'"}'
    declared = op.post("/jobs", content=big, headers={"content-type": "application/json"})
    streamed = op.post("/jobs", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                       headers={"content-type": "application/json"})  # chunked: no Content-Length to check
    body_413 = declared.status_code == streamed.status_code == 413
    assert op.get("/jobs", params={"limit": 501}).status_code == 422  # page size over 500
    jobs = [op.post("/jobs", json={"command": ["true"], "gpus": "8"}) for _ in range(4)]
    refused = jobs[3].json()["detail"]
    op.post(f"/jobs/{jobs[0].json()['id']}/cancel")  # one fewer pending: room for one more
    pending_cap = [j.status_code for j in jobs] == [201, 201, 201, 429] and "'default'" in refused and \
        "max_pending_jobs_per_org = 3" in refused and \
        op.post("/jobs", json={"command": ["true"], "gpus": "8"}).status_code == 201
    answers = [op.get("/whoami") for _ in range(30)]
    limited = [a for a in answers if a.status_code == 429]
    rate_429 = bool(limited) and {a.status_code for a in answers} == {200, 429}
    retry_after = all(1 <= int(a.headers["retry-after"]) <= 2 for a in limited)
    figure(f"S5  body_413={_ok(body_413)} rate_429={_ok(rate_429)} retry_after={_ok(retry_after)} "
           f"pending_cap={_ok(pending_cap)}")
    assert body_413 and rate_429 and retry_after and pending_cap
    time.sleep(1.2)
    assert op.get("/whoami").status_code == 200  # refilled


def test_one_tokens_flood_leaves_other_tokens_alone(launch: Any) -> None:
    server = launch(GPUPOOL_RATE_LIMIT_PER_S="1", GPUPOOL_RATE_LIMIT_BURST="100")
    op = _as(server, server.token)
    calm = _as(server, _user_token(op, "calm"))
    assert 429 in {op.get("/whoami").status_code for _ in range(120)}
    assert calm.get("/whoami").status_code == 200
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # system routes are not limited


def _ok(flag: bool) -> str:
    return "ok" if flag else "FAIL"


# S6: authentication ----------------------------------------------------------------------------------------------


def _lockout(server: Server) -> tuple[bool, bool]:
    """(every kind of bad token got 401, the 11th failure within a minute locked the address out with 429)."""
    op = _as(server, server.token)
    revoked = op.post("/tokens", json={"name": "to-revoke"}).json()
    op.delete(f"/tokens/{revoked['id']}")
    prefix = server.token.split("_")[1]
    bad = ["gp_0123456789_unknown", f"gp_{prefix}_wrong-secret", "not-a-token", revoked["token"]]
    answers = [_as(server, token).get("/whoami") for token in bad]
    answers += [httpx.get(f"{server.url}/api/v1/whoami")]  # no credential at all: 401, not a failed guess
    bad_token_401 = [a.status_code for a in answers] == [401] * 5
    guesses = [_as(server, f"gp_000000000{i}_guess").get("/whoami").status_code for i in range(6)]
    locked = _as(server, "gp_9999999999_guess").get("/whoami")
    valid = op.get("/whoami")  # a valid token from the locked address is answered as always (issue 41, finding 6)
    auth_fail_429 = guesses == [401] * 6 and locked.status_code == 429 and valid.status_code == 200 and \
        50 <= int(locked.headers["retry-after"]) <= 60 and \
        httpx.get(f"{server.url}/api/v1/whoami").status_code == 401  # presenting nothing is not locked out
    return bad_token_401, auth_fail_429


def test_tokens_are_compared_in_constant_time_or_looked_up_by_hash(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """Code review as a test: the stored hash is compared with hmac.compare_digest, for API tokens and join tokens,
    and the row is found by the token's public prefix, never by the secret."""
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    migrate(db.url)
    prefix, token = auth.new_token()
    with db.session() as session:
        org = Org(name="o")
        session.add(org)
        session.flush()
        user = User(org_id=org.id, name="u", role="member", projects=[])
        session.add(user)
        session.flush()
        session.add(Token(prefix=prefix, secret_hash=auth.hash_secret(token), user_id=user.id))
    with db.session() as session:
        assert auth.resolve(session, token).user_name == "u"
        with pytest.raises(auth.HTTPException):
            auth.resolve(session, token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert calls and all(a == auth.hash_secret(token) for a, _ in calls)
    assert "compare_digest" in inspect.getsource(agents.AgentHub.register)
    assert "Token.prefix ==" in inspect.getsource(auth.resolve)


# S6 + S9: no plaintext token or secret anywhere at rest ----------------------------------------------------------


def _hits(blob: bytes, needles: list[str]) -> int:
    return sum(blob.count(needle.encode()) for needle in needles)


def _files_hits(folder: Path, needles: list[str], skip: tuple[str, ...] = ("admin.token",)) -> dict[str, int]:
    return {str(p.relative_to(folder)): n for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip and (n := _hits(p.read_bytes(), needles))}


def _pg_dump(pg: Postgres, url: str) -> bytes:
    name = url.rsplit("/", 1)[1]
    dump = subprocess.run([*pg.as_user, str(pg.bin / "pg_dump"), "-h", "127.0.0.1", "-p", str(pg.port),
                           "-U", "gpupool", name], check=True, capture_output=True)
    assert b"CREATE TABLE public.job_secrets" in dump.stdout
    return dump.stdout


def _secret_world(server: Server) -> tuple[list[str], list[str], dict[str, str]]:
    """Tokens, join tokens (and the node credential one of them bought) and secret values, all used once."""
    op = _as(server, server.token)
    member = _user_token(op, "keeper")
    spare = op.post("/tokens", json={"name": "spare"}).json()["token"]
    joins = [op.post("/join-tokens", json={}).json()["token"] for _ in range(2)]
    reg = {"join_token": joins[0], "name": "n1", "boot_id": "b", "cpu_milli": 1000, "memory_mib": 1024, "gpus": []}
    credential = httpx.post(f"{server.url}/api/v1/agent/register", json=reg).json()["credential"]
    values = {f"S{i}": secrets.token_urlsafe(24) for i in range(3)}
    mc = _as(server, member)
    # eight GPUs never fit (the node has none): a queue that lets such jobs wait keeps it pending, never run
    assert op.post("/queues", json={"name": "held", "org": "default", "hold_unsatisfiable": True}).status_code == 201
    job = mc.post("/jobs", json={"command": ["true"], "gpus": "8", "queue": "held", "secret_env": values})
    assert job.status_code == 201, job.text
    assert job.json()["secret_env"] == sorted(values)
    again = mc.post("/jobs", json={"command": ["true"], "secret_env": {"OTHER": values["S0"]}, "env": {"OTHER": "x"}})
    assert again.status_code == 422 and values["S0"] not in again.text  # the error echoes names, not values
    shown = [mc.get(f"/jobs/{job.json()['id']}"), mc.get("/jobs"), mc.get(f"/jobs/{job.json()['id']}/events"),
             op.get("/audit")]
    assert all(r.status_code == 200 and _hits(r.content, list(values.values())) == 0 for r in shown)
    tokens = [server.token, member, spare, credential]
    join_secrets = [j.split(".", 1)[1] for j in joins]
    return tokens + joins + join_secrets, [*values.values()], values


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_bad_tokens_lockout_and_no_plaintext_token_at_rest(launch: Any, backend: str,
                                                          request: pytest.FixtureRequest) -> None:
    """S6: the tokens, join tokens and node credential used here are nowhere in the database (file and live WAL, or
    pg_dump) nor in the server log; bad tokens get 401 and ten failures a minute lock the address out."""
    server = launch(backend, GPUPOOL_AUTH_FAILURES_PER_MIN="10")
    tokens, secret_values, _ = _secret_world(server)
    at_rest = _files_hits(server.data_dir, tokens + secret_values)  # the SQLite file, its WAL (live), logs
    if backend == "postgres":
        at_rest["pg_dump"] = _hits(_pg_dump(request.getfixturevalue("postgres"), str(server.database_url)),
                                   tokens + secret_values)
    else:
        assert (server.data_dir / "gpupool.db-wal").exists()
    bad_token_401, auth_fail_429 = _lockout(server)
    stop_server(server)
    at_rest |= _files_hits(server.data_dir, tokens + secret_values)  # after the WAL's checkpoint
    at_rest["server log"] = _hits(server.log_path.read_bytes(), tokens + secret_values)
    where = "db,wal" if backend == "sqlite" else "pg_dump"
    figure(f"S6  bad_token_401={_ok(bad_token_401)} auth_fail_429={_ok(auth_fail_429)} "
           f"plaintext_hits={sum(at_rest.values())} ({backend}: {where},server_log; {len(tokens)} tokens)")
    assert bad_token_401 and auth_fail_429
    assert sum(at_rest.values()) == 0, at_rest


# S9: rotation ------------------------------------------------------------------------------------------------------


def _opened(db_url: str, key_path: Path) -> dict[str, dict[str, str]]:
    """Every job's secrets, opened with the key files now on disk (a fresh keyring, as after a restart)."""
    keyring, db = Keyring(key_path), Database(db_url)
    keyring.load()
    with db.session() as session:
        return {job.id: keyring.open_job(session, job) for job in session.query(Job).all()
                if job.spec.get("secret_env")}


def _rotate(server: Server) -> str:
    command = [sys.executable, "-m", "gpupool.server", "rotate-master-key", "--data-dir", str(server.data_dir)]
    if server.database_url:
        command += ["--database-url", server.database_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_rotation_rewraps_every_data_key_while_the_control_plane_runs(launch: Any, backend: str,
                                                                      request: pytest.FixtureRequest) -> None:
    server = launch(backend)
    op = _as(server, server.token)
    _, _, values = _secret_world(server)
    assert op.post("/orgs", json={"name": "second"}).status_code == 201
    assert op.post("/projects", json={"name": "p2", "org": "second"}).status_code == 201
    assert op.post("/queues", json={"name": "q2", "org": "second", "hold_unsatisfiable": True}).status_code == 201
    other = _as(server, _user_token(op, "second-admin", "tenant-admin", org="second"))
    assert other.post("/jobs", json={"command": ["true"], "gpus": "8", "project": "p2", "queue": "q2",
                                     "secret_env": {"X": "second-org-secret"}}).status_code == 201
    key_path = server.data_dir / "master.key"
    old_key = key_path.read_bytes()
    db_url = server.database_url or f"sqlite:///{server.data_dir / 'gpupool.db'}"
    before = _opened(db_url, key_path)
    output = _rotate(server)
    assert key_path.read_bytes() != old_key and oct(key_path.stat().st_mode & 0o777) == "0o600"
    assert "data_keys=2" in output and "job_secrets=2" in output
    assert _opened(db_url, key_path) == before and values in before.values()
    assert op.post("/orgs", json={"name": "third"}).status_code == 201  # a data key the running server makes now
    assert op.post("/projects", json={"name": "p3", "org": "third"}).status_code == 201
    assert op.post("/queues", json={"name": "q3", "org": "third", "hold_unsatisfiable": True}).status_code == 201
    third = _as(server, _user_token(op, "third-admin", "tenant-admin", org="third"))
    assert third.post("/jobs", json={"command": ["true"], "gpus": "8", "project": "p3", "queue": "q3",
                                     "secret_env": {"Y": "third-org-secret"}}).status_code == 201
    second = _rotate(server)
    undecryptable = int(second.split("undecryptable=")[1].split()[0])
    plain = [*values.values(), "second-org-secret", "third-org-secret"]
    hits = _files_hits(server.data_dir, plain)  # the SQLite file and its live WAL (and the logs)
    if backend == "postgres":
        hits["pg_dump"] = _hits(_pg_dump(request.getfixturevalue("postgres"), db_url), plain)
    where = "db,wal" if backend == "sqlite" else "pg_dump"
    figure(f"S9  plaintext_hits={sum(hits.values())} ({where}) rotation_undecryptable={undecryptable} "
           f"({backend}; 3 orgs, 2 rotations with the control plane running)")
    assert undecryptable == 0 and "data_keys=3" in second and sum(hits.values()) == 0, hits
    assert {"Y": "third-org-secret"} in _opened(db_url, key_path).values()


def test_a_control_plane_refuses_a_master_key_that_is_not_its_databases(launch: Any, tmp_path: Path) -> None:
    server = launch()
    _secret_world(server)
    stop_server(server)
    key_path = server.data_dir / "master.key"
    key_path.unlink()
    key_path.write_text(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    with pytest.raises(RuntimeError, match="master key"):
        start_server(server.data_dir)
    key_path.unlink()
    with pytest.raises(RuntimeError, match="missing"):
        start_server(server.data_dir)
    assert not key_path.exists()  # not silently replaced by a fresh key


def test_rotation_in_process_counts_what_does_not_open(tmp_path: Path) -> None:
    """A data key whose wrapping was tampered with is refused (nothing changes) rather than re-wrapped."""
    from gpupool.server.db.models import OrgKey
    from gpupool.server.keyring import KeyringError

    db = Database(f"sqlite:///{tmp_path / 'k.db'}")
    migrate(db.url)
    keyring = Keyring(tmp_path / "master.key")
    with db.session() as session:
        keyring.start(session)
        org = Org(name="o")
        session.add(org)
        session.flush()
        project = Project(org_id=org.id, name="p")
        user = User(org_id=org.id, name="u", role="member", projects=[])
        session.add_all([project, user])
        session.flush()
        job = Job(seq=1, org_id=org.id, project_id=project.id, user_id=user.id, queue="q",
                  spec={"secret_env": ["A"]}, state="pending")
        session.add(job)
        session.flush()
        keyring.seal_job(session, job, {"A": "alpha"})
    report = rotate_master_key(db, tmp_path / "master.key")
    assert (report.data_keys, report.job_secrets, report.undecryptable) == (1, 1, 0)
    with db.session() as session:
        row = session.query(OrgKey).one()
        row.wrapped = row.wrapped[:-1] + bytes([row.wrapped[-1] ^ 1])
    with pytest.raises(KeyringError):
        rotate_master_key(db, tmp_path / "master.key")


# settings and the limiters' arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "field"), [
    ({"GPUPOOL_RATE_LIMIT_PER_S": "0"}, "rate_limit_per_s"), ({"GPUPOOL_RATE_LIMIT_BURST": "lots"}, "rate_limit_burst"),
    ({"GPUPOOL_AUTH_FAILURES_PER_MIN": "0"}, "auth_failures_per_min"),
    ({"GPUPOOL_MAX_PENDING_JOBS_PER_ORG": "-1"}, "max_pending_jobs_per_org"),
    ({"GPUPOOL_TRUSTED_PROXIES": "10.0.0.1,proxy.example"}, "trusted_proxies"),
    ({"GPUPOOL_CLIENT_IP_HEADER": "X-Forwarded-For: 1.2.3.4"}, "client_ip_header"),
    ({"GPUPOOL_REQUEST_BODY_TIMEOUT_S": "0"}, "request_body_timeout_s"),
    ({"GPUPOOL_AUDIT_RETENTION_DAYS": "1"}, "audit_retention_days"),
    ({"GPUPOOL_METRICS_PUBLIC": "perhaps"}, "metrics_public"),
], ids=["zero rate", "burst not a number", "no failures allowed", "negative cap", "a proxy by name",
        "a header with a value", "no time for a body", "retention under two days", "public neither true nor false"])
def test_bad_guard_settings_are_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                          field: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=f"{field} \\(GPUPOOL_{field.upper()}\\)") as refused:
        Settings.from_env()
    assert "input_value" not in str(refused.value) and "pydantic" not in str(refused.value)  # no repr reaches a user


def test_the_defaults_are_what_a_deployment_runs() -> None:
    settings = Settings()
    assert (settings.rate_limit_per_s, settings.rate_limit_burst, settings.auth_failures_per_min,
            settings.max_pending_jobs_per_org) == (50, 200, 10, 10_000)
    assert (settings.trusted_proxy_list, settings.client_ip_header, settings.audit_retention_days,
            settings.metrics_public, settings.session_ttl_s) == ([], "X-Forwarded-For", 400, False, 12 * 3600)
    assert settings.master_key_path == Path("gpupool-data") / "master.key"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("rate", "burst", "gaps", "want_waits"), [
    (1.0, 2, [0, 0, 0], [0, 0, 1.0]),
    (2.0, 1, [0, 0, 0.25, 0.25], [0, 0.5, 0.25, 0]),
    (10.0, 3, [0, 0, 0, 10, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0.1]),  # a long pause refills only up to the burst
], ids=["burst then wait a second", "half-second refill", "refill caps at burst"])
def test_token_bucket(rate: float, burst: int, gaps: list[float], want_waits: list[float]) -> None:
    clock = Clock()
    buckets = TokenBuckets(rate, burst, clock)
    waits = []
    for gap in gaps:
        clock.now += gap
        waits.append(round(buckets.take("k"), 6))
    assert waits == want_waits


def test_failure_window_blocks_at_the_limit_until_the_oldest_failure_is_a_minute_old() -> None:
    clock = Clock()
    window = FailureWindow(3, 60, clock)
    for t in (0, 10, 20):
        clock.now = t
        assert window.blocked_for("ip") == 0
        window.add("ip")
    assert window.blocked_for("ip") == 40 and window.blocked_for("other") == 0
    clock.now = 60
    assert window.blocked_for("ip") == 0


def test_the_cli_submits_secret_env_and_reads_the_audit_log(launch: Any) -> None:
    server = launch()
    env = {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token, "FROM_SHELL": "shell-secret",
           "PATH": "/usr/bin:/bin", "HOME": str(server.data_dir)}
    gp = [sys.executable, "-m", "gpupool.cli.main"]
    submitted = subprocess.run([*gp, "submit", "--gpus", "8", "--secret-env", "A=cli-secret", "--secret-env",
                                "FROM_SHELL", "--json", "--", "true"], capture_output=True, text=True, env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert '"secret_env": [\n    "A",\n    "FROM_SHELL"\n  ]' in submitted.stdout
    assert "cli-secret" not in submitted.stdout and "shell-secret" not in submitted.stdout
    missing = subprocess.run([*gp, "submit", "--secret-env", "hunter2", "--", "true"], capture_output=True, text=True,
                             env=env)
    assert missing.returncode == 2 and "hunter2" not in missing.stdout + missing.stderr
    rows = subprocess.run([*gp, "audit", "--json", "--route", "/api/v1/jobs"], capture_output=True, text=True,
                          env=env)
    assert rows.returncode == 0, rows.stderr
    assert '"status": 201' in rows.stdout and '"route": "/api/v1/jobs"' in rows.stdout
    table = subprocess.run([*gp, "audit"], capture_output=True, text=True, env={**env, "COLUMNS": "200"})
    assert table.returncode == 0 and "/api/v1/jobs" in table.stdout


@pytest.mark.parametrize(("body", "want_in_message"), [
    ({"secret_env": {"1BAD": "hidden-value"}}, "secret_env.1BAD.[key]: Value error, is not a variable name"),
    ({"secret_env": {"BIG": "hidden-value" * 2000}}, "secret_env.BIG: Value error, must be at most 16384 characters"),
    ({"secret_env": {"NUL": "hidden-value\x00"}}, "secret_env.NUL: Value error, must not contain a NUL character"),
    ({"secret_env": {"SAME": "hidden-value"}, "env": {"SAME": "x"}}, "secret_env: SAME also in env"),
    ({"secret_env": {f"V{i}": "hidden-value" * 1000 for i in range(48)}}, "env, secret_env, workdir and image: "),
], ids=["bad name", "value too long", "NUL in a value", "also in env", "too big for a launch order"])
def test_secret_env_is_validated_naming_the_variable_never_its_value(body: dict[str, Any],
                                                                   want_in_message: str) -> None:
    from gpupool.protocol.api import JobCreate

    with pytest.raises(ValidationError) as refused:
        JobCreate(command=["true"], **body)
    messages = " ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in refused.value.errors())
    assert want_in_message in messages and "hidden-value" not in messages


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_concurrent_first_secrets_of_an_organisation_share_one_data_key(launch: Any, backend: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server = launch(backend)
    op = _as(server, server.token)
    for path, body in (("/orgs", {"name": "racers"}), ("/projects", {"name": "rp", "org": "racers"}),
                       ("/queues", {"name": "rq", "org": "racers"})):
        assert op.post(path, json=body).status_code == 201
    admin = _user_token(op, "racer", "tenant-admin", org="racers")

    def submit(i: int) -> int:
        with _as(server, admin) as client:
            return client.post("/jobs", json={"command": ["true"], "gpus": "8", "project": "rp", "queue": "rq",
                                              "secret_env": {"N": f"value-{i}"}}).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(submit, range(8))) == [201] * 8
    db_url = server.database_url or f"sqlite:///{server.data_dir / 'gpupool.db'}"
    opened = _opened(db_url, server.data_dir / "master.key")
    assert sorted(v["N"] for v in opened.values()) == sorted(f"value-{i}" for i in range(8))
