"""The agent's side of the control-plane protocol (gpupool.protocol.agent): registration, then ONE outbound channel.

`register()` trades a join token (and a CSR) for a node credential and a client certificate over HTTP. `Channel`
keeps a WebSocket to `/api/v1/agent/channel` on the control plane's TLS 1.3 agent port, learnt from `/readyz` before
every connect (`locate_channel`), presenting the node certificate (mTLS, the CA pinned at registration) and the
header `Authorization: Bearer <credential>`; on every (re)connect it:

1. sends `Hello` listing the workloads it has (so the control plane can reconcile);
2. re-sends every unacknowledged task status and log chunk, renumbered (see `Outbox`);
3. sends a `Heartbeat` with GPU telemetry and idle GPUs every `heartbeat_s` (±20 % jitter);
4. handles `Launch` (checked by `check_order`: signed by the pinned control-plane key, for this node, fresh;
   idempotent; one that breaks the protocol's rules, such as a NUL in its command, or that the runtime cannot start
   is answered "failed" and the connection stays up: `Workloads`), `Stop` (SIGTERM, grace, SIGKILL; signed too),
   `Ack` and `Rejected` (a frame the control plane
   refused to apply: dropped, like an acked one, and logged), and `Certificate` (a renewed client certificate);
5. past 2/3 of its certificate's lifetime, sends `Renew` with a CSR for a fresh key (gpupool.agent.tls.Renewal).

Across connections it polls workloads and tails their logs every `tick_s`, reconnects with full-jitter exponential
backoff (at most a heartbeat apart while work runs: `timing.reconnect_delay`) to whichever of its control planes
leads (`locate_leader`), and keeps its reports in its outbox meanwhile. It SELF-FENCES each workload once no control
plane has been heard for that workload's max_disconnect (the launch order's, else the node's `fence_s`): it stops it
and reports it "fenced" once it is back (RELIABILITY.md §4.2). Every frame from the control plane also renews the
runtime's lease, so the runtime's watchdog fences the workloads on its own when this agent dies or hangs. Stopping
the channel (agent shutdown) leaves the workloads running, to be adopted by the next agent process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import TypeAdapter, ValidationError

from gpupool.agent.clock import Clock, MonotonicClock, ServerClock, WallClock
from gpupool.agent.devices.base import DeviceDiscovery
from gpupool.agent.failpoints import Failpoints
from gpupool.agent.idle import DEFAULT_IDLE_THRESHOLD_PCT, DEFAULT_IDLE_WINDOW_S, IdleDetector
from gpupool.agent.orders import EpochRecord
from gpupool.agent.outbox import Outbox
from gpupool.agent.runtime.base import RunHandle, WorkloadRuntime
from gpupool.agent.timing import (
    DEFAULT_FENCE_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KILL_GRACE_S,
    Backoff,
    Silence,
    jittered,
    reconnect_delay,
)
from gpupool.agent.tls import Renewal
from gpupool.agent.workloads import Workloads
from gpupool.protocol.agent import (
    ADDRESS,
    MAX_FRAME_BYTES,
    Ack,
    Certificate,
    Heartbeat,
    Hello,
    JobsAs,
    Launch,
    Registration,
    RegistrationReply,
    Rejected,
    Renew,
    ServerFrame,
    Stop,
)
from gpupool.protocol.devices import GpuInfo, GpuTelemetry
from gpupool.protocol.signing import OrderVerifier, hash_matches, key_hash
from gpupool.protocol.tls import ca_hash, ca_hash_matches

log = logging.getLogger(__name__)

REGISTER_PATH = "/api/v1/agent/register"
CHANNEL_PATH = "/api/v1/agent/channel"
SERVER_FRAMES: TypeAdapter[Launch | Stop | Ack | Rejected | Certificate] = TypeAdapter(ServerFrame)


class RegistrationError(RuntimeError):
    """Registration failed; `retryable` is True for network errors, 5xx and 429, False for other 4xx."""

    def __init__(self, message: str, *, status_code: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retryable = retryable


class CredentialRejected(RuntimeError):
    """The control plane refused the node credential (HTTP 401/403 on the channel handshake)."""


def endpoint(server_url: str, path: str, *, websocket: bool = False) -> str:
    """`server_url` (http, https, ws or wss) with `path` appended, in the http(s) or ws(s) scheme as asked."""
    parts = urlsplit(server_url)
    secure = parts.scheme in ("https", "wss")
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"bad control-plane URL {server_url!r}: expected http(s)://host[:port]")
    scheme = ("wss" if secure else "ws") if websocket else ("https" if secure else "http")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


def register(
    server_url: str,
    registration: Registration,
    transport: httpx.BaseTransport | None = None,
    *,
    timeout_s: float = 10.0,
    key_pin: str | None = None,
    ca_pin: str | None = None,
) -> RegistrationReply:
    """POST `registration` to `{server}/api/v1/agent/register` and return the reply.

    Raises `RegistrationError` carrying the server's own message on an HTTP error, and on an unreachable server
    or a malformed reply; also (not retryable) when `key_pin` ("sha256:<hex>", given to the operator by the
    control plane) is not the hash of the order key in the reply, or `ca_pin` not the hash of its agent CA (printed
    by `gpupool join-token create`): that is not our control plane (the join token is spent all the same); and when
    a CSR was sent but no certificate came back. `transport` lets tests answer without a network.
    """
    url = endpoint(server_url, REGISTER_PATH)
    try:
        with httpx.Client(transport=transport, timeout=timeout_s) as client:
            response = client.post(
                url, content=registration.model_dump_json(), headers={"Content-Type": "application/json"}
            )
    except httpx.TransportError as exc:
        raise RegistrationError(f"cannot reach the control plane at {url}: {exc}", retryable=True) from exc
    code = response.status_code
    if code >= 400:
        message = f"registration refused by {url} (HTTP {code}): {server_message(response)}"
        raise RegistrationError(message, status_code=code, retryable=code >= 500 or code == 429)
    try:
        reply = RegistrationReply.model_validate_json(response.content)
    except ValidationError as exc:
        raise RegistrationError(f"malformed registration reply from {url}: {exc}") from exc
    if key_pin and not hash_matches(reply.order_key, key_pin):
        raise RegistrationError(
            f"the control plane at {url} signs with key {_safe_hash(reply.order_key)}, not the pinned {key_pin}: "
            "refusing to join it"
        )
    if ca_pin and not ca_hash_matches(reply.ca_certificate, ca_pin):
        raise RegistrationError(
            f"the control plane at {url} has agent CA {_safe_ca_hash(reply.ca_certificate)}, not the pinned "
            f"{ca_pin}: refusing to join it"
        )
    if registration.csr and not (reply.certificate and reply.ca_certificate):
        raise RegistrationError(f"the control plane at {url} issued no channel certificate")
    return reply


def _safe_ca_hash(ca_pem: str) -> str:
    try:
        return ca_hash(ca_pem)
    except ValueError:
        return "(none or malformed)"


async def locate_channel(server_url: str, transport: httpx.AsyncBaseTransport | None = None,
                         timeout_s: float = 10.0) -> str:
    """The channel's wss URL: the host of `server_url` and the agent port the control plane reports in /readyz.
    Raises httpx.HTTPError or ValueError when it cannot say, or does not lead (a standby admits no agent: the
    caller tries its next control plane, or backs off and retries)."""
    async with httpx.AsyncClient(transport=transport, timeout=timeout_s) as client:
        response = await client.get(endpoint(server_url, "/readyz"))
    response.raise_for_status()
    ready = response.json()
    if ready.get("leader") is False:
        raise ValueError(f"{server_url} is a standby" + (f" ({ready['refusal']})" if ready.get("refusal") else ""))
    port = int(ready.get("agent_port") or 0)
    if not 0 < port < 65536:
        raise ValueError(f"{server_url} reports no agent port yet")
    host = urlsplit(server_url).hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"wss://{host}:{port}{CHANNEL_PATH}"


async def locate_leader(servers: Sequence[str], transport: httpx.AsyncBaseTransport | None = None,
                        timeout_s: float = 5.0) -> str:
    """The channel's wss URL at the first of `servers` (a pool's control planes) that leads; ValueError naming why
    each refused when none does (the caller backs off and retries)."""
    why = []
    for server in servers:
        try:
            return await locate_channel(server, transport, timeout_s)
        except (httpx.HTTPError, ValueError) as exc:
            why.append(f"{server}: {exc}")
    raise ValueError("no control plane leads: " + "; ".join(why))


def _safe_hash(public_key: str) -> str:
    try:
        return key_hash(public_key)
    except ValueError:
        return "(malformed key)"


def server_message(response: httpx.Response) -> str:
    """The human message of an error response: FastAPI's `detail`, a `message`/`error` field, or the body text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "message", "error"):
            if key in body:
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)[:500]
    return json.dumps(body)[:500]


