"""S15 of RELIABILITY.md §3.2: no input can jam a node (issue 41: finding 4, finding 11, and finding 14's budgets).

Against a real control plane (SQLite) and a real agent process with fake GPUs on loopback:
- every string of a job that reaches a process (command, each argument, env names and values, secret_env, workdir,
  image) with a NUL, a lone surrogate, too long, or all of them together too long for a launch frame, and env names
  that are not names or that gpupool sets itself: 422 naming the field (`["body", "command", 2]`,
  `["body", "env", "FOO"]`, `["body", "env", "BAD-KEY", "[key]"]`), and never a secret value in the answer;
- a job stored before these rules (a relative workdir, as the API once took) is still placed, and its node answers
  the order "failed" naming the field: neither the scheduler nor the channel chokes on it;
- an agent that cannot launch an order (the failpoint `agent.launch`, which raises the ValueError an embedded NUL
  raised) reports that attempt failed with the reason within 5 s, on the same connection (no drop, no reconnect),
  launches it once, and the job ends `failed` with the reason in `job show` and its events; its GPUs go to the next
  job at once;
- `statement --month 9999-12` (and months outside 2000-2199, dates outside them): 422 naming the field, also through
  the CLI (its message, no traceback); budgets of `1e999` GPU-hours, NaN, negative or absurd amounts: 422 naming the
  field, and the real budget that such a one used to block is accepted.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import SCALED, Cluster

from gpupool.agent import failpoints
from gpupool.devtools.figures import Parts, figure, session_folder
from gpupool.protocol.launch import MAX_ITEM_BYTES

AGENT = "jam"
SECRET = "s3cr3t-value"
BASE: dict[str, Any] = {"command": ["true"], "gpus": "0.1", "cpus": "0.1", "memory_mib": 64}
NUL_FIELDS: dict[str, tuple[dict[str, Any], list[Any]]] = {  # field -> (what the body sets, the location named)
    "command": ({"command": ["tr\x00ue"]}, ["body", "command", 0]),
    "argument": ({"command": ["sh", "-c", "echo\x00 hi"]}, ["body", "command", 2]),
    "env key": ({"env": {"A\x00B": "1"}}, ["body", "env", "A\x00B", "[key]"]),
    "env value": ({"env": {"FOO": "a\x00b"}}, ["body", "env", "FOO"]),
    "secret_env": ({"secret_env": {"TOKEN": SECRET + "\x00"}}, ["body", "secret_env", "TOKEN"]),
    "workdir": ({"workdir": "/tmp/\x00x"}, ["body", "workdir"]),
    "image": ({"image": "alpine\x00:3"}, ["body", "image"]),
}
BAD_KEYS = ["1X", "A-B", "", "A B", "\u00e9t\u00e9", "X" * 257, "GPUPOOL_JOB_ID", "GPUPOOL_ANYTHING",
            "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY"]
TOO_LONG: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "argument": ({"command": ["echo", "x" * (MAX_ITEM_BYTES + 1)]}, ["body", "command", 1]),
    "multibyte argument": ({"command": ["echo", "\u00e9" * (MAX_ITEM_BYTES // 2 + 1)]}, ["body", "command", 1]),
    "env value": ({"env": {"BIG": "x" * (MAX_ITEM_BYTES + 1)}}, ["body", "env", "BIG"]),
    "workdir": ({"workdir": "/" + "d" * 1100}, ["body", "workdir"]),
    "together": ({"command": ["echo", *["x" * 60_000] * 9]}, ["body"]),
}
BAD_WORKDIRS = ["relative/dir", "/a/../b", "/a/./b", "/a//b", "/a/", "//a"]
BAD_MONTHS = ["9999-12", "1999-12", "2200-01", "2026-13", "2026-00", "2026-1", "20261", "abcd-ef"]
BAD_BUDGETS = ['"gpu_hours": 1e999', '"gpu_hours": -1e999', '"gpu_hours": NaN', '"gpu_hours": Infinity',
               '"gpu_hours": -1', '"gpu_hours": 0', '"gpu_hours": 1e12', '"cents": 100000000000000000000',
               '"cents": 2147483648', '"cents": 0']


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane and one agent with two fake GPUs whose first launch fails (failpoint `agent.launch`)."""
    with Cluster(tmp_path_factory.mktemp("s15"), env=dict(SCALED)) as made:
        with pytest.MonkeyPatch.context() as patch:  # the agent process inherits it
            patch.setenv(failpoints.ENV, "agent.launch=error@1")
            made.start_agent(AGENT)
        made.wait_ready([AGENT])
        yield made
    assert made.violations == []


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Parts:
    return Parts(session_folder(tmp_path_factory.getbasetemp(), worker_id, "s15"), ["api", "agent", "billing"])


