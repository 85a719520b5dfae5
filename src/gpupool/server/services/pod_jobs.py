"""Pods a cluster backend schedules (server/kube), kept in the jobs and allocations tables, so that metering, usage,
statements, `gpupool jobs`, `job why`, `top` and the dashboard see them as they see submitted jobs.

One job per pod, keyed by `external_id` ("k8s:" + the pod's uid: unique, so a restarted scheduler that lists the
pods again never records one twice), in the backend's organisation, in the project named as the pod's namespace
(made when first needed) and its queue, owned by the user KUBE_USER (made when first needed; it has no token, so it
never logs in). Its state follows the pod, forward only::

    pending --bound--> scheduled --Running--> running --Succeeded / Failed--> succeeded / failed
       \\------------------ deleted, or its node gone ------------------------> cancelled / failed

A bound pod has one allocation (attempt 1) with no gpupool node (`node_name` names the Kubernetes node), created
at the bind, started when the pod runs (its start time), released when the pod ends (its end time), so metering
bills exactly the pod's run interval, once. Writes are batched: `record` applies one cycle's changes in one
transaction, and the caller writes only what changed since its last write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.server.db.models import Allocation, Job, JobEvent, Org, Project, User, new_id
from gpupool.server.db.repositories import JOB_SEQ_LOCK
from gpupool.server.scheduler.binder import released_now
from gpupool.server.services.metering import aware

KUBE_USER = "kubernetes"
FINAL = ("succeeded", "failed", "cancelled")
#: how far each state is along the pod's life: a job never moves back
RANK = {"pending": 0, "scheduled": 1, "running": 2, "succeeded": 3, "failed": 3, "cancelled": 3}
#: ids per IN (...) list
CHUNK = 500


@dataclass(frozen=True)
class PodRecord:
    """What the database keeps of one pod, as the backend saw it; times are epoch seconds from the pod's own
    status (None where it says nothing: the moment of the write is taken)."""

    external_id: str
    namespace: str
    name: str
    queue: str  # the queue's name, as seen from the organisation
    state: str  # one of RANK
    gpus: str  # what the pod asks, in GPUs ("0.5", "2", "0")
    cpu_milli: int
    memory_mib: int
    gpu_milli: int  # in all
    priority: int
    created: float
    node: str = ""
    shares: tuple[tuple[int, int], ...] = ()  # (device index, milli)
    gpu_model: str = ""
    bound_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reason: dict[str, Any] | None = None  # why it waits (core.PendingReason.to_dict()) or why it ended


def find_org(session: Session, name: str) -> str | None:
    """The id of the organisation `name` (None if there is none: nothing is recorded)."""
    return session.scalar(select(Org.id).where(Org.name == name))


def open_pods(session: Session, org_id: str) -> dict[str, str]:
    """external id -> state of the organisation's pod jobs not yet final (what a restarted writer resumes from)."""
    rows = session.execute(select(Job.external_id, Job.state).where(
        Job.org_id == org_id, Job.external_id.is_not(None), Job.state.notin_(FINAL)))
    return {external_id: state for external_id, state in rows if external_id is not None}


def record(session: Session, org_id: str, records: Sequence[PodRecord], gone: Iterable[str],
           now: datetime) -> dict[str, str]:
    """Bring the jobs of `records` (made if new) and of the pods `gone` (deleted: they end) to what they say, in the
    caller's transaction; external id -> the state each job is in afterwards."""
    gone = list(gone)
    rows = _rows(session, [r.external_id for r in records] + gone)
    made = _make(session, org_id, [r for r in records if r.external_id not in rows], now)
    rows.update(made)
    states = {}
    for rec in records:
        job = rows[rec.external_id]
        _advance(session, job, rec, now)
        states[rec.external_id] = job.state
    for external_id in gone:
        job = rows.get(external_id)
        if job is not None:
            _vanish(session, job, now)
            states[external_id] = job.state
    if made:
        _number(session, list(made.values()))
    return states


def _rows(session: Session, ids: list[str]) -> dict[str, Job]:
    rows = {}
    for i in range(0, len(ids), CHUNK):
        for job in session.scalars(select(Job).where(Job.external_id.in_(ids[i:i + CHUNK]))):
            rows[job.external_id or ""] = job
    return rows