def local_host(conn: object) -> str | None:
    """The local IP address of a connection (websockets' `local_address`), None when it has none: the address of
    the interface that reaches the control plane, which other nodes of the pool most likely reach too."""
    address = getattr(conn, "local_address", None)
    host = address[0] if isinstance(address, tuple) and address else None
    return host if isinstance(host, str) and ADDRESS.fullmatch(host) else None


class Connection(Protocol):
    """What the channel needs of a WebSocket connection (websockets' ClientConnection has it)."""

    async def send(self, message: str) -> None: ...

    async def recv(self) -> str | bytes: ...


Connector = Callable[[str, dict[str, str]], AbstractAsyncContextManager[Connection]]


def websocket_connector(*, open_timeout_s: float = 10.0, ping_s: float = 10.0,
                        tls: Callable[[], ssl.SSLContext] | None = None) -> Connector:
    """The real connector: `websockets` (imported on first use), frames capped at MAX_FRAME_BYTES, keepalive pings
    every `ping_s` and a close handshake bounded by `ping_s`, so a dead TCP connection is noticed and left within
    about 3 * ping_s; HTTP 401/403 on the handshake raise CredentialRejected. `tls` gives the client context for
    each connection (the node certificate may have been renewed since the last)."""

    @asynccontextmanager
    async def connect(url: str, headers: dict[str, str]) -> AsyncIterator[Connection]:
        from websockets.asyncio.client import connect as ws_connect
        from websockets.exceptions import InvalidStatus

        try:
            async with ws_connect(
                url,
                ssl=tls() if tls is not None else None,
                additional_headers=headers,
                open_timeout=open_timeout_s,
                ping_interval=ping_s,
                ping_timeout=ping_s,
                close_timeout=ping_s,
                max_size=MAX_FRAME_BYTES,
            ) as ws:
                yield ws
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                raise CredentialRejected(f"the control plane refused this node's credential ({exc})") from exc
            raise

    return connect