def _report(found: dict[str, dict[str, Any]] | None) -> None:
    if found is None:
        return
    api, agent, billing = found["api"], found["agent"], found["billing"]
    figure(f"S15 nul_fields_422={api['nul']} bad_keys_422={api['keys']} too_long_422={api['long']} "
           f"bad_workdirs_422={api['workdirs']} launch_failure_reported_s={agent['reported_s']:.2f} "
           f"channel_drops={agent['drops']} relaunches={agent['relaunches']} month_422={billing['month']} "
           f"budget_inf_422={billing['budget']}")


def _post_job(cluster: Cluster, body: dict[str, Any] | str) -> tuple[int, Any, str]:
    """(status, detail, raw text) of POST /jobs with `body` (a dict over BASE, or raw JSON text)."""
    content = body if isinstance(body, str) else json.dumps({**BASE, **body})
    response = cluster.api.post("/jobs", content=content, headers={"Content-Type": "application/json"})
    detail = response.json().get("detail") if "json" in response.headers.get("content-type", "") else None
    return response.status_code, detail, response.text


def _names(cluster: Cluster, body: dict[str, Any] | str, loc: list[Any]) -> str | None:
    """None when `body` answers 422 naming exactly `loc` (and never echoes the secret); else what happened."""
    status, detail, text = _post_job(cluster, body)
    locs = [d.get("loc") for d in detail] if isinstance(detail, list) else detail
    if status != 422 or locs != [loc] or SECRET in text:
        return f"{status} {locs}"
    return None


