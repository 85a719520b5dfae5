"""The control plane as one FastAPI application: `create_app(settings)`.

Start-up, in order: 1. migrate the database; 2. on a fresh database create the default organisation,
project, queue and operator, and write the operator's token to DATA_DIR/admin.token (0600); 3. load
nodes and open allocations into the scheduler's cache; 4. start the scheduler loop and the liveness
monitor; 5. open the agent channel's TLS listener (gpupool.server.agent_listener; its port is in /readyz).
Shutdown stops them; running workloads are untouched. The web dashboard (static files in
gpupool/dashboard, which use only the public API) is served at `/`, behind every API and system route.
Every response passes the middlewares, outermost first: security headers (gpupool.server.headers), then the API
guard (gpupool.server.guard: client address, audit log, rate limits, body size and time). `server_options` gives
uvicorn its part: idle and slow connections closed, no proxy header believed but by the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from sqlalchemy import select
from sqlalchemy.exc import DataError
from starlette.routing import Match, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

import gpupool
from gpupool.core import DeviceShare
from gpupool.protocol.agent import Registration, RegistrationReply
from gpupool.protocol.signing import key_hash
from gpupool.server import agent_ca, guard, headers, pool_keys, unavailable
from gpupool.server.agent_listener import AgentListener
from gpupool.server.agents import AgentHub
from gpupool.server.auth import principal_from, require
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Allocation, AllocationSlot, Job
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES, QueueIndex, job_spec
from gpupool.server.keyring import Keyring, KeyringError
from gpupool.server.metrics import Metrics
from gpupool.server.routers import api, changes, sessions, usage
from gpupool.server.routers import audit as audit_routes
from gpupool.server.routers import nodes as nodes_routes
from gpupool.server.scheduler.binder import Binder
from gpupool.server.scheduler.cache import ClusterCache, running_task
from gpupool.server.scheduler.lease import SchedulerLease, holder_id
from gpupool.server.scheduler.loop import SchedulerLoop
from gpupool.server.services import audit, draining
from gpupool.server.services.lifecycle import Lifecycle
from gpupool.server.services.tenancy import bootstrap
from gpupool.server.settings import Settings
from gpupool.server.slow_clients import HeadDeadline

if TYPE_CHECKING:
    from gpupool.server.kube.backend import KubeBackend

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboard"


class DashboardMount(Mount):
    """The web dashboard's static files at `/`, behind every other route. It never takes /api/* or a WebSocket, so
    an unknown API path or a wrong method keeps the API's own 404 / 405 answer."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/api" or path.startswith("/api/"):
            return Match.NONE, {}
        return super().matches(scope)


def _write_admin_token(settings: Settings, token: str) -> None:
    path = settings.data_dir / "admin.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")


def _load_cache(db: Database, cache: ClusterCache, hub: AgentHub) -> None:
    hub.reload_nodes()
    with db.session() as session:
        queues = QueueIndex.load(session)
        for allocation in session.scalars(select(Allocation).where(Allocation.state.in_(OPEN_ALLOCATION_STATES))):
            job = session.get(Job, allocation.job_id)
            node = next((e for e in cache.nodes.values() if e.node_id == allocation.node_id), None)
            if job is None or node is None:
                continue
            spec = job_spec(job, queues.key(job.org_id, job.queue))
            shares = tuple(DeviceShare(i, m, mem) for i, m, mem in allocation.shares)
            slots = tuple((s.gpu_id, s.slot) for s in session.scalars(select(AllocationSlot).where(
                AllocationSlot.allocation_id == allocation.id, AllocationSlot.released_at.is_(None))))
            task = running_task(f"{job.id}/{allocation.task_index}", spec, node.spec.name,
                                spec.tasks[allocation.task_index].shape, shares, time.time())
            cache.assume(allocation.id, task, slots)
            hub.last_seen.setdefault(allocation.node_id, time.monotonic())


def pool_refusal(db: Database, keyring: Keyring, hub: AgentHub, settings: Settings) -> str | None:
    """Why this control plane may not lead the pool (one line), or None: its master key, agent CA and order key
    must be the pool's (gpupool.server.pool_keys; the first start records them, and makes the master key)."""
    try:
        with db.session() as session:
            keyring.start(session)  # the master key: made on first start; refused if it is not the database's
            held = pool_keys.HeldKeys(keyring.held(), str(keyring.path), hub.ca.hash,
                                      str(settings.data_dir / agent_ca.CA_CERT), key_hash(hub.signer.public_key),
                                      str(settings.order_key_path))
            return pool_keys.check_or_record(session, held)
    except KeyringError as exc:
        return f"{exc}; this control plane will not lead"


def _prepare(settings: Settings, db: Database, lease: SchedulerLease, refusal: Callable[[], str | None]) -> None:
    """Start-up steps 1 and 2 (see the module docstring), then let `lease` lead only with the pool's keys
    (`refusal`); on SQLite (one control plane per data dir: nothing else could lead) refuse to start instead
    (KeyringError)."""
    migrate(settings.db_url)
    with db.session() as session:
        token = bootstrap(session)
    if token is not None:
        _write_admin_token(settings, token)
    lease.may_lead = refusal
    why = refusal()
    if why is not None and lease.sqlite:
        raise KeyringError(why)
    with contextlib.suppress(Exception):  # lead from the first request on if it can (the loop keeps trying)
        lease.hold()


