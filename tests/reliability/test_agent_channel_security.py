"""S7 of RELIABILITY.md §3.2, the agent channel, against a real control plane over HTTP and WebSocket on loopback.

Nodes are either spoken for by hand (registered over HTTP with a CSR, then one WebSocket on the mTLS channel with
frames written here) or real `gpupool agent` processes with fake GPUs, reached through `Relay`: a man in the middle of
the channel that records every frame and can rewrite, delay or misdeliver the orders. mTLS keeps outsiders out of
the channel, so the relay is an insider: it holds the agent CA's key (its listener certificate) and the agents'
client certificates; the order signatures must hold even then.

Cases covered (numbers of §3.2 S7):
  3  node A's credential reporting status, logs, running work or idleness for node B's allocation: `Rejected`
     (403) for reports, no state change at all;
  4  a captured heartbeat or report replayed (same boot and seq, or from a boot the agent has left): no state
     change, and a replayed heartbeat does not keep a silent node alive;
  5  a join token used twice: 401;  6  an expired join token: 401;
  7  the agent's pins: `--cp-key-hash` of another key refuses to join; an agent whose pinned order key is not the
     control plane's refuses every order; (the CA pin `--ca-hash`: test_agent_mtls.py);
  10 a launch order tampered with on the way, delivered past its expiry, or delivered to another node: refused
     (reported "refused" with the reason), 0 workloads started;
  12 Hypothesis-generated, malformed, binary, deeply nested and oversized frames: rejected, and the control plane
     keeps serving every other agent.
Cases 1, 2, 7 (CA pin), 8 and 9 (mTLS) are in test_agent_mtls.py, which marks its parts in the same CaseBook folder.
  11 a node's credential asks the API for a job and its secrets: refused (agents have no route to secrets); a job's
     secret values travel only in the launch order to the node that runs it, never to another node.
The figure line `S7  cases=k/12 ...` is printed once per session (see CaseBook), by whichever of the two modules
marks the last part.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_cluster import Agent, Cluster, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as async_connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from gpupool.agent.tls import ChannelTls
from gpupool.devtools.figures import figure
from gpupool.devtools.hand_tls import HandTls, channel_url, open_channel
from gpupool.devtools.harness import Server, free_port
from gpupool.protocol.agent import MAX_FRAME_BYTES, Launch, Stop
from gpupool.protocol.signing import OrderSigner, OrderVerifier, key_hash
from gpupool.server.agent_ca import AgentCA

CHANNEL = "/api/v1/agent/channel"
TLS: dict[str, ssl.SSLContext] = {}  # node credential -> the client context of its certificate (hand nodes)
LAUNCH_TTL_S = 5.0
# Nodes spoken for by hand go quiet between tests: never suspect or lost here. Launch orders live LAUNCH_TTL_S.
ENV = {
    "GPUPOOL_HEARTBEAT_S": "0.5", "GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "3600",
    "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_KILL_GRACE_S": "1", "GPUPOOL_CYCLE_INTERVAL_S": "0.1",
    "GPUPOOL_LAUNCH_TTL_S": str(LAUNCH_TTL_S), "GPUPOOL_AUTH_FAILURES_PER_MIN": "1000",
}
COVERED = {1: ("mtls_no_cert",), 2: ("mtls_other_ca",), 3: ("foreign", "mtls_swapped"), 4: ("replay", "liveness"),
           5: ("join",), 6: ("join",), 7: ("pin_join", "pin_orders", "mtls_ca_pin"),
           8: ("mtls_revoked", "mtls_expired"), 9: ("mtls_renewal",),
           10: ("signed", "tampered", "expired", "misdelivered"), 11: ("secrets",), 12: ("fuzz", "oversized")}


# the figure: one line per session, whichever xdist worker finishes the last covered test --------------------------


class CaseBook:
    """Each test marks its part of a case passed or failed in a folder that every xdist worker of the session
    shares; the one that marks the last part prints the figure line, once (an O_EXCL file decides who)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        ok = False
        try:
            yield
            ok = True
        finally:
            (self.folder / f"{name}.{'pass' if ok else 'fail'}").write_text("")
            self._report()

    def _report(self) -> None:
        marks = {p.stem: p.suffix for p in self.folder.iterdir() if p.suffix in (".pass", ".fail")}
        if not all(part in marks for parts in COVERED.values() for part in parts):
            return
        try:
            os.close(os.open(self.folder / "printed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        passed = [case for case, parts in COVERED.items() if all(marks[p] == ".pass" for p in parts)]
        failed = sorted(set(COVERED) - set(passed))
        figure(f"S7  cases={len(passed)}/12 passed={_ids(passed)} failed={_ids(failed)}")


def _ids(cases: Any) -> str:
    return ",".join(str(c) for c in cases) or "none"


@pytest.fixture(scope="session")
def book(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> CaseBook:
    base = tmp_path_factory.getbasetemp()
    return CaseBook((base.parent if worker_id != "master" else base) / "s7-cases")


# the control plane and nodes spoken for by hand ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("s7"), env=dict(ENV)) as c:
        yield c
    assert c.violations == []


@dataclass
class HandNode:
    name: str
    node_id: str
    credential: str
    order_key: str
    gpus: list[str]


def join_token(cluster: Cluster, ttl_s: int = 3600) -> str:
    response = cluster.api.post("/join-tokens", json={"ttl_s": ttl_s})
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


def registration(token: str, name: str, gpus: int, model: str, csr: str = "") -> dict[str, Any]:
    return {"join_token": token, "name": name, "boot_id": "boot-0", "cpu_milli": 64_000, "memory_mib": 65_536,
            "csr": csr,
            "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory_mib": 16_384, "fake": True}
                     for i in range(gpus)]}


def register(cluster: Cluster, token: str, name: str, gpus: int = 1, model: str = "Hand",
             csr: str = "") -> httpx.Response:
    return httpx.post(f"{cluster.url}/api/v1/agent/register", json=registration(token, name, gpus, model, csr),
                      timeout=30)


def hand_node(cluster: Cluster, gpus: int = 1, model: str | None = None) -> HandNode:
    name = f"hand-{uuid.uuid4().hex[:8]}"
    tls = HandTls()
    response = register(cluster, join_token(cluster), name, gpus, model or name.replace("-", ""), tls.csr(name))
    assert response.status_code == 200, response.text
    reply = response.json()
    TLS[reply["credential"]] = tls.context(reply)
    return HandNode(name, reply["node_id"], reply["credential"], reply["order_key"],
                    [f"GPU-{name}-{i}" for i in range(gpus)])


#: the opening handshake's limit (websockets' default is 10 s): in the soak the control plane shares two cores with
#: T1's restarts and parses fuzzed frames nested 200,000 deep, and a 10 s handshake once timed out there
HANDSHAKE_S = 30


class Hand:
    """One channel connection of a node, spoken by hand: frames numbered by `seq` under `boot`, and every order
    that comes kept in `orders`."""

    def __init__(self, server: Server | None, credential: str, first_seq: int = 0) -> None:
        assert server is not None
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            open_channel(server, TLS[credential], credential, max_size=None, open_timeout=HANDSHAKE_S))
        self.boot = uuid.uuid4().hex
        self.seqs = itertools.count(first_seq)
        self.sent: list[dict[str, Any]] = []
        self.orders: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []  # every ack and rejection, in order

    def frame(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "boot_id": self.boot, "seq": next(self.seqs), **fields}

    def send(self, frame: dict[str, Any]) -> dict[str, Any]:
        self.ws.send(json.dumps(frame))
        self.sent.append(frame)
        return frame

    def _recv(self, deadline: float) -> dict[str, Any]:
        got = dict(json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))))
        (self.orders if got["type"] in ("launch", "stop") else self.answers).append(got)
        return got

    def answer(self, seq: int, timeout_s: float = 30) -> dict[str, Any]:
        """The ack or rejection of frame `seq` (orders that come first are kept)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self._recv(deadline)
            if got["type"] in ("ack", "rejected") and got["seq"] == seq:
                return got

    def say(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Send a frame and return its answer."""
        return self.answer(self.send(self.frame(kind, **fields))["seq"])

    def order(self, kind: str = "launch", timeout_s: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not any(o["type"] == kind for o in self.orders):
            self._recv(deadline)
        found = next(o for o in self.orders if o["type"] == kind)
        self.orders.remove(found)
        return found

    def quiet(self, seconds: float) -> None:
        """Take in every frame that comes within `seconds`."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError):
            while deadline - time.monotonic() > 0:
                self._recv(deadline)

    def close(self) -> None:
        self._stack.close()


def submit_to(cluster: Cluster, model: str, command: list[str] | None = None) -> str:
    return cluster.submit(command=command or ["sleep", "600"], gpus="1", gpu_models=[model])


def state(cluster: Cluster, job_id: str) -> dict[str, Any]:
    """What a report could change: the job with its allocations, its events and its log."""
    job = cluster.job(job_id)
    return {"job": job, "events": cluster.events(job_id), "log": cluster.logs(job_id)}


def started_job(cluster: Cluster, node: HandNode) -> tuple[Hand, str, dict[str, Any]]:
    """A job placed on `node` and started there by hand: frames 0 hello, 1 "started", 2 the log line "one"."""
    hand = Hand(cluster.server, node.credential)
    assert hand.say("hello", running=[])["type"] == "ack"
    job_id = submit_to(cluster, node.name.replace("-", ""))
    order = hand.order()
    grant = {"allocation_id": order["allocation_id"], "attempt": order["attempt"]}
    assert hand.say("task_status", state="started", **grant)["type"] == "ack"
    assert hand.say("log", offset=0, data="one\n", **grant)["type"] == "ack"
    wait_for(lambda: cluster.job(job_id)["state"] == "running", 30, "the job to run")
    return hand, job_id, order


# case 3: identity binding --------------------------------------------------------------------------------------------


def test_a_node_cannot_report_for_another_nodes_allocation(cluster: Cluster, book: CaseBook) -> None:
    with book.part("foreign"):
        a, b = hand_node(cluster, gpus=1), hand_node(cluster, gpus=1)
        b_hand, job_id, order = started_job(cluster, b)
        grant = {"allocation_id": order["allocation_id"], "attempt": order["attempt"]}
        before = state(cluster, job_id)
        a_hand = Hand(cluster.server, a.credential)
        assert a_hand.say("hello", running=[{**grant, "state": "running"}])["type"] == "ack"
        for kind, fields in [("task_status", {"state": "exited", "exit_code": 0}),
                             ("task_status", {"state": "fenced"}), ("task_status", {"state": "refused"}),
                             ("log", {"offset": 0, "data": "forged by node A\n"}),
                             ("log", {"offset": 4, "data": "appended by node A\n"})]:
            answer = a_hand.say(kind, **grant, **fields)
            assert answer["type"] == "rejected" and answer["code"] == 403, (kind, fields, answer)
        a_hand.say("heartbeat", idle_gpus=b.gpus, telemetry=[])  # B's GPUs reported idle by A: not B's news
        for forged in ("../../escape", "no-such-allocation"):  # ids name log files: never outside the node's own
            assert a_hand.say("log", allocation_id=forged, attempt=0, offset=0, data="x")["type"] == "rejected"
        time.sleep(1.5)  # a monitor pass or two: idleness and liveness would show by now
        after = state(cluster, job_id)
        assert after == before
        assert not (cluster.server.data_dir.parent / "escape-0.log").exists()
        assert [o for o in a_hand.orders if o["type"] == "launch"] == []  # A got no order of B's
        a_hand.close()
        b_hand.say("task_status", state="exited", exit_code=0, **grant)  # the owner can
        assert cluster.wait_job(job_id)["state"] == "succeeded"
        b_hand.close()


# case 4: replays ---------------------------------------------------------------------------------------------------


def test_replayed_reports_change_nothing(cluster: Cluster, book: CaseBook) -> None:
    with book.part("replay"):
        node = hand_node(cluster)
        hand, job_id, order = started_job(cluster, node)
        grant = {"allocation_id": order["allocation_id"], "attempt": order["attempt"]}
        assert hand.say("log", offset=4, data="two\n", **grant)["type"] == "ack"
        _, started, first_line, second_line = hand.sent
        before = state(cluster, job_id)
        assert before["log"] == "one\ntwo\n"
        # the same boot: captured frames again, and a frame with a used seq but other content (applied, the first
        # line would cut the log short)
        for replay in (first_line, started, {**second_line, "offset": 0, "data": "forged\n"}, first_line):
            assert hand.answer(hand.send(replay)["seq"])["type"] == "ack"  # acked, so an agent may drop it
        assert state(cluster, job_id) == before

        # the agent restarts (a new boot, seqs from 100 here); frames captured from the boot it left are replayed
        old = hand
        old.close()
        hand = Hand(cluster.server, node.credential, first_seq=100)
        assert hand.say("hello", running=[{**grant, "state": "running"}])["type"] == "ack"
        bogus = {"allocation_id": "bogus", "attempt": 0, "state": "running"}
        old_hello = {"type": "hello", "boot_id": old.boot, "seq": 0, "running": [bogus]}
        for replay in (first_line, started, old_hello, {**old_hello, "seq": 1000}, first_line):
            hand.send(replay)
        assert hand.say("heartbeat", telemetry=[], idle_gpus=[])["type"] == "ack"
        hand.quiet(1.0)
        assert [a for a in hand.answers if a["seq"] < 100] == []  # dropped, not even acked
        assert [o for o in hand.orders if o["type"] == "stop"] == []  # the old Hello did not reconcile
        assert state(cluster, job_id) == before
        hand.say("task_status", state="exited", exit_code=0, **grant)
        assert cluster.wait_job(job_id)["state"] == "succeeded"
        hand.close()


def test_a_replayed_heartbeat_does_not_keep_a_silent_node_alive(tmp_path: Path, book: CaseBook) -> None:
    with book.part("liveness"), Cluster(tmp_path, env={**ENV, "GPUPOOL_SUSPECT_AFTER_S": "1.5"}) as cluster:
        node = hand_node(cluster, gpus=0)
        hand = Hand(cluster.server, node.credential)
        hand.say("hello", running=[])
        beat = hand.send(hand.frame("heartbeat", telemetry=[], idle_gpus=[]))
        hand.answer(beat["seq"])
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # a captured heartbeat, again and again: not word from the node
            hand.send(beat)
            time.sleep(0.2)
        assert cluster.nodes()[node.name]["state"] == "unreachable"
        hand.say("heartbeat", telemetry=[], idle_gpus=[])
        wait_for(lambda: cluster.nodes()[node.name]["state"] == "ready", 10, "a fresh heartbeat to count")
        hand.close()


# cases 5 and 6: join tokens ----------------------------------------------------------------------------------------


def test_a_join_token_works_once_and_not_after_it_expires(cluster: Cluster, book: CaseBook) -> None:
    with book.part("join"):
        token = join_token(cluster)
        assert register(cluster, token, f"join-{uuid.uuid4().hex[:6]}").status_code == 200
        again = register(cluster, token, f"join-{uuid.uuid4().hex[:6]}")
        assert again.status_code == 401 and "already used" in again.text

        expired = join_token(cluster)
        with sqlite3.connect(cluster.server.data_dir / "gpupool.db", timeout=30) as db:
            db.execute("UPDATE join_tokens SET expires_at = '2000-01-01 00:00:00.000000' WHERE id = ?",
                       (expired.partition(".")[0],))
        late = register(cluster, expired, f"join-{uuid.uuid4().hex[:6]}")
        assert late.status_code == 401 and "expired" in late.text

        prefix = token.partition(".")[0]
        for wrong in (f"{prefix}.{'0' * 16}", "ffffff.0123456789abcdef"):
            assert register(cluster, wrong, f"join-{uuid.uuid4().hex[:6]}").status_code == 401


# cases 7 and 10: real agents behind a man in the middle --------------------------------------------------------------


@dataclass
class Relay:
    """Agents dial `url` instead of the control plane's channel; frames are forwarded both ways and recorded per
    node credential. On the way to the agents, `rewrite` may change an order, `delay_s` hold launch orders back, and
    `misdeliver` send one node's orders to another node's agent instead."""

    upstream: str
    ca_dir: Path  # the control plane's data dir: the relay is an insider with the agent CA's key
    scratch: Path
    port: int = field(default_factory=free_port)  # /readyz, pointing agents at tls_port
    tls_port: int = field(default_factory=free_port)
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    delay_s: float = 0.0
    misdeliver: dict[str, str] = field(default_factory=dict)
    down: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (credential, frame) to the agents
    up: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (credential, frame) from the agents
    _agents: dict[str, ServerConnection] = field(default_factory=dict)
    client_tls: dict[str, ssl.SSLContext] = field(default_factory=dict)  # credential -> the agent's certificate

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Relay:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        ca = AgentCA.load_or_create(self.ca_dir)
        ca.data_dir = self.scratch  # the relay's listener certificate is written there
        context = ca.server_context("127.0.0.1", "")

        async def start() -> Any:
            return (await serve(self._handle, "127.0.0.1", self.port, process_request=self._readyz),
                    await serve(self._handle, "127.0.0.1", self.tls_port, max_size=None, ssl=context))

        self._servers = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        return self

    def _readyz(self, connection: ServerConnection, request: Any) -> Any:
        return connection.respond(200, json.dumps({"status": "ok", "agent_port": self.tls_port}))

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
                await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        self.rewrite, self.delay_s, self.misdeliver = None, 0.0, {}

    async def _handle(self, agent: ServerConnection) -> None:
        header = agent.request.headers["Authorization"] if agent.request else ""
        credential = header.partition(" ")[2]
        self._agents[credential] = agent
        url = await asyncio.to_thread(channel_url, self.upstream)
        async with async_connect(url, additional_headers={"Authorization": header}, max_size=None, proxy=None,
                                 ssl=self.client_tls[credential]) as cp:
            pumps = [asyncio.create_task(self._upward(agent, cp, credential)),
                     asyncio.create_task(self._downward(cp, credential))]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()

    async def _upward(self, agent: ServerConnection, cp: Any, credential: str) -> None:
        async for message in agent:
            self.up.append((credential, json.loads(message)))
            await cp.send(message)

    async def _downward(self, cp: Any, credential: str) -> None:
        async for message in cp:
            frame = json.loads(message)
            if frame["type"] in ("launch", "stop") and self.rewrite is not None:
                frame = self.rewrite(frame)
            target = self.misdeliver.get(credential, credential) if frame["type"] == "launch" else credential
            delay = self.delay_s if frame["type"] == "launch" else 0.0
            asyncio.get_running_loop().call_later(delay, self._deliver, target, frame)

    def _deliver(self, credential: str, frame: dict[str, Any]) -> None:
        agent = self._agents.get(credential)
        if agent is not None:
            self.down.append((credential, frame))
            task = asyncio.ensure_future(agent.send(json.dumps(frame)))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a closed agent: the frame is lost

    def refusals(self, credential: str) -> list[dict[str, Any]]:
        return [f for c, f in list(self.up) if c == credential and f.get("state") == "refused"]


@dataclass
class Relayed:
    cluster: Cluster
    relay: Relay
    a: Agent
    b: Agent
    credentials: dict[str, str]  # agent name -> node credential
    node_ids: dict[str, str]
    witness: Path  # the folder workloads would leave files in

    def workloads(self, agent: Agent) -> list[str]:
        return sorted(p.name for p in (agent.data_dir / "workloads").glob("*") if p.is_dir())


def _behind(cluster: Cluster, relay: Relay, name: str) -> Agent:
    """Start `name` once against the control plane (it registers), then again through the relay."""
    agent = cluster.start_agent(name, f"1x{name.replace('-', '')}-16GB")
    cluster.wait_ready([name])
    agent.signal(signal.SIGTERM)
    agent.wait()
    path = agent.data_dir / "node.json"
    identity = json.loads(path.read_text())
    relay.client_tls[identity["credential"]] = ChannelTls(
        identity["tls_key"], identity["certificate"], identity["ca_certificate"]).context()
    path.write_text(json.dumps({**identity, "server": relay.url}))
    return cluster.start_agent(name, agent.fake_gpus, join=False, server_url=relay.url)


@pytest.fixture(scope="module")
def relayed(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relayed]:
    with Relay(cluster.url, cluster.server.data_dir, tmp_path_factory.mktemp("relay")) as relay:
        suffix = uuid.uuid4().hex[:6]
        a, b = _behind(cluster, relay, f"RelayA{suffix}"), _behind(cluster, relay, f"RelayB{suffix}")
        identities = {x.name: json.loads((x.data_dir / "node.json").read_text()) for x in (a, b)}
        world = Relayed(cluster, relay, a, b, {n: i["credential"] for n, i in identities.items()},
                        {n: i["node_id"] for n, i in identities.items()},
                        cluster.drop_box(f"witness-{suffix}"))  # jobs run as transient uids: where they may write
        wait_for(lambda: {c for c, _ in relay.up} >= set(world.credentials.values()), 30, "both agents on the relay")
        control = _run_to_the_end(world, "control")  # the relay itself changes nothing
        assert control["state"] == "succeeded" and (world.witness / "control").exists()
        yield world
        for agent in (a, b):
            agent.signal(signal.SIGTERM)
            agent.wait()


def _run_to_the_end(world: Relayed, mark: str) -> dict[str, Any]:
    job_id = submit_to(world.cluster, world.a.name.replace("-", ""), ["touch", str(world.witness / mark)])
    return world.cluster.wait_job(job_id, timeout_s=60)


def _refused_job(world: Relayed, mark: str, reporter: Agent) -> tuple[str, list[dict[str, Any]]]:
    """Submit a job for node A that would leave `mark`, wait for `reporter` to refuse its order; cancel it."""
    before = {x.name: world.workloads(x) for x in (world.a, world.b)}
    credential = world.credentials[reporter.name]
    seen = len(world.relay.refusals(credential))
    job_id = submit_to(world.cluster, world.a.name.replace("-", ""), ["touch", str(world.witness / mark)])
    refusals = wait_for(lambda: world.relay.refusals(credential)[seen:], 60, f"{reporter.name} to refuse the order")
    time.sleep(1.0)  # anything started would have shown by now
    world.cluster.api.post(f"/jobs/{job_id}/cancel")
    world.relay.reset()
    assert not (world.witness / mark).exists()
    started = {x.name: set(world.workloads(x)) - set(before[x.name]) for x in (world.a, world.b)}
    assert started == {world.a.name: set(), world.b.name: set()}  # 0 workloads started
    return job_id, refusals


def test_a_tampered_launch_order_is_refused(relayed: Relayed, book: CaseBook) -> None:
    with book.part("tampered"):
        pwned = str(relayed.witness / "tampered-pwned")
        relayed.relay.rewrite = lambda f: {**f, "command": ["touch", pwned], "env": {"LD_PRELOAD": "/tmp/x.so"}}
        job_id, refusals = _refused_job(relayed, "tampered", relayed.a)
        assert "bad signature" in refusals[0]["message"]
        assert not Path(pwned).exists()
        assert any("bad signature" in e["message"] for e in relayed.cluster.events(job_id))  # requeued for it


def test_a_launch_order_delivered_after_its_expiry_is_refused(relayed: Relayed, book: CaseBook) -> None:
    with book.part("expired"):
        relayed.relay.delay_s = LAUNCH_TTL_S + 1.0
        _, refusals = _refused_job(relayed, "expired", relayed.a)
        assert "expired order" in refusals[0]["message"]


def test_a_launch_order_delivered_to_another_node_is_refused(relayed: Relayed, book: CaseBook) -> None:
    with book.part("misdelivered"):
        a, b = relayed.credentials[relayed.a.name], relayed.credentials[relayed.b.name]
        relayed.relay.misdeliver = {a: b}
        _, refusals = _refused_job(relayed, "misdelivered", relayed.b)
        assert f"order for node {relayed.node_ids[relayed.a.name]}" in refusals[0]["message"]
        rejected = [f for c, f in list(relayed.relay.down) if c == b and f["type"] == "rejected"]
        assert rejected and rejected[-1]["code"] == 403  # B may not report on A's allocation either


def test_the_agent_refuses_a_control_plane_whose_key_is_not_pinned(cluster: Cluster, book: CaseBook) -> None:
    with book.part("pin_join"):
        real = (cluster.server.data_dir / "order-signing.pub").read_text().split()[1]
        assert real == key_hash(hand_node(cluster, gpus=0).order_key)  # what registration hands out
        other = key_hash(OrderSigner.generate().public_key)
        for name, pin, joins in ((f"pin-wrong-{uuid.uuid4().hex[:6]}", other, False),
                                 (f"pin-right-{uuid.uuid4().hex[:6]}", real, True)):
            agent = cluster.start_agent(name, "", extra=("--cp-key-hash", pin))  # stopped with the cluster
            if joins:
                cluster.wait_ready([name])
                wait_for((agent.data_dir / "node.json").exists, 30, "the agent to save its identity")
            else:
                assert agent.wait(60) == 2
                assert "refusing to join" in agent.log()
                assert not (agent.data_dir / "node.json").exists()


def test_an_agent_pinned_to_another_key_refuses_every_order(relayed: Relayed, book: CaseBook) -> None:
    """The control plane's real orders, to an agent whose node.json pins another key (as after a control plane
    was replaced by an impostor with a fresh key, seen from the impostor's side): refused, nothing runs."""
    with book.part("pin_orders"):
        cluster, agent = relayed.cluster, relayed.a
        agent.signal(signal.SIGTERM)
        agent.wait()
        path = agent.data_dir / "node.json"
        genuine = path.read_text()
        path.write_text(json.dumps({**json.loads(genuine), "order_key": OrderSigner.generate().public_key}))
        try:
            cluster.start_agent(agent.name, agent.fake_gpus, join=False, server_url=relayed.relay.url)
            _, refusals = _refused_job(relayed, "pinned", agent)
            assert "bad signature" in refusals[0]["message"]
        finally:
            agent.signal(signal.SIGTERM)
            agent.wait()
            path.write_text(genuine)
            cluster.start_agent(agent.name, agent.fake_gpus, join=False, server_url=relayed.relay.url)


def test_orders_are_signed_for_their_node(cluster: Cluster, book: CaseBook) -> None:
    """What the agents check: every order the control plane sends verifies with the key the node pinned at
    registration and names that node."""
    with book.part("signed"):
        node = hand_node(cluster)
        hand = Hand(cluster.server, node.credential)
        hand.say("hello", running=[])
        job_id = submit_to(cluster, node.name.replace("-", ""))
        launch = Launch.model_validate(hand.order())
        assert launch.node_id == node.node_id and OrderVerifier(node.order_key).verify(launch)
        assert not OrderVerifier(OrderSigner.generate().public_key).verify(launch)
        cluster.api.post(f"/jobs/{job_id}/cancel")
        stop = Stop.model_validate(hand.order("stop"))
        assert stop.node_id == node.node_id and OrderVerifier(node.order_key).verify(stop)
        hand.close()


# case 11: secrets ---------------------------------------------------------------------------------------------------


def test_a_node_gets_only_the_secrets_of_work_placed_on_it(cluster: Cluster, book: CaseBook) -> None:
    with book.part("secrets"):
        a, b = hand_node(cluster, gpus=1), hand_node(cluster, gpus=1)
        a_hand, b_hand = Hand(cluster.server, a.credential), Hand(cluster.server, b.credential)
        try:
            assert a_hand.say("hello", running=[])["type"] == "ack" and b_hand.say("hello", running=[])["type"] == "ack"
            secret = f"s7-secret-{uuid.uuid4().hex}"
            job_id = cluster.submit(command=["sleep", "600"], gpus="1", gpu_models=[b.name.replace("-", "")],
                                    secret_env={"S7_SECRET": secret})
            assert b_hand.order()["env"]["S7_SECRET"] == secret  # the node that runs it gets it, in its order
            a_hand.quiet(2.0)
            assert secret not in json.dumps(a_hand.orders + a_hand.answers)
            for node in (a, b):  # a node's credential sees no job (404), lists none, and never a secret
                api = httpx.Client(base_url=f"{cluster.url}/api/v1", timeout=30,
                                   headers={"Authorization": f"Bearer {node.credential}"})
                with api:
                    assert api.get(f"/jobs/{job_id}").status_code == 404
                    listed = api.get("/jobs")
                    assert listed.json()["items"] == [] and secret not in listed.text, listed.text
            cluster.api.post(f"/jobs/{job_id}/cancel")
        finally:
            a_hand.close()
            b_hand.close()


# case 12: malformed and oversized frames -----------------------------------------------------------------------------

FRAME_TYPES = ("hello", "heartbeat", "task_status", "log", "launch", "ack", "", "HELLO", None)
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=4), max_leaves=20)
SHAPED = st.fixed_dictionaries(
    {"type": st.sampled_from(FRAME_TYPES), "boot_id": st.text(max_size=40) | st.integers(),
     "seq": st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=5)},
    optional={"allocation_id": st.text(max_size=80), "attempt": st.integers(min_value=-(2**70), max_value=2**70),
              "state": st.sampled_from(["started", "exited", "failed", "fenced", "refused", "x"]),
              "offset": st.integers(min_value=-(2**64), max_value=2**64), "data": st.text(max_size=200),
              "running": st.lists(JSONISH, max_size=3), "telemetry": st.lists(JSONISH, max_size=3),
              "idle_gpus": st.lists(st.text(max_size=40), max_size=80), "exit_code": JSONISH, "extra": JSONISH})