@dataclass(frozen=True)
class ChannelConfig:
    """Settings of one channel. `heartbeat_s` and `fence_s` normally come from the RegistrationReply."""

    server_url: str
    credential: str
    boot_id: str
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    fence_s: float = DEFAULT_FENCE_S
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    tick_s: float = 0.5
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    idle_threshold_pct: int = DEFAULT_IDLE_THRESHOLD_PCT
    idle_window_s: float = DEFAULT_IDLE_WINDOW_S
    epoch_path: Path | None = None
    node_id: str = ""  # orders naming another node are refused
    order_key: str = ""  # the pinned control-plane key (base64); without one every order is refused
    untrusted_images: bool | None = None  # the container-toolkit verdict, said in every Hello (gpupool.agent.toolkit)
    jobs_as: JobsAs | None = None  # who process jobs run as, said in every Hello (gpupool.agent.runtime.identity)
    #: where other nodes reach this one (gangs' MASTER_ADDR and hostfile); None: the local address of the channel
    advertise_address: str | None = None

    def __post_init__(self) -> None:
        if min(self.heartbeat_s, self.fence_s, self.tick_s) <= 0 or self.kill_grace_s < 0:
            raise ValueError("heartbeat_s, fence_s and tick_s must be positive and kill_grace_s >= 0")
        if self.fence_s <= self.heartbeat_s:
            raise ValueError(f"fence_s ({self.fence_s}) must exceed heartbeat_s ({self.heartbeat_s})")
        if self.advertise_address is not None and not ADDRESS.fullmatch(self.advertise_address):
            raise ValueError("advertise address (GPUPOOL_ADVERTISE_ADDRESS): must be a host name or an IP address")

    @property
    def url(self) -> str:
        return endpoint(self.server_url, CHANNEL_PATH, websocket=True)