def _take_over(db: Database, cache: ClusterCache, hub: AgentHub) -> None:
    """This process now holds the scheduler lease (at start, or taking over from another control plane): drop
    what its cache assumed, load the open allocations another leader may have made, and give every node a
    fresh grace before it can be declared lost (RELIABILITY.md §2.2)."""
    with cache.lock:
        for allocation_id in list(cache.held):
            cache.release(allocation_id)
        _load_cache(db, cache, hub)
    hub.took_over()


def _remove_node(app: FastAPI, hub: AgentHub, node_id: str) -> None:
    """Retire a node being removed (services.draining); this process forgets its credential at once."""
    hub.reset_node(node_id, draining.REMOVED)
    app.state.principals.clear()
def _kubernetes(settings: Settings, loop: SchedulerLoop) -> KubeBackend | None:
    """The Kubernetes backend (server/kube) when the settings name a kubeconfig, started and given to the loop; its
    pods are recorded in the loop's database (kube/records.py), fenced by the loop's lease."""
    if not settings.kubeconfig:
        return None
    from gpupool.server.kube.backend import KubeBackend
    from gpupool.server.kube.client import KubeClient, load
    from gpupool.server.kube.records import PodRecorder

    backend = KubeBackend(KubeClient(load(settings.kubeconfig)), loop.wake, settings.kube_org,
                          settings.kube_queue_map, settings.kill_grace_s)
    backend.recorder = PodRecorder(loop.db, loop.lease.fence, settings.kube_org)
    loop.backend = backend
    backend.start()
    return backend


def create_app(settings: Settings) -> FastAPI:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    cache = ClusterCache()
    hub = AgentHub(db, cache, settings)
    metrics = Metrics(cache, telemetry=lambda: hub.telemetry)
    lease = SchedulerLease(db, settings.data_dir, holder_id(), settings.lease_s, settings.lease_renew_s,
                           settings.lease_retry_s)
    lease.on_refused, hub.lease, hub.on_lost = metrics.fenced_refused.inc, lease, metrics.node_lost
    binder = Binder(db, cache, hub, settings.launch_ttl_s, settings.kill_grace_s, fence=lease.fence,
                    disconnect_limit=settings.disconnect_limit_s)
    binder.keyring = keyring = Keyring(settings.master_key_path)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(_prepare, settings, db, lease, partial(pool_refusal, db, keyring, hub, settings))
        loop = SchedulerLoop(db, cache, binder, lease, settings.profile, settings.placement,
                             settings.cycle_interval_s, metrics)
        lifecycle = Lifecycle(db, cache, hub, loop.wake, settings.kill_grace_s, fence=lease.fence)
        loop.on_takeover = lambda: _take_over(db, cache, hub)
        hub.lifecycle, hub.binder, hub.loop = lifecycle, binder, asyncio.get_running_loop()
        hub.draining = draining.Draining(lifecycle, partial(_remove_node, app, hub),
                                         settings.kill_grace_s + settings.suspect_after_s, lambda: hub.reset_nodes)
        await asyncio.to_thread(_load_cache, db, cache, hub)
        app.state.scheduler, app.state.lifecycle = loop, lifecycle
        app.state.fair_shares = lambda: loop.fair_shares
        backend = _kubernetes(settings, loop)
        loop.start()
        tasks = [asyncio.create_task(hub.monitor()), asyncio.create_task(
            audit.prune_every(db, settings.audit_retention_days, settings.audit_prune_interval_s))]
        listener = AgentListener(hub, settings)
        await listener.start()
        yield
        await listener.stop()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(loop.stop)
        if backend is not None:
            backend.stop()

    app = FastAPI(title="gpupool", version=gpupool.__version__, lifespan=lifespan)
    app.state.db, app.state.cache, app.state.hub, app.state.settings = db, cache, hub, settings
    app.state.fair_shares = lambda: {}
    app.state.principals, app.state.keyring = {}, keyring
    _guard(app, settings, db, metrics)
    app.include_router(api.router)
    app.include_router(nodes_routes.router)
    app.include_router(changes.router)
    app.include_router(sessions.router)
    app.include_router(usage.router)
    app.include_router(audit_routes.router)
    _error_handlers(app)
    _document_errors(app)
    _system_routes(app, metrics)
    _agent_routes(app, hub)
    if DASHBOARD.is_dir():  # last: only what no route above takes
        app.router.routes.append(DashboardMount("/", app=StaticFiles(directory=DASHBOARD, html=True), name="dashboard"))
    return app


