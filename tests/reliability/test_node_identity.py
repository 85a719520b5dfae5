"""S13 (issue 41, findings 2, 8 and part of 14): a node's identity is its certificate. Each attack runs against a real
control plane over HTTP and the mTLS agent channel, with real agent processes (fake GPUs) where an agent is the
victim, and `gpupool up` and `gpupool node reset` run as the real commands.

  impostor   fresh join tokens for the name of a node whose agent runs: 409 naming `name`, nothing else said; the
             real agent is never cut off and keeps getting its orders (a job placed afterwards runs there);
  reset      `gpupool node reset NAME` on a node that ran a job and runs another: its agent is cut off (exit 3), the
             open job is requeued, and a fresh join token takes the name (same node id, the requeued job runs there);
  dup_uuid   a registration repeating a GPU UUID, or using another node's, answers 422/409 naming `gpus[i].uuid`;
  dup_index  one repeating a GPU index answers 422 naming `gpus[i].index` (a refused registration burns no token);
  cmdline    `gpupool up`: no process's command line holds a join token while its agent joins;
  channels   150 channels opened with one node's certificate: the newest replaces the older ones, 1 stays open;
  renewals   a burst of certificate renewals over one channel: one certificate, the rest `Rejected` (429).

The parts meet in one figure line, printed by whichever test (or xdist worker) finishes the last part:
`S13 impostor_registrations_refused=k/k real_agent_cut=0 reset_rejoin=ok dup_uuid_4xx=ok dup_index_4xx=ok
token_on_cmdline=0 channels_open=1/150 renewals_refused=n/m`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_cluster import Agent, Cluster, wait_for
from test_agent_channel_security import TLS, Hand, hand_node, join_token, register, registration, started_job
from websockets.asyncio.client import ClientConnection, connect

from gpupool.agent.tls import csr_for, new_key
from gpupool.devtools.figures import Parts, figure, session_folder
from gpupool.devtools.hand_tls import channel_url
from gpupool.devtools.harness import free_port

ENV = {"GPUPOOL_HEARTBEAT_S": "0.5", "GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "3600",
       "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_KILL_GRACE_S": "1", "GPUPOOL_CYCLE_INTERVAL_S": "0.1",
       "GPUPOOL_AUTH_FAILURES_PER_MIN": "1000"}
PARTS = ("impostor", "reset", "dup_uuid", "dup_index", "cmdline", "channels", "renewals")
CHANNELS = 150
RENEWALS = 10
#: what an agent logs when its channel drops (gpupool.agent.channel)
CHANNEL_LOST = "lost: "


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("s13"), env=dict(ENV)) as c:
        yield c
    assert c.violations == []


@pytest.fixture(scope="session")
def s13(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Parts:
    return Parts(session_folder(tmp_path_factory.getbasetemp(), worker_id, "s13"), PARTS)


def report(parts: Parts, name: str, **numbers: Any) -> None:
    """Leave this test's part; the last one prints the S13 line."""
    found = parts.add(name, **numbers)
    if found is None:
        return
    impostor, channels, renewals = found["impostor"], found["channels"], found["renewals"]
    figure(f"S13 impostor_registrations_refused={impostor['refused']}/{impostor['tried']} "
           f"real_agent_cut={impostor['cut']} reset_rejoin={found['reset']['result']} "
           f"dup_uuid_4xx={found['dup_uuid']['result']} dup_index_4xx={found['dup_index']['result']} "
           f"token_on_cmdline={found['cmdline']['count']} channels_open={channels['open']}/{channels['opened']} "
           f"renewals_refused={renewals['refused']}/{renewals['asked']}")


def start_real_agent(cluster: Cluster, name: str) -> Agent:
    """A real agent with one fake GPU of a model named after it (jobs target it with `gpu_models`), registered;
    `name` is a fake model name too (letters and digits)."""
    agent = cluster.start_agent(name, f"1x{name}-16GB")
    cluster.wait_ready([name])
    wait_for((agent.data_dir / "node.json").exists, 30, "the agent to save its identity")
    return agent


def run_on(cluster: Cluster, name: str, command: list[str]) -> str:
    return cluster.submit(command=command, gpus="1", gpu_models=[name])


# findings 2 and 8: a join token registers a new name only ------------------------------------------------------------