class Channel:
    """One agent boot's connection to the control plane; see the module docstring for the behaviour.

    `clock` (monotonic) drives fencing, `wall_clock` order expiry (corrected to the control plane's clock at every
    handshake: `server_clock`), `rng` backoff and heartbeat jitter; `connect` replaces the WebSocket connector and
    `locate` says where to connect (default: `config.url`). `renewal` keeps the node certificate fresh (mTLS).
    `adopted` are the handles `runtime.adopt()` found at start. Failpoints are armed from the environment
    (gpupool.agent.failpoints; ValueError for a malformed one).
    """

    def __init__(
        self,
        config: ChannelConfig,
        runtime: WorkloadRuntime,
        discovery: DeviceDiscovery,
        *,
        adopted: Sequence[RunHandle] = (),
        clock: Clock | None = None,
        wall_clock: Clock | None = None,
        rng: random.Random | None = None,
        connect: Connector | None = None,
        locate: Callable[[], Awaitable[str]] | None = None,
        renewal: Renewal | None = None,
    ) -> None:
        self._config = config
        self._runtime = runtime
        self._discovery = discovery
        self._clock = clock if clock is not None else MonotonicClock()
        self._rng = rng if rng is not None else random.Random()
        self._connect = connect if connect is not None else websocket_connector(ping_s=min(20.0, config.fence_s / 4))
        self._locate = locate
        self.renewal = renewal
        self._wake = asyncio.Event()
        self.outbox = Outbox(config.boot_id, on_put=self._wake.set)
        self.server_clock = ServerClock(wall_clock if wall_clock is not None else WallClock())
        self.workloads = Workloads(
            runtime,
            self.outbox,
            wall_clock=self.server_clock,
            epochs=EpochRecord(config.epoch_path),
            gpu_uuids=node_gpu_uuids(discovery.list_devices()),
            node_id=config.node_id,
            verifier=OrderVerifier(config.order_key),
            failpoints=Failpoints.from_env(),
        )
        self.workloads.adopt(adopted)
        self.silence = Silence(self._clock)
        self.backoff = Backoff(self._rng, base_s=config.backoff_base_s, cap_s=config.backoff_cap_s)
        self._idle = IdleDetector(self._clock, threshold_pct=config.idle_threshold_pct, window_s=config.idle_window_s)
        self._stops: set[asyncio.Task[None]] = set()
        self.connected = False

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, serve and reconnect until `stop` is set; raises CredentialRejected. Workloads keep running."""
        self.workloads.tick(connected=False)
        maintain = asyncio.create_task(self._maintain())
        try:
            while not stop.is_set():
                await self._connect_once(stop)
                if not stop.is_set():
                    left = self.workloads.time_left(self.silence.silence_s(), self._config.fence_s)
                    delay = reconnect_delay(self.backoff, left, self._config.heartbeat_s, self._rng)
                    log.info("reconnecting to %s in %.2f s", self._config.server_url, delay)
                    await _wait(stop, delay)
        finally:
            maintain.cancel()
            await asyncio.gather(maintain, return_exceptions=True)

    def handle_frame(self, raw: str | bytes) -> None:
        """Apply one frame from the control plane (any valid frame also counts as word from it for fencing)."""
        try:
            frame = SERVER_FRAMES.validate_json(raw)
        except ValidationError:
            # never the frame itself nor pydantic's message (it quotes input): a launch order carries secret env values
            launch = _launch_fields(raw)
            if launch is not None:  # answered, never dropped: the control plane would hold its GPUs
                self.workloads.on_invalid_launch(launch)
                return
            log.warning("ignoring a malformed frame from the control plane: type %s, %d bytes", _frame_type(raw),
                        len(raw))
            return
        self.silence.heard()
        self._renew_lease()
        self.backoff.reset()
        if isinstance(frame, Ack):
            self.workloads.on_acked(self.outbox.ack(frame.seq))
        elif isinstance(frame, Rejected):
            log.warning("the control plane rejected frame %d (%d): %s", frame.seq, frame.code, frame.reason)
            self.workloads.on_acked(self.outbox.ack(frame.seq))
        elif isinstance(frame, Launch):
            self.workloads.on_launch(frame)
        elif isinstance(frame, Certificate):
            if self.renewal is None or not self.renewal.accept(frame.certificate):
                log.warning("ignoring a certificate from the control plane that was not asked for or does not fit")
            else:
                log.info("channel certificate renewed (valid until %s)", self.renewal.tls.validity[1])
        else:
            handle = self.workloads.on_stop(frame)
            if handle is not None:
                self._stop_in_background(handle, frame.grace_s)

    def check_fence(self) -> bool:
        """Fence every workload whose max_disconnect (the node's `fence_s` for one without its own) the control
        plane's silence has reached: stop it. True if it fenced any."""
        silence = self.silence.silence_s()
        handles = self.workloads.fence(silence, self._config.fence_s)
        if not handles:
            return False
        log.error("self-fencing: no word from any control plane for %.1f s; stopping %d workload(s) past their "
                  "max_disconnect", silence, len(handles))
        for handle in handles:
            self._stop_in_background(handle, self._config.kill_grace_s)
        return True

    def _renew_lease(self) -> None:
        """Tell the runtime's watchdogs we just heard from the control plane (the real monotonic clock, which they
        read in other processes); a failed write only means they may fence early, so it never stops the channel."""
        try:
            self._runtime.renew_lease(time.monotonic())
        except OSError as exc:
            log.warning("could not renew the workloads' lease: %s", exc)

    async def _connect_once(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self._config.credential}"}
        if self.renewal is not None and self.renewal.expired():
            raise CredentialRejected(f"this node's channel certificate expired at {self.renewal.tls.validity[1]}")
        try:
            url = await self._locate() if self._locate is not None else self._config.url
            async with self._connect(url, headers) as conn:
                response = getattr(conn, "response", None)  # websockets: the handshake's HTTP response
                self.server_clock.sync(response.headers.get("date") if response is not None else None)
                await self._serve(conn, stop)
        except CredentialRejected:
            raise
        except Exception as exc:  # any failure of one connection means: back off and reconnect
            log.warning("channel to %s lost: %s: %s", self._config.server_url, type(exc).__name__, exc)
        finally:
            self.connected = False
            self.outbox.requeue()

    async def _serve(self, conn: Connection, stop: asyncio.Event) -> None:
        """Hello, then reader, writer and heartbeats until one of them ends or `stop` is set."""
        hello = Hello(
            boot_id=self._config.boot_id, seq=self.outbox.next_seq(), running=self.workloads.running_reports(),
            untrusted_images=self._config.untrusted_images, jobs_as=self._config.jobs_as,
            address=self._config.advertise_address or local_host(conn),
        )
        await conn.send(hello.model_dump_json())
        self.connected = True
        self._wake.set()
        tasks = [asyncio.create_task(coro) for coro in (self._read(conn), self._write(conn), self._beat(), stop.wait())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _read(self, conn: Connection) -> None:
        while True:
            self.handle_frame(await conn.recv())

    async def _write(self, conn: Connection) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for frame in self.outbox.take():
                await conn.send(frame.model_dump_json())

    async def _beat(self) -> None:
        while True:
            telemetry = await asyncio.to_thread(self._telemetry)
            idle = self._idle.observe(telemetry)
            beat = Heartbeat(boot_id=self._config.boot_id, seq=0, telemetry=telemetry, idle_gpus=idle[:64])
            self.outbox.put(beat, reliable=False)
            await asyncio.sleep(jittered(self._config.heartbeat_s, self._rng))

    def _telemetry(self) -> list[GpuTelemetry]:
        try:
            return self._discovery.telemetry()
        except Exception as exc:  # a broken sensor must not stop heartbeats
            log.warning("GPU telemetry failed: %s", exc)
            return []

    async def _maintain(self) -> None:
        """Every tick_s, connected or not: poll workloads, tail logs, fence when due."""
        while True:
            try:
                self.workloads.tick(connected=self.connected)
                self.check_fence()
                self._renew_certificate()
            except Exception:  # one bad tick must not end fencing and reporting
                log.exception("workload tick failed")
            await asyncio.sleep(self._config.tick_s)

    def _renew_certificate(self) -> None:
        """While connected and the certificate is due: ask for a new one (unreliable: asked again if none comes)."""
        csr = self.renewal.request() if self.renewal is not None and self.connected else None
        if csr is not None:
            log.info("renewing the channel certificate (valid until %s)", self.renewal.tls.validity[1])  # type: ignore[union-attr]
            self.outbox.put(Renew(boot_id=self._config.boot_id, seq=0, csr=csr), reliable=False)

    def _stop_in_background(self, handle: RunHandle, grace_s: float) -> None:
        task = asyncio.create_task(self._stop(handle, grace_s))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, handle: RunHandle, grace_s: float) -> None:
        try:
            await asyncio.to_thread(self._runtime.stop, handle, grace_s)
        except Exception:  # reported by the next poll; keep the agent alive
            log.exception("stopping %s failed", handle.key)


def _frame_type(raw: str | bytes) -> str:
    """The `type` of a frame for a log line: a short word, or "?" (not JSON, no such field, or an odd value)."""
    try:
        kind = json.loads(raw).get("type")
    except (ValueError, AttributeError, RecursionError):
        return "?"
    return kind if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 32 else "?"


def _launch_fields(raw: str | bytes) -> dict[str, Any] | None:
    """The JSON object of a frame whose `type` is "launch" (however broken its fields), or None."""
    try:
        frame = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return frame if isinstance(frame, dict) and frame.get("type") == "launch" else None


def node_gpu_uuids(gpus: Sequence[GpuInfo]) -> set[str]:
    """Every UUID a launch order may name on this node: the GPUs and their MIG instances."""
    return {gpu.uuid for gpu in gpus} | {mig.uuid for gpu in gpus for mig in gpu.mig_instances}


async def _wait(stop: asyncio.Event, timeout_s: float) -> None:
    """Sleep `timeout_s`, or less when `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout_s)