def test_every_string_that_reaches_a_process_is_checked_at_the_api(cluster: Cluster, parts: Parts) -> None:
    problems = {f"NUL in {field}": _names(cluster, body, loc) for field, (body, loc) in NUL_FIELDS.items()}
    nul_ok = sum(p is None for p in problems.values())
    for where in ("env", "secret_env"):
        problems |= {f"{where} key {key!r}": _names(cluster, {where: {key: "1"}}, ["body", where, key, "[key]"])
                     for key in BAD_KEYS}
    keys_ok = sum(p is None for k, p in problems.items() if " key " in k)
    problems |= {f"too long {field}": _names(cluster, body, loc) for field, (body, loc) in TOO_LONG.items()}
    long_ok = sum(p is None for k, p in problems.items() if k.startswith("too long"))
    problems |= {f"workdir {w!r}": _names(cluster, {"workdir": w}, ["body", "workdir"]) for w in BAD_WORKDIRS}
    workdirs_ok = sum(p is None for k, p in problems.items() if k.startswith("workdir"))
    surrogate = json.dumps(BASE).replace('["true"]', '["\\ud800"]')
    problems["lone surrogate"] = _names(cluster, surrogate, ["body", "command", 0])
    good = {"command": ["sh", "-c", "echo h\u00e9llo \u2713\nexit 0"], "workdir": "/tmp",
            "env": {"PATH": "/usr/bin:/bin", "lower_case": "x", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
            "secret_env": {"TOKEN": SECRET}}
    held = cluster.api.post("/queues", json={"name": "ondemand", "hold_unsatisfiable": True})
    assert held.status_code == 201, held.text
    response = cluster.api.post("/jobs", json={**BASE, **good, "gpus": "8", "queue": "ondemand"})  # never launched:
    # more than the node has, held by a queue that lets such jobs wait
    problems["a good job"] = None if response.status_code == 201 else f"{response.status_code} {response.text[:300]}"
    if response.status_code == 201:
        cluster.api.post(f"/jobs/{response.json()['id']}/cancel")
    _report(parts.add("api", nul=f"{nul_ok}/{len(NUL_FIELDS)}", keys=f"{keys_ok}/{2 * len(BAD_KEYS)}",
                      long=f"{long_ok}/{len(TOO_LONG)}", workdirs=f"{workdirs_ok}/{len(BAD_WORKDIRS)}"))
    assert {k: p for k, p in problems.items() if p is not None} == {}


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def _losses(log: str) -> int:
    """Connections the agent lost or left (it logs each one before reconnecting)."""
    return sum(1 for line in log.splitlines() if "channel to" in line and " lost:" in line)


def test_an_agent_that_cannot_launch_reports_failed_and_keeps_its_channel(cluster: Cluster, parts: Parts) -> None:
    agent = cluster.agents[AGENT]
    lost_before = _losses(agent.log())
    failing = cluster.submit(command=["true"], gpus="2")  # both GPUs of the node
    job = cluster.wait_job(failing, timeout_s=30)
    events = cluster.events(failing)
    kinds = [e["kind"] for e in events]
    assert job["state"] == "failed", (job, events, agent.log()[-3000:])
    scheduled = next(e for e in events if e["kind"] == "scheduled")
    failed = next(e for e in events if e["kind"] == "failed")
    reported_s = _at(failed) - _at(scheduled)
    assert "failpoint agent.launch" in failed["message"], events
    assert "failpoint agent.launch" in (job.get("reason") or {}).get("message", ""), job
    assert kinds.count("scheduled") == 1 and "requeued" not in kinds, kinds  # failed once, not retried
    follower = cluster.submit(command=["true"], gpus="2")  # the same GPUs, free again
    assert cluster.wait_job(follower, timeout_s=30)["state"] == "succeeded"
    allocation = job["allocations"][0]
    launches = agent.log().count(f"launching ('{allocation['id']}', {allocation['attempt']})")
    drops = _losses(agent.log()) - lost_before
    _report(parts.add("agent", reported_s=reported_s, drops=drops, relaunches=launches - 1))
    assert reported_s < 5
    assert drops == 0, agent.log()[-3000:]
    assert launches == 1, agent.log()[-3000:]


def test_a_job_stored_before_the_rules_fails_naming_the_field(tmp_path: Path) -> None:
    with Cluster(tmp_path / "legacy", env=dict(SCALED)) as cluster:
        job_id = cluster.submit(command=["true"], gpus="1")  # no node yet: it waits
        with contextlib.closing(sqlite3.connect(cluster.server.data_dir / "gpupool.db")) as db, db:  # type: ignore[union-attr]
            db.execute("UPDATE jobs SET spec = json_set(spec, '$.workdir', 'data') WHERE id = ?", (job_id,))
        cluster.start_agent("legacy")
        job = cluster.wait_job(job_id, timeout_s=30)
        assert job["state"] == "failed", job
        assert "invalid launch order: workdir: must be an absolute path" in job["reason"]["message"]
        follower = cluster.submit(command=["true"], gpus="2")  # the node and its channel carry on
        assert cluster.wait_job(follower, timeout_s=30)["state"] == "succeeded"
    assert cluster.violations == []


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": cluster.url, "GPUPOOL_TOKEN": cluster.server.token}  # type: ignore[union-attr]
    return subprocess.run([sys.executable, "-m", "gpupool.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_months_dates_and_budgets_are_bounded(cluster: Cluster, parts: Parts) -> None:
    problems = {}
    for month in BAD_MONTHS:
        response = cluster.api.get("/usage/statement", params={"project": "default", "month": month})
        if response.status_code != 422 or [d["loc"] for d in response.json()["detail"]] != [["query", "month"]]:
            problems[f"month {month}"] = f"{response.status_code} {response.text[:200]}"
    ok = cluster.api.get("/usage/statement", params={"project": "default", "month": "2026-01"})
    problems["month 2026-01"] = None if ok.status_code == 200 else f"{ok.status_code} {ok.text[:200]}"
    for name, value in (("to", "0001-01-05"), ("from", "9999-12-31"), ("to", "2200-01-01"), ("from", "yesterday")):
        for route in ("/usage", "/cluster/samples"):
            response = cluster.api.get(route, params={name: value})
            if response.status_code != 422 or name not in response.text:
                problems[f"{route} {name}={value}"] = f"{response.status_code} {response.text[:200]}"
    cli = _cli(cluster, "statement", "--project", "default", "--month", "9999-12")
    if cli.returncode != 1 or "month" not in cli.stderr + cli.stdout or "Traceback" in cli.stderr + cli.stdout:
        problems["cli statement"] = f"{cli.returncode} {cli.stdout[-300:]} {cli.stderr[-300:]}"
    month_ok = not any(problems.values())
    for amount in BAD_BUDGETS:
        response = cluster.api.post("/budgets", content=f'{{"scope": "project", "name": "default", {amount}}}',
                                    headers={"Content-Type": "application/json"})
        field = amount.split('"')[1]
        if response.status_code != 422 or [d["loc"] for d in response.json()["detail"]] != [["body", field]]:
            problems[f"budget {amount}"] = f"{response.status_code} {response.text[:200]}"
    for hours, code, named in (("inf", 2, "--gpu-hours"), ("nan", 2, "--gpu-hours"), ("1e12", 1, "gpu_hours")):
        cli = _cli(cluster, "budget", "create", "--scope", "project", "--name", "default", "--gpu-hours", hours)
        said = cli.stderr + cli.stdout
        if cli.returncode != code or named not in said or "Traceback" in said:
            problems[f"cli budget {hours}"] = f"{cli.returncode} {said[-400:]}"
    real = cluster.api.post("/budgets", json={"scope": "project", "name": "default", "gpu_hours": 100})
    problems["a real budget"] = None if real.status_code == 201 else f"{real.status_code} {real.text[:200]}"
    budget_ok = not any(v for k, v in problems.items() if "budget" in k)
    _report(parts.add("billing", month="ok" if month_ok else "FAIL", budget="ok" if budget_ok else "FAIL"))
    assert {k: p for k, p in problems.items() if p is not None} == {}