def test_a_join_token_cannot_take_the_name_of_a_running_node(cluster: Cluster, s13: Parts) -> None:
    name = f"victim{uuid.uuid4().hex[:6]}"
    agent = start_real_agent(cluster, name)
    node_id = json.loads((agent.data_dir / "node.json").read_text())["node_id"]
    lost_before = agent.log().count(CHANNEL_LOST)
    its_gpu = cluster.nodes()[name]["gpus"][0]["uuid"]
    impostors = [  # with its GPU (as the real agent would say), with none, with a CSR for a channel certificate
        {**registration(join_token(cluster), name, 0, "x"), "gpus": _gpus((0, its_gpu))},
        registration(join_token(cluster), name, 0, "x"),
        registration(join_token(cluster), name, 2, "Forged", csr_for(new_key(), name)),
    ]
    refused = 0
    for body in impostors:
        response = httpx.post(f"{cluster.url}/api/v1/agent/register", json=body, timeout=30)
        detail = response.json().get("detail", "")
        if response.status_code == 409 and str(detail).startswith("name:") and node_id not in response.text:
            refused += 1
    job_id = run_on(cluster, name, ["true"])  # the real agent still gets its orders (unless an impostor took them)
    try:
        job = cluster.wait_job(job_id, timeout_s=60) if refused == len(impostors) else cluster.job(job_id)
    finally:
        cut = agent.log().count(CHANNEL_LOST) - lost_before + (0 if agent.alive else 1)
        report(s13, "impostor", refused=refused, tried=len(impostors), cut=cut)
    assert refused == len(impostors)
    assert job["state"] == "succeeded" and job["allocations"][-1]["node"] == name, cluster.events(job_id)
    assert cut == 0 and cluster.nodes()[name]["state"] == "ready", agent.log()[-2000:]
    # a refused registration burns nothing: the impostor's token still registers a name of its own
    assert register(cluster, impostors[1]["join_token"], f"own{uuid.uuid4().hex[:6]}", 0).status_code == 200


def test_a_reset_node_that_ran_jobs_rejoins_with_a_fresh_token(cluster: Cluster, s13: Parts) -> None:
    name = f"reset{uuid.uuid4().hex[:6]}"
    agent = start_real_agent(cluster, name)
    node_id = json.loads((agent.data_dir / "node.json").read_text())["node_id"]
    assert cluster.wait_job(run_on(cluster, name, ["true"]), timeout_s=60)["state"] == "succeeded"  # history
    held = run_on(cluster, name, ["sleep", "600"])
    cluster.wait_job(held, ("running",), timeout_s=60)
    credential = json.loads((agent.data_dir / "node.json").read_text())["credential"]
    by_node = httpx.post(f"{cluster.url}/api/v1/nodes/{name}/reset", headers={"Authorization": f"Bearer {credential}"},
                         timeout=30)
    assert by_node.status_code in (401, 403), by_node.text  # a node cannot reset a node, not even itself
    result = "failed"
    try:
        done = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "node", "reset", name], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "GPUPOOL_URL": cluster.url,
                                                           "GPUPOOL_TOKEN": cluster.server.token})
        assert done.returncode == 0, done.stdout + done.stderr
        assert agent.wait(60) == 3, agent.log()[-2000:]  # cut off: its credential and certificate are revoked
        assert cluster.nodes()[name]["state"] == "reset" and cluster.nodes()[name]["gpus"] == []
        requeued = cluster.job(held)
        assert requeued["state"] == "pending" and requeued["attempt"] == 1, cluster.events(held)
        (agent.data_dir / "node.json").unlink()  # a reinstalled machine: a fresh identity under the same name
        rejoined = cluster.start_agent(name, agent.fake_gpus)
        cluster.wait_ready([name])
        wait_for((rejoined.data_dir / "node.json").exists, 30, "the agent to save its identity")
        assert json.loads((rejoined.data_dir / "node.json").read_text())["node_id"] == node_id  # history kept
        job = cluster.wait_job(held, ("running",), timeout_s=60)
        assert job["attempt"] == 2 and job["allocations"][-1]["node"] == name
        cluster.api.post(f"/jobs/{held}/cancel")
        assert cluster.wait_job(run_on(cluster, name, ["true"]), timeout_s=60)["state"] == "succeeded"
        result = "ok"
    finally:
        report(s13, "reset", result=result)


def test_a_reset_node_may_rejoin_with_fewer_gpus_and_its_gpus_may_move(cluster: Cluster) -> None:
    rejoin_with_fewer_gpus(cluster)


def test_reset_rejoin_and_racing_registrations_on_postgresql(postgres: Any, tmp_path: Path) -> None:
    url = postgres.create_database(f"s13_{uuid.uuid4().hex[:8]}")
    with Cluster(tmp_path / "pg", env=dict(ENV), database_url=url) as pg:
        rejoin_with_fewer_gpus(pg)
        racing_registrations(pg)
    assert pg.violations == []


def test_registrations_racing_for_one_name_get_one_node_and_409s(cluster: Cluster) -> None:
    racing_registrations(cluster)