def _guard(app: FastAPI, settings: Settings, db: Database, metrics: Metrics) -> None:
    """The middlewares; each add_middleware wraps the ones added before it."""
    app.add_middleware(guard.BodyLimit, limit=settings.max_body_bytes, timeout_s=settings.request_body_timeout_s)
    app.add_middleware(guard.RateLimit, rate_per_s=settings.rate_limit_per_s, burst=settings.rate_limit_burst,
                       auth_failures_per_min=settings.auth_failures_per_min)
    # it sees every refusal of the two above, with the identity authentication left
    app.add_middleware(guard.AuditLog, record=audit.GroupCommit(db).record, count=metrics.count_unauthenticated,
                       sample_per_min=settings.audit_sample_per_min)
    app.add_middleware(guard.ClientAddress, trusted=settings.trusted_proxy_list, header=settings.client_ip_header)
    app.add_middleware(headers.SecurityHeaders)  # outermost: every answer carries them


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.run's options for the control plane (RELIABILITY.md S5): keep-alive connections idle for
    `keep_alive_timeout_s` are closed, and so is a connection that has not sent a whole request head within it
    (HeadDeadline); uvicorn believes no X-Forwarded-For itself (by default it would, from 127.0.0.1): the guard's
    ClientAddress does, from the configured trusted proxies only."""
    return {"timeout_keep_alive": settings.keep_alive_timeout_s, "http": HeadDeadline, "proxy_headers": False}


def _error_handlers(app: FastAPI) -> None:
    unavailable.install(app)  # database/storage trouble and injected errors: 503/507 with Retry-After

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input as UTF-8 and fails (500) on a lone surrogate ("\ud800"), which
        # JSON allows; ASCII-escaped JSON carries any input.
        body = json.dumps({"detail": jsonable_encoder(_redacted(exc.errors()))}, ensure_ascii=True)
        return Response(body, status_code=422, media_type="application/json")

    @app.exception_handler(DataError)
    async def refused_by_database(request: Request, exc: DataError) -> Response:
        # A value the database itself refuses: a NUL character in text on PostgreSQL, an integer out of range.
        return JSONResponse({"detail": "a value in the request is out of range or holds a character the database "
                                       "cannot store (such as NUL)"}, status_code=422)


def _document_errors(app: FastAPI) -> None:
    """Make the OpenAPI spec say what a 422 holds: the list of field errors, or one message (a rule across fields,
    such as "min_tasks: must not exceed tasks", or a value the database refuses)."""
    default = app.openapi

    def openapi() -> dict[str, Any]:
        schema = default()
        errors = schema.get("components", {}).get("schemas", {}).get("HTTPValidationError")
        if errors is not None and "anyOf" not in errors["properties"]["detail"]:
            errors["properties"]["detail"] = {"title": "Detail",
                                              "anyOf": [errors["properties"]["detail"], {"type": "string"}]}
        return schema

    app.openapi = openapi


def _redacted(errors: Sequence[Any]) -> list[Any]:
    """Validation errors without the values of secret variables: an error about `secret_env`, or one whose input
    holds it (a whole-body check), echoes the names only."""
    out = []
    for error in errors:
        error = dict(error)
        given = error.get("input")
        if "secret_env" in error.get("loc", ()) and isinstance(given, dict):
            error["input"] = {name: "<redacted>" for name in given}
        elif "secret_env" in error.get("loc", ()):
            error.pop("input", None)
        elif isinstance(given, dict) and isinstance(given.get("secret_env"), dict):
            error["input"] = {**given, "secret_env": {name: "<redacted>" for name in given["secret_env"]}}
        out.append(error)
    return out


def _system_routes(app: FastAPI, metrics: Metrics) -> None:
    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz(request: Request) -> dict[str, object]:
        loop = getattr(request.app.state, "scheduler", None)
        hub: AgentHub = request.app.state.hub
        lease = hub.lease
        return {"status": "ok" if loop is not None and hub.agent_port else "starting",
                "cycles": loop.cycles if loop else 0, "agent_port": hub.agent_port, "leader": hub.leads(),
                "refusal": lease.refusal if lease is not None else None}

    @app.get("/version", include_in_schema=False)
    def version() -> dict[str, str]:
        return {"version": gpupool.__version__, "api": "v1"}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        """Every series for an operator's bearer token; without a token, 401, or (`metrics_public`) the cluster-wide
        series only (gpupool.server.metrics)."""
        view: Any = metrics.public_registry()
        if "authorization" in request.headers or not request.app.state.settings.metrics_public:
            require(await principal_from(request), "operator")  # 401 without a token, 403 for a non-operator
            view = metrics.registry
        metrics.refresh()
        hub: AgentHub = request.app.state.hub
        if hub.lease is not None:
            metrics.observe_control_plane(hub.guard.engaged, hub.lease.is_leader(), hub.lease.epoch)
        return Response(generate_latest(view), media_type="text/plain; version=0.0.4")


def _agent_routes(app: FastAPI, hub: AgentHub) -> None:
    @app.post("/api/v1/agent/register", response_model=RegistrationReply, tags=["agents"])
    async def register(body: Registration, request: Request) -> RegistrationReply:
        reply = await asyncio.to_thread(hub.register, body, request.client.host if request.client else None)
        # the join token verified (and is spent): the audit row may name it; a refused registration is anonymous
        guard.note(request.state, actor_kind="join", actor=guard.join_token_id(body.join_token))
        request.app.state.scheduler.wake()
        return reply