FRAMES = st.one_of(
    SHAPED.map(json.dumps),
    JSONISH.map(json.dumps),
    st.text(max_size=200),
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=200_000).map(lambda n: "[" * n + "]" * n),  # nesting past any recursion limit
)


class FuzzChannel:
    """A node's channel that is re-opened whenever a frame made the control plane close it."""

    def __init__(self, server: Server, credential: str) -> None:
        self.server, self.credential = server, credential
        self.hand: Hand | None = None
        self.closed = 0
        self.probes = itertools.count(10**12)

    def send(self, payload: str | bytes) -> None:
        if self.hand is None:
            self.hand = Hand(self.server, self.credential)
        try:
            self.hand.ws.send(payload)
        except ConnectionClosed:
            self._reopen()

    def probe(self) -> None:
        """A fresh Hello (a new boot: fuzzed Hellos may have started others) must be acked: the server still reads
        this channel; or it closed it, and a new connection is served."""
        for _ in range(2):
            try:
                assert self.hand is not None
                seq = next(self.probes)
                self.hand.ws.send(json.dumps({"type": "hello", "boot_id": uuid.uuid4().hex, "seq": seq,
                                              "running": []}))
                assert self.hand.answer(seq, timeout_s=30)["type"] == "ack"
                return
            except ConnectionClosed:
                self._reopen()
        raise AssertionError("the control plane stopped serving this node's channel")

    def _reopen(self) -> None:
        """A new channel, as the agent opens one."""
        self.closed += 1
        if self.hand is not None:
            with contextlib.suppress(Exception):
                self.hand.close()
        self.hand = Hand(self.server, self.credential)