def racing_registrations(cluster: Cluster, racers: int = 8) -> None:
    """Registrations with their own tokens for one new name (and GPU) at once: one joins, the others get 409 naming
    `name` or the GPU's `gpus[0].uuid` (SQLite may instead answer 503 to one that waited out the write lock); never
    a 500."""
    name = f"race-{uuid.uuid4().hex[:6]}"
    bodies = [registration(join_token(cluster), name, 1, "Hand") for _ in range(racers)]

    async def race() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{cluster.url}/api/v1/agent/register", json=body)
                                          for body in bodies))

    answers = asyncio.run(race())
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) == 1 and set(codes) <= {200, 409, 503}, [(r.status_code, r.text[:200]) for r in answers]
    # a racer that looked between the winner's commit and its own GPU check finds the GPU taken first: also true
    assert all(r.json()["detail"].startswith(("name:", "gpus[0].uuid:")) for r in answers if r.status_code == 409), \
        [r.text[:80] for r in answers]


def rejoin_with_fewer_gpus(cluster: Cluster) -> None:
    """The GPU rows of a reset node stay for the allocations that name them (no foreign-key 500), out of service;
    a re-join revives the indices it reports, and a GPU the node no longer has may join another node."""
    node = hand_node(cluster, gpus=2)
    hand, job_id, order = started_job(cluster, node)  # an allocation (and its GPU slots) on the node: history
    hand.close()
    assert cluster.api.post(f"/nodes/{node.name}/reset").status_code == 200
    assert cluster.job(job_id)["state"] == "pending"  # requeued
    cluster.api.post(f"/jobs/{job_id}/cancel")
    body = {**registration(join_token(cluster), node.name, 0, "Hand"), "gpus": _gpus((0, node.gpus[0]))}
    rejoined = httpx.post(f"{cluster.url}/api/v1/agent/register", json=body, timeout=30)
    assert rejoined.status_code == 200 and rejoined.json()["node_id"] == node.node_id, rejoined.text
    assert [g["uuid"] for g in cluster.nodes()[node.name]["gpus"]] == [node.gpus[0]]
    moved = {**registration(join_token(cluster), f"moved-{uuid.uuid4().hex[:6]}", 0, "Hand"),
             "gpus": _gpus((0, node.gpus[1]))}
    assert httpx.post(f"{cluster.url}/api/v1/agent/register", json=moved, timeout=30).status_code == 200


# finding 8: GPU UUIDs unique across nodes, indices within a node -----------------------------------------------------


def _gpus(*pairs: tuple[int, str]) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": u, "model": "Hand", "memory_mib": 16_384, "fake": True} for i, u in pairs]


def _refusal(cluster: Cluster, token: str, gpus: list[dict[str, Any]]) -> tuple[int, str]:
    body = {**registration(token, f"dup-{uuid.uuid4().hex[:6]}", 0, "Hand"), "gpus": gpus}
    response = httpx.post(f"{cluster.url}/api/v1/agent/register", json=body, timeout=30)
    return response.status_code, response.text


def test_a_gpu_uuid_of_another_node_or_repeated_is_refused_naming_it(cluster: Cluster, s13: Parts) -> None:
    other = hand_node(cluster, gpus=2)
    token, fresh = join_token(cluster), f"GPU-{uuid.uuid4()}"
    cases = {"repeated": (_gpus((0, fresh), (1, fresh)), (422,), "gpus[1].uuid"),
             "another node's": (_gpus((0, fresh), (1, other.gpus[1])), (409,), "gpus[1].uuid")}
    answers = {case: _refusal(cluster, token, gpus) for case, (gpus, _, _) in cases.items()}
    ok = all(answers[c][0] in codes and field in answers[c][1] for c, (_, codes, field) in cases.items())
    report(s13, "dup_uuid", result="ok" if ok else f"failed:{[a[0] for a in answers.values()]}")
    assert ok, answers
    assert other.node_id not in answers["another node's"][1]
    assert _refusal(cluster, token, _gpus((0, fresh)))[0] == 200  # nothing was burned


def test_a_repeated_gpu_index_is_refused_naming_it(cluster: Cluster, s13: Parts) -> None:
    token = join_token(cluster)
    status, text = _refusal(cluster, token, _gpus((0, f"GPU-{uuid.uuid4()}"), (0, f"GPU-{uuid.uuid4()}")))
    report(s13, "dup_index", result="ok" if status == 422 and "gpus[1].index" in text else f"failed:{status}")
    assert status == 422 and "gpus[1].index" in text, text
    assert _refusal(cluster, token, _gpus((0, f"GPU-{uuid.uuid4()}")))[0] == 200


# finding 2: `gpupool up` never puts the join token on a command line -------------------------------------------------


def _command_lines() -> list[str]:
    return subprocess.run(["ps", "-eo", "args", "-ww"], capture_output=True, text=True, check=True).stdout.splitlines()