def _make(session: Session, org_id: str, records: list[PodRecord], now: datetime) -> dict[str, Job]:
    """New pending jobs for `records` (their namespaces' projects and the KUBE_USER made where missing)."""
    if not records:
        return {}
    projects = _projects(session, org_id, {r.namespace for r in records})
    user_id = _user(session, org_id)
    session.flush()  # rows without relationships are flushed in no set order: the referenced ones first
    made = {}
    for rec in records:
        job = Job(id=new_id(), seq=0, org_id=org_id, project_id=projects[rec.namespace], user_id=user_id,
                  queue=rec.queue, name=rec.name[:128], priority=rec.priority, preemptible=True, tags={},
                  state="pending", attempt=0, preemptions=0, submitted_at=_at(rec.created, now),
                  external_id=rec.external_id, spec={
                      "gpus": rec.gpus, "tasks": 1, "command": [], "cpus": f"{rec.cpu_milli / 1000:g}",
                      "memory_mib": rec.memory_mib, "kubernetes": {"namespace": rec.namespace, "pod": rec.name}})
        session.add(job)
        made[rec.external_id] = job
    session.flush()
    session.add_all(JobEvent(job_id=made[r.external_id].id, at=now, kind="submitted",
                             message=f"Kubernetes pod {r.namespace}/{r.name}") for r in records)
    return made


def _projects(session: Session, org_id: str, names: set[str]) -> dict[str, str]:
    have = dict(session.execute(select(Project.name, Project.id).where(Project.org_id == org_id,
                                                                        Project.name.in_(sorted(names)))).all())
    for name in sorted(names - set(have)):
        project = Project(id=new_id(), org_id=org_id, name=name)
        session.add(project)
        have[name] = project.id
    return have


def _user(session: Session, org_id: str) -> str:
    user_id = session.scalar(select(User.id).where(User.org_id == org_id, User.name == KUBE_USER))
    if user_id is None:
        user = User(id=new_id(), org_id=org_id, name=KUBE_USER, role="viewer", projects=[])
        session.add(user)
        user_id = user.id
    return user_id


def _advance(session: Session, job: Job, rec: PodRecord, now: datetime) -> None:
    """Move `job` forward to `rec`'s state (never back; a final state stands), and keep a pending pod's reason."""
    if job.state in FINAL or RANK[rec.state] < RANK[job.state]:
        return
    if rec.state == "pending":
        job.reason = rec.reason
        return
    allocation = _allocation(session, job, rec, now)
    if RANK[rec.state] >= RANK["running"] and allocation.started_at is None:
        started = max(_at(rec.started_at, now), aware(allocation.created_at))
        allocation.state, allocation.started_at, job.started_at = "running", started, started
        session.add(JobEvent(job_id=job.id, at=now, kind="running", message=f"running on {rec.node}"))
    if rec.state in FINAL:
        _end(session, job, allocation, rec.state, _at(rec.finished_at, now), rec.reason)
    else:
        job.state = rec.state


def _allocation(session: Session, job: Job, rec: PodRecord, now: datetime) -> Allocation:
    """The pod's allocation, made at its bind if the job has none yet."""
    found = session.scalar(select(Allocation).where(Allocation.job_id == job.id, Allocation.attempt == 1))
    if found is not None:
        return found
    allocation = Allocation(id=new_id(), job_id=job.id, task_index=0, attempt=1, node_id=None, node_name=rec.node,
                            gpu_model=rec.gpu_model, state="starting", gpu_milli=rec.gpu_milli,
                            cpu_milli=rec.cpu_milli, memory_mib=rec.memory_mib,
                            shares=[[i, m, 0] for i, m in rec.shares], created_at=_at(rec.bound_at, now))
    session.add(allocation)
    job.attempt, job.reason = 1, None
    session.add(JobEvent(job_id=job.id, at=now, kind="scheduled", message=f"bound to Kubernetes node {rec.node}"))
    return allocation


def _end(session: Session, job: Job, allocation: Allocation | None, state: str, at: datetime,
         reason: dict[str, Any] | None) -> None:
    job.state, job.finished_at = state, at
    if reason is not None:
        job.reason = reason
    if allocation is not None:
        released_now(allocation, state, None, session, max(at, aware(allocation.started_at or allocation.created_at)))
    message = reason["message"] if reason else f"the pod {state}"
    session.add(JobEvent(job_id=job.id, at=at, kind=state if state != "cancelled" else "deleted", message=message))


def _vanish(session: Session, job: Job, now: datetime) -> None:
    """A pod gone from the cluster (deleted, evicted, collected) before it ended: its job is cancelled now."""
    if job.state in FINAL:
        return
    allocation = session.scalar(select(Allocation).where(Allocation.job_id == job.id, Allocation.attempt == 1))
    _end(session, job, allocation, "cancelled", now,
         {"kind": "deleted", "message": "the pod was deleted before it ended", "details": []})


def _number(session: Session, jobs: list[Job]) -> None:
    """Number new jobs after every job numbered so far (repositories.number_at_commit, for a batch: this write holds
    the write lock on SQLite; on PostgreSQL the same advisory lock serialises it with submissions)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(JOB_SEQ_LOCK)))
    top = session.scalar(select(func.coalesce(func.max(Job.seq), 0))) or 0
    for i, job in enumerate(sorted(jobs, key=lambda j: (j.submitted_at, j.id)), start=1):
        job.seq = top + i


def _at(seconds: float | None, now: datetime) -> datetime:
    return now if seconds is None else datetime.fromtimestamp(seconds, UTC)