@pytest.fixture(scope="module")
def fuzzed(cluster: Cluster) -> Iterator[tuple[FuzzChannel, HandNode]]:
    node, bystander = hand_node(cluster, gpus=0), hand_node(cluster, gpus=0)
    assert cluster.server is not None
    channel = FuzzChannel(cluster.server, node.credential)
    yield channel, bystander
    if channel.hand is not None:
        channel.hand.close()


def test_fuzzed_frames_are_rejected_and_the_control_plane_keeps_serving(
        cluster: Cluster, fuzzed: tuple[FuzzChannel, HandNode], book: CaseBook) -> None:
    channel, bystander = fuzzed

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(payloads=st.lists(FRAMES, min_size=1, max_size=5))
    def frames_then_probe(payloads: list[str | bytes]) -> None:
        for payload in payloads:
            channel.send(payload)
        channel.probe()

    with book.part("fuzz"):
        frames_then_probe()
        other = Hand(cluster.server, bystander.credential)
        assert other.say("hello", running=[])["type"] == "ack"
        other.close()


def test_oversized_frames_close_only_their_channel(cluster: Cluster, fuzzed: tuple[FuzzChannel, HandNode],
                                                   book: CaseBook) -> None:
    with book.part("oversized"):
        channel, bystander = fuzzed
        other = Hand(cluster.server, bystander.credential)
        assert other.say("hello", running=[])["type"] == "ack"
        for payload in ("x" * (MAX_FRAME_BYTES + 1), json.dumps({"type": "log", "data": "y" * (4 * MAX_FRAME_BYTES)}),
                        b"\x00" * 1024, "[" * 1_000_000):
            channel.send(payload)
            channel.probe()
        assert channel.closed >= 3  # each oversized or binary frame closed its connection
        assert other.say("heartbeat", telemetry=[], idle_gpus=[])["type"] == "ack"  # the bystander never noticed
        assert httpx.get(f"{cluster.url}/healthz", timeout=10).status_code == 200
        other.close()
