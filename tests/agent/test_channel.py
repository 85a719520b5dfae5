"""The channel's client side without a control plane: registration over a mock transport, frame handling,
self-fencing with an injected clock, the reconnect loop, and frame order on an in-memory connection."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from gpupool.agent.channel import Channel, ChannelConfig, node_gpu_uuids
from gpupool.agent.clock import ManualClock
from gpupool.agent.connection import CredentialRejected
from gpupool.agent.devices import FakeDiscovery
from gpupool.agent.registration import RegistrationError, endpoint, register
from gpupool.agent.runtime import ProcessRuntime
from gpupool.agent.runtime.process import DEFAULT_PATH
from gpupool.protocol.agent import Ack, Launch, Registration, RegistrationReply, Rejected, Stop
from gpupool.protocol.devices import GpuInfo, MigInstance
from gpupool.protocol.signing import OrderSigner, key_hash

NOW = 1_700_000_000.0
ENV = {"PATH": os.environ.get("PATH", DEFAULT_PATH)}
REG = Registration(join_token="abcdef.0123456789abcdef", name="n1", boot_id="b", cpu_milli=1000, memory_mib=1024)
SIGNER = OrderSigner.generate()
NODE = "node-1"
REPLY = {"node_id": "n-1", "credential": "c", "heartbeat_s": 5, "fence_s": 40, "order_key": SIGNER.public_key}


@pytest.mark.parametrize(
    ("server", "websocket", "want"),
    [
        ("http://cp:8080", False, "http://cp:8080/api/v1/agent/register"),
        ("http://cp:8080/", True, "ws://cp:8080/api/v1/agent/register"),
        ("https://cp.example/base", True, "wss://cp.example/base/api/v1/agent/register"),
        ("wss://cp", False, "https://cp/api/v1/agent/register"),
    ],
)
def test_endpoint(server, websocket, want):
    assert endpoint(server, "/api/v1/agent/register", websocket=websocket) == want


@pytest.mark.parametrize("bad", ["cp:8080", "ftp://cp", "http://"])
def test_endpoint_rejects_bad_urls(bad):
    with pytest.raises(ValueError):
        endpoint(bad, "/x")


def test_register_posts_the_registration_and_returns_the_reply():
    seen = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen["url"], seen["body"] = str(request.url), json.loads(request.content)
        return httpx.Response(200, json=REPLY)

    reply = register("http://cp:8080", REG, transport=httpx.MockTransport(answer))
    assert reply == RegistrationReply(**REPLY)
    assert seen == {"url": "http://cp:8080/api/v1/agent/register", "body": json.loads(REG.model_dump_json())}


@pytest.mark.parametrize(
    ("response", "retryable", "message"),
    [
        (httpx.Response(401, json={"detail": "join token already used or expired"}), False, "already used"),
        (httpx.Response(409, json={"detail": "node n1 is registered"}), False, "HTTP 409"),
        (httpx.Response(422, json={"detail": [{"loc": ["name"]}]}), False, "loc"),
        (httpx.Response(400, text="plain words"), False, "plain words"),
        (httpx.Response(503, text="down"), True, "HTTP 503"),
        (httpx.Response(200, json={"unexpected": 1}), False, "malformed"),
    ],
)
def test_register_errors_carry_the_server_message(response, retryable, message):
    with pytest.raises(RegistrationError, match=message) as info:
        register("http://cp", REG, transport=httpx.MockTransport(lambda request: response))
    assert info.value.retryable is retryable


@pytest.mark.parametrize(
    ("pin", "joins"),
    [
        (key_hash(SIGNER.public_key), True),
        (key_hash(SIGNER.public_key).upper().replace("SHA256:", ""), True),  # bare hex, any case
        (key_hash(OrderSigner.generate().public_key), False),  # another control plane's key
        ("sha256:00", False),
        (None, True),  # no pin: the key of the reply is pinned as it comes
    ],
    ids=["pinned", "bare-hex", "other-key", "malformed", "no-pin"],  # stable ids: xdist workers must agree
)
def test_register_checks_the_pinned_key_hash(pin, joins):
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=REPLY))
    if joins:
        assert register("http://cp", REG, transport=transport, key_pin=pin).order_key == SIGNER.public_key
    else:
        with pytest.raises(RegistrationError, match="refusing to join") as info:
            register("http://cp", REG, transport=transport, key_pin=pin)
        assert not info.value.retryable


def test_register_network_errors_are_retryable():
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(RegistrationError, match="cannot reach") as info:
        register("http://cp", REG, transport=httpx.MockTransport(fail))
    assert info.value.retryable


def test_config_validation():
    with pytest.raises(ValueError, match="fence_s"):
        ChannelConfig(server_url="http://cp", credential="c", boot_id="b", heartbeat_s=5, fence_s=5)
    with pytest.raises(ValueError):
        ChannelConfig(server_url="http://cp", credential="c", boot_id="b", tick_s=0)
    assert ChannelConfig(server_url="https://cp", credential="c", boot_id="b").url == "wss://cp/api/v1/agent/channel"


def test_node_gpu_uuids_include_mig_instances():
    mig = MigInstance(uuid="MIG-1", profile="1g.10gb", memory_mib=9856, gpu_instance_id=7)
    gpus = [GpuInfo(index=0, uuid="GPU-0", model="A100", memory_mib=81920, mig_enabled=True, mig_instances=[mig])]
    assert node_gpu_uuids(gpus) == {"GPU-0", "MIG-1"}


class Setup:
    def __init__(self, tmp_path: Path, connect=None, fence_s: float = 40.0) -> None:
        self.clock = ManualClock(0.0)
        self.runtime = ProcessRuntime(tmp_path / "workloads", base_env=ENV)
        self.discovery = FakeDiscovery("2xH100", node="n1", clock=self.clock)
        config = ChannelConfig(
            server_url="http://cp:8080",
            credential="cred",
            boot_id="b1",
            heartbeat_s=0.05,
            fence_s=fence_s,
            kill_grace_s=1.0,
            tick_s=0.01,
            backoff_base_s=0.001,
            backoff_cap_s=0.002,
            node_id=NODE,
            order_key=SIGNER.public_key,
        )
        self.channel = Channel(
            config,
            self.runtime,
            self.discovery,
            clock=self.clock,
            wall_clock=ManualClock(NOW),
            rng=random.Random(1),
            connect=connect,
        )
        self.gpu = self.discovery.list_devices()[0].uuid

    def launch_json(self, allocation="a1", script="exec sleep 30", signer=SIGNER, node=NODE) -> str:
        order = Launch(
            allocation_id=allocation,
            attempt=0,
            job_id="j",
            task_index=0,
            command=["sh", "-c", script],
            gpus=[{"uuid": self.gpu, "index": 0, "milli": 1000, "memory_mib": 0}],
            epoch=1,
            expires_at=NOW + 60,
        )
        return signer.seal(order, node).model_dump_json()

    def cleanup(self) -> None:
        for handle in self.runtime.adopt():
            if self.runtime.is_alive(handle):
                os.killpg(handle.pgid, signal.SIGKILL)


@pytest.fixture
def setup(tmp_path):
    s = Setup(tmp_path)
    yield s
    s.cleanup()


def test_frames_from_the_control_plane_are_applied_and_rearm_the_fence(setup):
    ch = setup.channel
    setup.clock.advance(39)
    ch.handle_frame(setup.launch_json())
    [started] = ch.outbox.take()
    assert (started.state, started.seq) == ("started", 0)
    ch.handle_frame(Ack(seq=0).model_dump_json())
    assert ch.outbox.in_flight == 0
    setup.clock.advance(39)
    assert not ch.check_fence()
    ch.handle_frame(b'{"type": "launch", "bogus": true}')  # malformed: ignored, and does not count as word
    setup.clock.advance(1)
    handle = ch.workloads.get(("a1", 0)).handle
    assert setup.runtime.poll(handle).running
    assert ch.workloads.time_left(ch.silence.silence_s(), 40.0) == 0  # 40 s since the last valid frame: fence it


def test_a_stop_order_stops_the_workload_in_the_background(setup):
    ch = setup.channel

    async def scenario() -> None:
        ch.handle_frame(setup.launch_json())
        handle = ch.workloads.get(("a1", 0)).handle
        stop = SIGNER.seal(Stop(allocation_id="a1", attempt=0, grace_s=5, reason="done"), NODE)
        ch.handle_frame(stop.model_dump_json())
        deadline = time.monotonic() + 10
        while setup.runtime.poll(handle).running:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)

    asyncio.run(scenario())
    ch.workloads.tick(connected=False)
    assert [(f.state, f.exit_code, f.message) for f in ch.outbox.take()] == [
        ("started", None, ""),
        ("exited", 143, "stopped: done"),
    ]


def _tampered(raw: str) -> str:
    order = json.loads(raw)
    order["command"] = ["sh", "-c", "echo owned"]
    return json.dumps(order)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(lambda s: s.launch_json(signer=OrderSigner.generate()), "bad signature", id="another key"),
        pytest.param(lambda s: _tampered(s.launch_json()), "bad signature", id="tampered command"),
        pytest.param(lambda s: s.launch_json(node="node-2"), "order for node node-2", id="another node"),
    ],
)
def test_orders_not_signed_for_this_node_are_refused_and_start_nothing(setup, frame, reason):
    ch = setup.channel
    ch.handle_frame(frame(setup))
    [refused] = ch.outbox.take()
    assert refused.state == "refused" and reason in refused.message
    assert ch.workloads.keys() == [] and setup.runtime.adopt() == []
    ch.handle_frame(setup.launch_json())  # the genuine order for the same attempt comes too late: still refused
    [again] = ch.outbox.take()
    assert again.state == "refused" and setup.runtime.adopt() == []


def test_a_channel_without_a_pinned_key_refuses_every_order(tmp_path):
    s = Setup(tmp_path)
    config = ChannelConfig(server_url="http://cp", credential="c", boot_id="b", node_id=NODE)  # no order_key
    bare = Channel(config, s.runtime, s.discovery, wall_clock=ManualClock(NOW))
    bare.handle_frame(s.launch_json())
    [refused] = bare.outbox.take()
    assert refused.state == "refused" and "no control-plane key pinned" in refused.message


def test_a_forged_stop_order_is_ignored(setup):
    ch = setup.channel
    ch.handle_frame(setup.launch_json())
    handle = ch.workloads.get(("a1", 0)).handle
    ch.outbox.take()
    for stop in (Stop(allocation_id="a1", attempt=0, grace_s=0), OrderSigner.generate().seal(
            Stop(allocation_id="a1", attempt=0, grace_s=0), NODE), SIGNER.seal(
            Stop(allocation_id="a1", attempt=0, grace_s=0), "node-2")):
        ch.handle_frame(stop.model_dump_json())
    time.sleep(0.2)
    assert setup.runtime.poll(handle).running and ch.outbox.take() == []  # no stop, no report


def test_a_rejected_frame_is_dropped_like_an_acked_one(setup):
    ch = setup.channel
    ch.handle_frame(setup.launch_json())
    [started] = ch.outbox.take()
    assert ch.outbox.in_flight == 1
    ch.handle_frame(Rejected(seq=started.seq, code=403, reason="not this node's").model_dump_json())
    assert ch.outbox.in_flight == 0


def test_self_fencing_stops_every_workload_and_reports_fenced(setup):
    ch = setup.channel

    async def scenario() -> None:
        ch.handle_frame(setup.launch_json("a1", "echo ready; exec sleep 30"))
        ch.handle_frame(setup.launch_json("a2", "trap '' TERM; echo ready; sleep 30"))
        deadline = time.monotonic() + 10
        while not all("ready" in h.log_path.read_text() for h in setup.runtime.adopt()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        setup.clock.advance(40)
        assert ch.check_fence()
        assert not ch.check_fence()
        deadline = time.monotonic() + 10
        while any(setup.runtime.poll(h).running for h in setup.runtime.adopt()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)

    asyncio.run(scenario())
    ch.workloads.tick(connected=False)
    finals = {(f.allocation_id, f.state, f.exit_code) for f in ch.outbox.take() if f.state != "started"}
    assert finals == {("a1", "fenced", 143), ("a2", "fenced", 137)}


def test_reconnects_with_backoff_until_stopped(tmp_path):
    attempts: list[tuple[str, dict[str, str]]] = []
    stop = asyncio.Event()

    @asynccontextmanager
    async def refuse(url: str, headers: dict[str, str]) -> AsyncIterator[None]:
        attempts.append((url, headers))
        if len(attempts) == 4:
            stop.set()
        raise ConnectionRefusedError("nobody home")
        yield  # pragma: no cover

    s = Setup(tmp_path, connect=refuse)
    asyncio.run(asyncio.wait_for(s.channel.run(stop), 10))
    assert len(attempts) == 4
    assert attempts[0] == ("ws://cp:8080/api/v1/agent/channel", {"Authorization": "Bearer cred"})
    assert s.channel.backoff.attempt == 3


def test_a_rejected_credential_ends_the_channel(tmp_path):
    @asynccontextmanager
    async def reject(url: str, headers: dict[str, str]) -> AsyncIterator[None]:
        raise CredentialRejected("HTTP 403")
        yield  # pragma: no cover

    with pytest.raises(CredentialRejected):
        asyncio.run(asyncio.wait_for(Setup(tmp_path, connect=reject).channel.run(asyncio.Event()), 10))


class MemoryConnection:
    """A connection double: records what the agent sends; `recv` yields what the test pushes."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()

    async def send(self, message: str) -> None:
        self.sent.append(json.loads(message))

    async def recv(self) -> str:
        item = await self.inbox.get()
        if item is None:
            raise ConnectionResetError("closed by the test")
        return item


