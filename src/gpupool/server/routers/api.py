"""HTTP routes of `/api/v1`: thin — authenticate, call a service in one transaction, return its model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, TypeVar

import anyio
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, principal_from, require
from gpupool.server.db.engine import Database
from gpupool.server.failpoints import failpoint
from gpupool.server.services import ceilings, cluster, jobs, tenancy

router = APIRouter(prefix="/api/v1")
T = TypeVar("T")
Caller = Annotated[Principal, Depends(principal_from)]


async def _session(request: Request) -> AsyncIterator[Session]:
    """One transaction per request, committed before the response is sent (an acknowledged write is durable).
    The session opens on the event loop (it does no I/O before its first statement); its commit, or its rollback
    after an error, runs in a worker thread, shielded from a client that hangs up."""
    transaction = request.app.state.db.session()
    session = transaction.__enter__()
    try:
        yield session
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            if not await anyio.to_thread.run_sync(transaction.__exit__, type(exc), exc, exc.__traceback__):
                raise
        return
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(transaction.__exit__, None, None, None)


async def _in_one_call(db: Database, work: Callable[[Session], T], after_commit: str | None = None) -> T:
    """`work(session)` in one transaction, committed before the response, like a route with `Db`; but the work and
    the commit run in one worker-thread call (one thread hop, not two: the hot path, POST /jobs). A row lock the
    work takes is so released in the thread that took it: with `Db`, requests waiting on the lock could hold every
    worker thread while the commit that releases it waits for one. The failpoint `after_commit`, if any, is
    reached after the commit. A client that hangs up does not interrupt the call."""
    return await anyio.to_thread.run_sync(_work_and_commit, db, work, after_commit)


def _work_and_commit(db: Database, work: Callable[[Session], T], after_commit: str | None) -> T:
    with db.session() as session:
        out = work(session)
    if after_commit:
        failpoint(after_commit)
    return out


Db = Annotated[Session, Depends(_session, scope="function")]


@router.get("/whoami", response_model=api.Whoami, tags=["auth"])
def whoami(who: Caller) -> api.Whoami:
    return api.Whoami(user=who.user_name, org=who.org_name, role=who.role, projects=list(who.projects))


@router.post("/orgs", response_model=api.OrgOut, status_code=201, tags=["tenancy"])
def create_org(body: api.OrgCreate, who: Caller, db: Db) -> api.OrgOut:
    return tenancy.create_org(db, who, body)


@router.get("/orgs", response_model=list[api.OrgOut], tags=["tenancy"])
def list_orgs(who: Caller, db: Db) -> list[api.OrgOut]:
    return tenancy.list_orgs(db, who)


@router.get("/orgs/{name}/ceiling", response_model=api.OrgCeilingOut, tags=["tenancy"])
def org_ceiling(name: str, who: Caller, db: Db) -> api.OrgCeilingOut:
    return ceilings.get(db, who, name)


@router.put("/orgs/{name}/ceiling", response_model=api.OrgCeilingOut, tags=["tenancy"])
async def set_org_ceiling(name: str, body: api.OrgCeiling, who: Caller, request: Request) -> api.OrgCeilingOut:
    return await _in_one_call(request.app.state.db, lambda session: ceilings.put(session, who, name, body))


@router.post("/projects", response_model=api.ProjectOut, status_code=201, tags=["tenancy"])
def create_project(body: api.ProjectCreate, who: Caller, db: Db) -> api.ProjectOut:
    return tenancy.create_project(db, who, body)


@router.get("/projects", response_model=list[api.ProjectOut], tags=["tenancy"])
def list_projects(who: Caller, db: Db) -> list[api.ProjectOut]:
    return tenancy.list_projects(db, who)


@router.post("/users", response_model=api.UserOut, status_code=201, tags=["tenancy"])
def create_user(body: api.UserCreate, who: Caller, db: Db) -> api.UserOut:
    return tenancy.create_user(db, who, body)


@router.get("/users", response_model=list[api.UserOut], tags=["tenancy"])
def list_users(who: Caller, db: Db) -> list[api.UserOut]:
    return tenancy.list_users(db, who)


@router.post("/tokens", response_model=api.TokenOut, status_code=201, tags=["auth"])
def create_token(body: api.TokenCreate, who: Caller, db: Db) -> api.TokenOut:
    return tenancy.create_token(db, who, body)


@router.get("/tokens", response_model=list[api.TokenOut], tags=["auth"])
def list_tokens(who: Caller, db: Db) -> list[api.TokenOut]:
    return tenancy.list_tokens(db, who)


@router.delete("/tokens/{token_id}", status_code=204, tags=["auth"])
def revoke_token(token_id: str, who: Caller, db: Db, request: Request) -> Response:
    tenancy.revoke_token(db, who, token_id)
    request.app.state.principals.clear()  # this process forgets it at once; others within PRINCIPAL_TTL_S
    return Response(status_code=204)


@router.post("/join-tokens", response_model=api.JoinTokenOut, status_code=201, tags=["nodes"])
def create_join_token(body: api.JoinTokenCreate, who: Caller, db: Db, request: Request) -> api.JoinTokenOut:
    out = tenancy.create_join_token(db, who, body)
    return out.model_copy(update={"ca_hash": request.app.state.hub.ca.hash})


@router.post("/queues", response_model=api.QueueOut, status_code=201, tags=["queues"])
async def create_queue(body: api.QueueCreate, who: Caller, request: Request) -> api.QueueOut:
    mode = request.app.state.settings.quota_above_capacity
    out = await _in_one_call(request.app.state.db, lambda session: cluster.create_queue(session, who, body, mode))
    request.app.state.scheduler.wake()
    return out


@router.get("/queues", response_model=list[api.QueueOut], tags=["queues"])
def list_queues(who: Caller, db: Db, request: Request) -> list[api.QueueOut]:
    require(who, "viewer")
    return cluster.list_queues(db, who, request.app.state.fair_shares())


@router.post("/jobs", response_model=api.JobOut, status_code=201, tags=["jobs"])
async def submit(body: api.JobCreate, who: Caller, request: Request,
                 idempotency_key: Annotated[str | None, Header(max_length=128)] = None) -> api.JobOut:
    state = request.app.state
    _check_registry(body.image, state.settings.registry_allow)

    def work(session: Session) -> api.JobOut:
        return jobs.submit(session, who, body, idempotency_key, state.keyring, state.settings.max_pending_jobs_per_org)

    out = await _in_one_call(state.db, work, "jobs.after_commit_before_response")
    state.scheduler.wake()
    return out


def _check_registry(image: str | None, allow: str) -> None:
    """422 naming `image` when its registry may not be pulled from (api.registry_problem), as a body error."""
    problem = None if image is None else api.registry_problem(image, api.registry_allow(allow))
    if problem:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "image"), "msg": problem,
                                       "input": image}])


@router.get("/jobs", response_model=api.JobPage, tags=["jobs"])
def list_jobs(who: Caller, db: Db, state: Annotated[str | None, Query(max_length=24)] = None,
              queue: Annotated[str | None, Query(max_length=64)] = None,
              project: Annotated[str | None, Query(max_length=64)] = None,
              tag: Annotated[str | None, Query(pattern=api.TAG_FILTER)] = None,
              cursor: Annotated[str | None, Query(max_length=64)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              id_prefix: Annotated[str | None, Query(pattern=api.ID_PREFIX, description=(
                  "only jobs whose id begins with these hex digits (a unique prefix names one job)"))] = None,
              ) -> api.JobPage:
    if state is not None and state not in api.JOB_STATES:
        raise HTTPException(422, f"state: choose from {', '.join(api.JOB_STATES)}")
    return jobs.list_jobs(db, who, state, queue, project, tag, cursor, limit, id_prefix)


@router.get("/jobs/{job_id}", response_model=api.JobOut, tags=["jobs"])
def show_job(job_id: str, who: Caller, db: Db) -> api.JobOut:
    return jobs.job_out(db, jobs.scoped_job(db, who, job_id), with_allocations=True)


@router.post("/jobs/{job_id}/cancel", response_model=api.JobOut, tags=["jobs"])
def cancel_job(job_id: str, who: Caller, db: Db, request: Request) -> api.JobOut:
    job = jobs.scoped_job(db, who, job_id)
    return jobs.cancel(db, who, job, request.app.state.lifecycle)


@router.post("/jobs/{job_id}/approve", response_model=api.JobOut, tags=["jobs"])
def approve_job(job_id: str, body: api.Decision, who: Caller, db: Db, request: Request) -> api.JobOut:
    out = jobs.decide(db, who, jobs.scoped_job(db, who, job_id), True, body.note)
    request.app.state.scheduler.wake()
    return out


@router.post("/jobs/{job_id}/deny", response_model=api.JobOut, tags=["jobs"])
def deny_job(job_id: str, body: api.Decision, who: Caller, db: Db) -> api.JobOut:
    return jobs.decide(db, who, jobs.scoped_job(db, who, job_id), False, body.note)


@router.get("/jobs/{job_id}/events", response_model=list[api.EventOut], tags=["jobs"])
def job_events(job_id: str, who: Caller, db: Db) -> list[api.EventOut]:
    return jobs.events(db, jobs.scoped_job(db, who, job_id))


@router.get("/jobs/{job_id}/why", response_model=api.PendingReasonOut | None, tags=["jobs"])
def why_pending(job_id: str, who: Caller, db: Db) -> api.PendingReasonOut | None:
    job = jobs.scoped_job(db, who, job_id)
    if job.state == "pending_approval":
        return api.PendingReasonOut(kind="approval", message="waiting for a project admin to approve it")
    if job.state == "scheduled":
        return jobs.why_scheduled(db, job)
    if job.state != "pending":
        return api.PendingReasonOut(kind="not_pending", message=f"the job is {job.state}")
    if not job.reason:
        return api.PendingReasonOut(kind="queued", message="not considered by a scheduling cycle yet")
    return jobs.reason_out(job.reason)


@router.get("/jobs/{job_id}/logs", response_class=PlainTextResponse, tags=["jobs"])
def job_logs(job_id: str, who: Caller, db: Db, request: Request,
             offset: Annotated[int, Query(ge=0)] = 0, task: Annotated[int, Query(ge=0)] = 0) -> PlainTextResponse:
    """The latest attempt's log of task `task`, from byte `offset`; header X-Next-Offset says where to go on. Bytes
    cut by the per-attempt cap (the tail is kept) show as one marker line saying how many."""
    job = jobs.scoped_job(db, who, job_id)
    out = jobs.job_out(db, job, with_allocations=True)
    mine = [a for a in out.allocations if a.task_index == task]
    if not mine:
        return PlainTextResponse("", headers={"X-Next-Offset": str(offset), "X-Job-State": job.state})
    data, next_offset = request.app.state.hub.job_logs.read(mine[-1].id, mine[-1].attempt, offset, 1 << 20)
    return PlainTextResponse(data.decode(errors="replace"),
                             headers={"X-Next-Offset": str(next_offset), "X-Job-State": job.state})


@router.get("/nodes", response_model=list[api.NodeOut], tags=["nodes"])
def list_nodes(who: Caller, db: Db, request: Request) -> list[api.NodeOut]:
    return cluster.list_nodes(db, who, request.app.state.hub.telemetry) + cluster.backend_nodes(request.app.state.cache)


@router.post("/nodes/{name}/cordon", response_model=list[api.NodeOut], tags=["nodes"])
def cordon(name: str, who: Caller, db: Db, request: Request) -> list[api.NodeOut]:
    with request.app.state.db.session() as session:  # committed before the cache (services.draining.follow)
        cluster.set_cordon(session, who, name, True)
    request.app.state.cache.set_schedulable(name, False)
    return cluster.list_nodes(db, who, request.app.state.hub.telemetry)


@router.post("/nodes/{name}/uncordon", response_model=list[api.NodeOut], tags=["nodes"])
def uncordon(name: str, who: Caller, db: Db, request: Request) -> list[api.NodeOut]:
    with request.app.state.db.session() as session:
        ready = cluster.set_cordon(session, who, name, False).state == "ready"
    request.app.state.cache.set_schedulable(name, ready)
    request.app.state.scheduler.wake()
    return cluster.list_nodes(db, who, request.app.state.hub.telemetry)


@router.post("/nodes/{name}/reset", response_model=list[api.NodeOut], tags=["nodes"])
def reset_node(name: str, who: Caller, request: Request) -> list[api.NodeOut]:
    """Operators: take the node's identity back (certificates and credential revoked, channels closed, open work
    requeued, GPUs retired); a new join token may then register the name. Runs in transactions of its own (the
    answer must see them), not the request's."""
    state = request.app.state
    with state.db.session() as session:
        node_id = cluster.operator_node_id(session, who, name)
    state.hub.reset_node(node_id)
    state.principals.clear()  # this process forgets the node's credential at once; others within PRINCIPAL_TTL_S
    state.scheduler.wake()
    with state.db.session() as session:
        return cluster.list_nodes(session, who, state.hub.telemetry)


@router.post("/nodes/{name}/down", response_model=list[api.NodeOut], tags=["nodes"])
def mark_node_down(name: str, who: Caller, request: Request) -> list[api.NodeOut]:
    """Operators: the node is known dead (powered off, reinstalled): requeue its work now instead of after its
    max_disconnect. Refused (409) while its agent is heard: work still running there would run twice."""
    state = request.app.state
    with state.db.session() as session:
        node_id = cluster.operator_node_id(session, who, name)
    state.hub.mark_down(node_id)
    state.scheduler.wake()
    with state.db.session() as session:
        return cluster.list_nodes(session, who, state.hub.telemetry)


@router.get("/top", response_model=list[api.UsageRow], tags=["usage"])
def who_uses_what(who: Caller, db: Db) -> list[api.UsageRow]:
    require(who, "viewer")
    return cluster.top(db, who)