def test_gpupool_up_hands_the_join_token_over_off_the_command_line(tmp_path: Path, s13: Parts) -> None:
    data, port = tmp_path / "up", free_port()
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "GPUPOOL_AGENT_PORT": "0"}
    up = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "up", "--data-dir", str(data), "--port", str(port),
                           "--fake-gpus", "1xA100-80GB"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                          start_new_session=True)
    seen: list[str] = []
    try:
        wait_for(lambda: (data / "admin.token").exists(), 60, "the control plane to start")
        headers = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}

        def joined() -> bool:
            seen.extend(_command_lines())  # taken while the agent starts, registers and runs
            with contextlib.suppress(httpx.HTTPError):
                nodes = httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes", headers=headers, timeout=5).json()
                return any(n["name"] == "local" and n["state"] == "ready" for n in nodes)
            return False

        wait_for(joined, 90, "the local agent to join", step_s=0.5)
        seen.extend(_command_lines())
        with sqlite3.connect(data / "gpupool.db") as db:
            token_ids = [row[0] for row in db.execute("SELECT id FROM join_tokens")]
        assert token_ids, "gpupool up made no join token"
        on_cmdline = sum(1 for line in set(seen) if any(token_id in line for token_id in token_ids))
        report(s13, "cmdline", count=on_cmdline)
        assert on_cmdline == 0, [line for line in set(seen) if "join-token" in line]
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(60)
    assert not (data / "agent-join.token").exists()  # the file it handed the token over by is gone


# finding 14: one channel per node, renewals rate-limited --------------------------------------------------------------


async def _open_many(url: str, credential: str, count: int) -> tuple[list[ClientConnection], float]:
    """`count` channels of one node, opened ten at a time (the handshakes a 2-core machine takes at once); and the
    seconds that took."""
    began = time.monotonic()
    context = TLS[credential]
    headers = {"Authorization": f"Bearer {credential}"}
    opened: list[ClientConnection] = []
    for first in range(0, count, 10):
        opened += await asyncio.gather(*(connect(url, ssl=context, additional_headers=headers, proxy=None,
                                                 open_timeout=60) for _ in range(first, min(count, first + 10))))
    return opened, time.monotonic() - began


async def _still_open(channels: list[ClientConnection], grace_s: float) -> list[ClientConnection]:
    """The channels not closed by the server within `grace_s`."""
    async def closed(ws: ClientConnection) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ws.wait_closed(), grace_s)
            return True
        return False

    done = await asyncio.gather(*(closed(ws) for ws in channels))
    return [ws for ws, gone in zip(channels, done, strict=True) if not gone]


def test_one_node_holds_one_channel_and_a_new_one_replaces_the_old(cluster: Cluster, s13: Parts) -> None:
    node = hand_node(cluster, gpus=0)
    url = channel_url(cluster.url)

    async def attack() -> tuple[int, set[int], bool]:
        channels, took = await _open_many(url, node.credential, CHANNELS)
        # the server closes a replaced channel when it admits the next: within as long again as opening them took
        left = await _still_open(channels, grace_s=max(5.0, 2 * took))
        codes = {ws.close_code for ws in channels if ws not in left and ws.close_code is not None}
        served = False
        if len(left) == 1:
            await left[0].send(json.dumps({"type": "hello", "boot_id": uuid.uuid4().hex, "seq": 0, "running": []}))
            served = json.loads(await asyncio.wait_for(left[0].recv(), 30)) == {"type": "ack", "seq": 0}
        await asyncio.gather(*(ws.close() for ws in channels))
        return len(left), codes, served

    still_open, codes, served = asyncio.run(attack())
    report(s13, "channels", open=still_open, opened=CHANNELS)
    assert still_open == 1 and served, (still_open, codes)
    assert codes == {4409}, codes


def test_certificate_renewals_beyond_the_bound_are_rejected(cluster: Cluster, s13: Parts) -> None:
    node = hand_node(cluster, gpus=0)
    hand = Hand(cluster.server, node.credential)
    try:
        assert hand.say("hello", running=[])["type"] == "ack"
        for _ in range(RENEWALS):
            hand.send(hand.frame("renew", csr=csr_for(new_key(), node.name)))
        deadline = time.monotonic() + 30
        while len([a for a in hand.answers if a["type"] in ("certificate", "rejected")]) < RENEWALS:
            hand._recv(deadline)  # each Renew gets one answer: its certificate, or its rejection
    finally:
        hand.close()
    certificates = [a for a in hand.answers if a["type"] == "certificate"]
    refused = [a for a in hand.answers if a["type"] == "rejected"]
    report(s13, "renewals", refused=len(refused), asked=RENEWALS)
    assert len(certificates) == 1 and len(refused) == RENEWALS - 1, hand.answers
    assert {a["code"] for a in refused} == {429} and "renewal" in refused[0]["reason"]