def test_hello_first_then_unacked_frames_are_resent_with_new_seqs(tmp_path):
    connections: list[MemoryConnection] = []
    stop = asyncio.Event()

    @asynccontextmanager
    async def connect(url: str, headers: dict[str, str]) -> AsyncIterator[MemoryConnection]:
        connections.append(MemoryConnection())
        yield connections[-1]

    s = Setup(tmp_path, connect=connect)

    async def until(predicate, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        run = asyncio.create_task(s.channel.run(stop))
        await until(lambda: connections and connections[0].sent)
        first = connections[0]
        first.inbox.put_nowait(s.launch_json())
        await until(lambda: any(m["type"] == "task_status" for m in first.sent))
        await until(lambda: any(m["type"] == "heartbeat" for m in first.sent))
        first.inbox.put_nowait(None)  # the connection drops before the status is acked
        await until(lambda: len(connections) == 2 and any(m["type"] == "task_status" for m in connections[1].sent))
        stop.set()
        await asyncio.wait_for(run, 10)

    asyncio.run(scenario())
    first, second = connections[0].sent, connections[1].sent
    assert first[0]["type"] == "hello" and first[0]["running"] == [] and first[0]["seq"] == 0
    assert second[0]["type"] == "hello" and [r["allocation_id"] for r in second[0]["running"]] == ["a1"]
    seqs = [m["seq"] for m in first + second]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    resent = next(m for m in second if m["type"] == "task_status")
    original = next(m for m in first if m["type"] == "task_status")
    assert resent["state"] == original["state"] == "started" and resent["seq"] > original["seq"]
    beat = next(m for m in first if m["type"] == "heartbeat")
    assert [t["uuid"] for t in beat["telemetry"]] == [g.uuid for g in s.discovery.list_devices()]
    s.cleanup()
