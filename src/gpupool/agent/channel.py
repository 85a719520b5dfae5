"""The agent's side of the control-plane protocol (gpupool.protocol.agent): registration, then ONE outbound channel.

`register()` (gpupool.agent.registration) trades a join token (and a CSR) for a node credential and a client
certificate over HTTP. `Channel`
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

The rooms: connection and reconnect here; the transport in gpupool.agent.connection; frames in and fencing in
gpupool.agent.frames; registration and finding the leader in gpupool.agent.registration; the outbox in
gpupool.agent.outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.clock import Clock, MonotonicClock, ServerClock, WallClock
from gpupool.agent.connection import Connection, Connector, CredentialRejected, local_host, websocket_connector
from gpupool.agent.devices.base import DeviceDiscovery
from gpupool.agent.failpoints import Failpoints
from gpupool.agent.frames import FrameHandler
from gpupool.agent.idle import DEFAULT_IDLE_THRESHOLD_PCT, DEFAULT_IDLE_WINDOW_S, IdleDetector
from gpupool.agent.orders import EpochRecord
from gpupool.agent.outbox import Outbox
from gpupool.agent.registration import CHANNEL_PATH, endpoint
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
    Heartbeat,
    Hello,
    JobsAs,
    Renew,
)
from gpupool.protocol.devices import GpuInfo, GpuTelemetry
from gpupool.protocol.signing import OrderVerifier

log = logging.getLogger("gpupool.agent.channel")


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


class Channel(FrameHandler):
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


def node_gpu_uuids(gpus: Sequence[GpuInfo]) -> set[str]:
    """Every UUID a launch order may name on this node: the GPUs and their MIG instances."""
    return {gpu.uuid for gpu in gpus} | {mig.uuid for gpu in gpus for mig in gpu.mig_instances}



async def _wait(stop: asyncio.Event, timeout_s: float) -> None:
    """Sleep `timeout_s`, or less when `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout_s)
