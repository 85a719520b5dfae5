"""Jobs: submit (idempotent, approval above a queue's threshold), list, show, cancel, events, why, decide."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from fastapi import HTTPException
from sqlalchemy import bindparam, func, insert, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.core import TaskShape
from gpupool.core.diagnostics import iso_utc
from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import Allocation, Job, JobEvent, Node, Org, Project, QueueRow, User, new_id, utcnow
from gpupool.server.db.repositories import UNNUMBERED, QueueIndex, job_shape, number_at_commit
from gpupool.server.failpoints import failpoint
from gpupool.server.keyring import Keyring
from gpupool.server.services import capacity
from gpupool.server.services.lifecycle import Lifecycle
from gpupool.server.services.metering import aware
from gpupool.server.services.tenancy import member

PENDING_STATES = ("pending", "pending_approval")
#: what a submission's INSERT sets (the other columns take their defaults)
SUBMITTED_COLUMNS = ("id", "seq", "org_id", "project_id", "user_id", "queue", "name", "spec", "priority", "preemptible",
                     "tags", "idempotency_key", "state", "attempt", "preemptions", "submitted_at")


def submit(session: Session, principal: Principal, body: api.JobCreate, idempotency_key: str | None,
           keyring: Keyring | None = None, pending_cap: int | None = None) -> api.JobOut:
    """A new job (or the one this Idempotency-Key made); 429 when the organisation has `pending_cap` pending jobs.
    Secret variables are sealed with the organisation's data key by `keyring`; the job's spec keeps their names.
    The job is numbered just before the transaction commits (repositories.number_at_commit)."""
    require(principal, "member")
    project, queue = body.project or next(iter(principal.projects), ""), body.queue or "default"
    found = _admission(session, principal, project, queue, idempotency_key)
    spec = _spec(body, found.queue_max_disconnect_s)
    if found.replay_id is not None:
        return _replayed(session, session.get_one(Job, found.replay_id), spec)
    if body.min_tasks is not None and body.min_tasks > body.tasks:
        raise HTTPException(422, "min_tasks: must not exceed tasks")
    _check_requests(body)
    _check_project(principal, body.project, found)
    _check_queue(body.queue, found)
    shape = job_shape(spec)  # validates the shape as the scheduler will read it
    if not found.hold_unsatisfiable:
        _check_satisfiable(session, shape, body)
    if pending_cap is not None:
        _check_pending_cap(principal, found.pending, pending_cap)
    approval = found.approval_above_milli
    needs_approval = approval is not None and _total_milli(body) > approval
    job = Job(id=new_id(), seq=UNNUMBERED, org_id=principal.org_id, project_id=found.project_id,
              user_id=principal.user_id, queue=queue, name=body.name, spec=spec, priority=body.priority,
              preemptible=body.preemptible, tags=dict(body.tags), idempotency_key=idempotency_key,
              state="pending_approval" if needs_approval else "pending", attempt=0, preemptions=0,
              submitted_at=utcnow())
    failpoint("jobs.before_job_update")
    try:  # plain INSERTs (the job is not attached to the session): half the CPU of the ORM's flush
        session.execute(insert(Job.__table__), {c: getattr(job, c) for c in SUBMITTED_COLUMNS})
    except IntegrityError:
        if idempotency_key is None:
            raise
        return _lost_race(session, principal, spec, found.project_id, idempotency_key)
    if body.secret_env:
        if keyring is None:
            raise RuntimeError("a job with secret_env needs the keyring")
        keyring.seal_job(session, job, body.secret_env)
    session.execute(insert(JobEvent.__table__), {
        "job_id": job.id, "kind": "submitted",
        "message": "waiting for a project admin's approval" if needs_approval else "queued"})
    number_at_commit(session, job)
    return job_out(session, job, project_name=project, user_name=principal.user_name)


@dataclass(frozen=True)
class _Admission:
    """What a submission checks before its insert, read in one query (one round trip): the job its Idempotency-Key
    already made (keys are scoped per project and user: another user's key names none of theirs), its project, its
    queue (the organisation's own queue of that name, else a shared one: repositories.QueueIndex) and one of that
    queue's children (a queue with children takes no jobs), and how many jobs its organisation has pending (counted
    on the jobs' state index)."""

    replay_id: str | None
    project_id: str | None
    queue_id: str | None
    approval_above_milli: int | None
    queue_max_disconnect_s: int | None
    child_queue_id: str | None
    hold_unsatisfiable: bool | None
    pending: int


def _admission(session: Session, principal: Principal, project: str, queue: str, key: str | None) -> _Admission:
    params = {"org": principal.org_id, "user": principal.user_id, "key": key, "project": project, "queue": queue}
    return _Admission(*session.execute(ADMISSION, params).one())


def _first(column: Any, *where: Any) -> Any:
    return select(column).where(*where).limit(1).scalar_subquery()


def _queue_first(column: Any) -> Any:
    """`column` of the queue a job of the organisation names: its own of that name first, else a shared one."""
    return select(column).where(QueueRow.name == _queue_name, or_(QueueRow.org_id == _org, QueueRow.org_id.is_(
        None))).order_by(QueueRow.org_id.is_(None)).limit(1).scalar_subquery()


_org, _queue_name = bindparam("org"), bindparam("queue")
_project_id = _first(Project.id, Project.org_id == _org, Project.name == bindparam("project"))
_own_queue = select(QueueRow.id).where(QueueRow.name == _queue_name, QueueRow.org_id == _org).exists()
_pending = select(func.count()).select_from(Job).where(  # OR, not IN: no list expanded at each execution
    Job.org_id == _org, or_(*(Job.state == state for state in PENDING_STATES)),
    Job.external_id.is_(None))  # a cluster's pending pods (server/kube) are not submissions: they never count
#: the query of `_admission`, built once (a key of None matches no job). A child names its parent as seen from its
#: own organisation: the organisation's own queue is the parent of its rows only; a shared one (no organisation
#: owns one of that name) of every row that names it.
ADMISSION = select(
    _first(Job.id, Job.project_id == _project_id, Job.user_id == bindparam("user"),
           Job.idempotency_key == bindparam("key")),
    _project_id, _queue_first(QueueRow.id), _queue_first(QueueRow.approval_above_milli),
    _queue_first(QueueRow.max_disconnect_s),
    _first(QueueRow.id, QueueRow.parent == _queue_name,
           or_(QueueRow.org_id == _org, QueueRow.org_id.is_(None), ~_own_queue)),
    _queue_first(QueueRow.hold_unsatisfiable),
    _pending.scalar_subquery())


def _check_project(principal: Principal, named: str | None, found: _Admission) -> None:
    """422 when no project is named and the caller belongs to none; 404 for one outside the caller's reach."""
    if named is None and not principal.projects:
        raise HTTPException(422, "project: you belong to no project; name one with --project")
    name = named or principal.projects[0]
    if found.project_id is None or not member(principal, name):
        raise HTTPException(404, f"project {name!r} not found")


def _check_queue(named: str | None, found: _Admission) -> None:
    name = named or "default"
    if found.queue_id is None:
        raise HTTPException(404 if named else 422, f"queue {name!r} not found")
    if found.child_queue_id is not None:
        raise HTTPException(422, f"queue: {name!r} has child queues; submit to one of them")


def _replay(session: Session, principal: Principal, spec: dict[str, object], project_id: str | None,
            key: str | None) -> api.JobOut | None:
    """The job this Idempotency-Key already made in `project_id` for the caller (422 if it was made with another
    spec), or None."""
    if key is None:
        return None
    existing = session.scalar(select(Job).where(Job.project_id == project_id, Job.user_id == principal.user_id,
                                                Job.idempotency_key == key))
    return None if existing is None else _replayed(session, existing, spec)


def _replayed(session: Session, existing: Job, spec: dict[str, object]) -> api.JobOut:
    if existing.spec != spec:
        raise HTTPException(422, "Idempotency-Key: reused with a different job")
    return job_out(session, existing)


def _lost_race(session: Session, principal: Principal, spec: dict[str, object], project_id: str | None,
               key: str) -> api.JobOut:
    """A concurrent submission with the same key inserted first (the unique key refused ours): roll ours back and
    answer with its job, read in a new transaction, as a replay would; 409 with Retry-After if it is not visible."""
    session.rollback()
    with Session(session.get_bind()) as fresh:
        replay = _replay(fresh, principal, spec, project_id, key)
    if replay is None:
        raise HTTPException(409, "Idempotency-Key: the same submission is in progress; retry",
                            headers={"Retry-After": "1"})
    return replay


def _spec(body: api.JobCreate, queue_max_disconnect_s: int | None = None) -> dict[str, object]:
    """The job's spec as stored: the body less what has columns of its own; secret variables by name only; the
    queue's max_disconnect when the job names none (resolved at submission: a later change of the queue's leaves
    submitted jobs as they were)."""
    spec = body.model_dump(exclude={"name", "project", "queue", "priority", "preemptible", "tags", "secret_env"})
    if spec.get("max_disconnect_s") is None:
        spec["max_disconnect_s"] = queue_max_disconnect_s
    if body.secret_env:
        spec["secret_env"] = sorted(body.secret_env)  # names only; the values are sealed in job_secrets
    return spec


#: the least a job without GPUs asks for: every job takes something, so none is placed without limit or billed nothing
MIN_CPUS_WITHOUT_GPU, MIN_MEMORY_MIB_WITHOUT_GPU = Decimal("0.1"), 16


def _check_requests(body: api.JobCreate) -> None:
    """422 naming the fields when a job without GPUs asks for less than MIN_CPUS_WITHOUT_GPU CPUs or
    MIN_MEMORY_MIB_WITHOUT_GPU MiB of memory (all zero included)."""
    if api.gpus_to_milli(body.gpus) == 0 and (
            Decimal(body.cpus) < MIN_CPUS_WITHOUT_GPU or body.memory_mib < MIN_MEMORY_MIB_WITHOUT_GPU):
        raise HTTPException(422, f"gpus, cpus, memory_mib: a job without GPUs asks for at least "
                                 f"{MIN_CPUS_WITHOUT_GPU} CPU and {MIN_MEMORY_MIB_WITHOUT_GPU} MiB of memory "
                                 f"(this one: gpus={body.gpus}, cpus={body.cpus}, memory_mib={body.memory_mib})")


def _check_satisfiable(session: Session, shape: TaskShape, body: api.JobCreate) -> None:
    """422 naming the field when no node of the pool could hold the job even with every node empty
    (services.capacity); nothing is stored."""
    found = capacity.never_fits(capacity.pool_kinds(session), shape, body.min_tasks or body.tasks)
    if found is not None:
        field, message = found
        raise HTTPException(422, f"{field}: {message}; no node of the pool could ever run this job (a queue with "
                                 f"hold_unsatisfiable lets such jobs wait for capacity)")


def _check_pending_cap(principal: Principal, pending: int, cap: int) -> None:
    if pending >= cap:
        raise HTTPException(429, f"organisation {principal.org_name!r} has {pending} pending jobs, its cap "
                                 f"(max_pending_jobs_per_org = {cap}): wait for some to start, or cancel some")


def _total_milli(body: api.JobCreate) -> int:
    return api.gpus_to_milli(body.gpus) * body.tasks


def scoped_job(session: Session, principal: Principal, job_id: str) -> Job:
    """A job the caller may see: 404 for another tenant's, or (below tenant-admin) another project's."""
    job = session.get(Job, job_id)
    if job is None or not (principal.is_operator or job.org_id == principal.org_id):
        raise HTTPException(404, "job not found")
    project = session.get(Project, job.project_id)
    if not principal.at_least("tenant-admin") and (project is None or project.name not in principal.projects):
        raise HTTPException(404, "job not found")
    return job


def job_out(session: Session, job: Job, with_allocations: bool = False, project_name: str | None = None,
            user_name: str | None = None) -> api.JobOut:
    if project_name is None:
        project = session.get(Project, job.project_id)
        project_name = project.name if project else ""
    if user_name is None:
        user = session.get(User, job.user_id)
        user_name = user.name if user else ""
    out = api.JobOut(id=job.id, name=job.name, project=project_name, user=user_name,
                     queue=job.queue, state=job.state, attempt=job.attempt, preemptions=job.preemptions,
                     priority=job.priority, gpus=str(job.spec["gpus"]), tasks=int(job.spec["tasks"]),
                     command=list(job.spec["command"]), tags=dict(job.tags), submitted_at=job.submitted_at,
                     started_at=job.started_at, finished_at=job.finished_at, exit_code=job.exit_code,
                     reason=reason_out(job.reason) if job.reason else None,
                     secret_env=list(job.spec.get("secret_env", [])))
    if with_allocations:
        nodes = {n.id: n.name for n in session.scalars(select(Node))}
        rows = session.scalars(select(Allocation).where(Allocation.job_id == job.id).order_by(Allocation.created_at))
        out.allocations = [api.AllocationOut(id=a.id, task_index=a.task_index, attempt=a.attempt,
                                             node=a.node_name or nodes.get(a.node_id or "", ""), state=a.state,
                                             gpus=[{"index": i, "milli": m} for i, m, _ in a.shares],
                                             started_at=a.started_at, released_at=a.released_at,
                                             exit_code=a.exit_code) for a in rows]
    return out


def list_jobs(session: Session, principal: Principal, state: str | None, queue: str | None, project: str | None,
              tag: str | None, cursor: str | None, limit: int, id_prefix: str | None = None) -> api.JobPage:
    """The jobs the caller may see, newest first, filtered; `id_prefix` (hex digits, checked by the route) keeps the
    jobs whose id begins with it: how the CLI takes unique prefixes of ids, among the caller's jobs only."""
    query = select(Job).order_by(Job.seq.desc())
    if id_prefix:
        query = query.where(Job.id.startswith(id_prefix, autoescape=True))
    if not principal.is_operator:
        query = query.where(Job.org_id == principal.org_id)
    if not principal.at_least("tenant-admin"):
        visible = select(Project.id).where(Project.org_id == principal.org_id,
                                           Project.name.in_(principal.projects or ["-"]))
        query = query.where(Job.project_id.in_(visible))
    if state:
        query = query.where(Job.state == state)
    if queue:
        query = query.where(Job.queue == queue)
    if project:
        query = query.where(Job.project_id.in_(select(Project.id).where(Project.name == project)))
    if tag:
        key, _, value = tag.partition("=")
        query = query.where(Job.tags[key].as_string() == value)  # in SQL: a page is `limit` matching jobs
    if cursor:
        query = query.where(Job.seq < _decode_cursor(cursor))
    rows = list(session.scalars(query.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = base64.urlsafe_b64encode(str(rows[-1].seq).encode()).decode() if more and rows else None
    return api.JobPage(items=[job_out(session, r) for r in rows], next_cursor=next_cursor)


def _decode_cursor(cursor: str) -> int:
    try:
        seq = int(base64.urlsafe_b64decode(cursor.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        seq = -1
    if not 0 <= seq < 1 << 63:  # a database integer; a bigger one is a 500 on SQLite, not a cursor
        raise HTTPException(422, "cursor: not a cursor this API returned")
    return seq


def events(session: Session, job: Job) -> list[api.EventOut]:
    rows = session.scalars(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id))
    return [api.EventOut(at=e.at, kind=e.kind, message=e.message) for e in rows]


def cancel(session: Session, principal: Principal, job: Job, lifecycle: Lifecycle) -> api.JobOut:
    if job.external_id is not None:
        pod = job.spec.get("kubernetes") or {}
        raise HTTPException(409, f"job {job.id} is the Kubernetes pod {pod.get('namespace')}/{pod.get('pod')}: "
                                 "delete the pod (kubectl delete pod) to end it")
    user = session.get(User, job.user_id)
    if not (principal.at_least("project-admin") or (user is not None and user.id == principal.user_id)):
        raise HTTPException(403, "only the job's owner or a project admin can cancel it")
    failpoint("jobs.before_job_update")
    lifecycle.cancel(session, job)
    return job_out(session, job)


def decide(session: Session, principal: Principal, job: Job, approve: bool, note: str) -> api.JobOut:
    """Approve or deny a job awaiting approval; an approval re-checks its queue (_check_still_a_leaf)."""
    require(principal, "project-admin")
    if job.state != "pending_approval":
        raise HTTPException(409, f"job is {job.state}, not waiting for approval")
    if approve:
        _check_still_a_leaf(session, job)
    failpoint("jobs.before_job_update")
    table = Job.__table__
    values: dict[str, Any] = {"state": "pending" if approve else "denied"}
    if not approve:
        values["finished_at"] = datetime.now(job.submitted_at.tzinfo)
    moved = session.execute(table.update().where(  # compare-and-set: a cancel that came first stands
        table.c.id == job.id, table.c.state == "pending_approval").values(**values))
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        raise HTTPException(409, "job is no longer waiting for approval (cancelled meanwhile?)")
    session.refresh(job)
    session.add(JobEvent(job_id=job.id, kind="approved" if approve else "denied",
                         message=f"by {principal.user_name}: {note}".rstrip(": ")))
    return job_out(session, job)


def _check_still_a_leaf(session: Session, job: Job) -> None:
    """409 when the job's queue is gone, or has child queues now (a parent takes no jobs): approved, it would wait
    in no leaf for ever. It stays awaiting approval; the message says what to do."""
    queues = QueueIndex.load(session)
    queue = queues.find(job.org_id, job.queue)
    if queue is None:
        raise HTTPException(409, f"queue: {job.queue!r} no longer exists, so the job cannot run; it stays awaiting "
                                 "approval: deny it, and submit it again to a queue that exists")
    if queues.children(queue):
        raise HTTPException(409, f"queue: {job.queue!r} has child queues now and takes no jobs; the job stays "
                                 "awaiting approval: deny it, and submit it again to one of them")


def org_name(session: Session, org_id: str) -> str:
    org = session.get(Org, org_id)
    return org.name if org else ""


def reason_out(reason: dict[str, Any], now: float | None = None) -> api.PendingReasonOut:
    """A stored pending reason (the scheduling cycle's, `PendingReason.to_dict`) as the API gives it: the time its
    message names followed by how far from `now` (default: the wall clock) it is, read when asked."""
    at = reason.get("at")
    message = str(reason.get("message", ""))
    if isinstance(at, int | float):
        when = iso_utc(at)
        message = message.replace(when, f"{when}, {relative(at - (time.time() if now is None else now))}")
    return api.PendingReasonOut(kind=str(reason.get("kind", "")), message=message,
                                details=list(reason.get("details") or []),
                                at=datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else None,
                                holder=reason.get("holder") or None)


def relative(seconds: float) -> str:
    """"in 3 min", "2 h ago", "now": how far a time is, to a sensible unit."""
    span = abs(seconds)
    if span < 1:
        return "now"
    for limit, unit, size in ((90, "s", 1), (90 * 60, "min", 60), (36 * 3600, "h", 3600), (float("inf"), "d", 86400)):
        if span < limit:
            amount = f"{round(span / size)} {unit}"
            return f"in {amount}" if seconds > 0 else f"{amount} ago"
    return "now"  # not reached


def why_scheduled(session: Session, job: Job) -> api.PendingReasonOut:
    """Why a placed job has not started: the tasks its nodes' agents (a pod's: its kubelet) have not yet said they
    started, each with its node, the node's state, and since when it waits (the allocation's creation)."""
    rows = session.execute(select(  # a pod's allocation has no gpupool node: the Kubernetes node is named on it
        Allocation.task_index, Allocation.created_at, func.coalesce(Node.name, Allocation.node_name),
        func.coalesce(Node.state, "kubernetes")).outerjoin(Node, Node.id == Allocation.node_id).where(
        Allocation.job_id == job.id, Allocation.attempt == job.attempt,
        Allocation.state == "starting").order_by(Allocation.task_index))
    details = [{"task": task, "node": node, "node_state": state, "since": aware(created).isoformat()}
               for task, created, node, state in rows]
    if not details:
        return api.PendingReasonOut(kind="starting", message="placed; its tasks are starting")
    nodes = {d["node"]: d["node_state"] for d in details}
    waiting = ", ".join(f"{node} ({state})" for node, state in sorted(nodes.items()))
    starter = "kubelet" if job.external_id is not None else "agent"
    return api.PendingReasonOut(
        kind="waiting_for_node", details=details,
        message=f"placed since {details[0]['since']}; waiting for {len(details)} task(s) to be started by the "
                f"{starter} of {waiting}")
