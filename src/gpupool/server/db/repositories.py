"""Queries and conversions between rows and core values; ORM rows stop here."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, event, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gpupool.core import GpuDevice, JobSpec, NodeSpec, QueueSpec, QueueTree, ResourceVector, TaskShape, TaskSpec
from gpupool.core.queues import GPU_UNITS, model_resource
from gpupool.core.units import CPU, MEMORY
from gpupool.protocol.api import gpus_to_milli
from gpupool.server.db.models import Allocation, Gpu, Job, Node, Org, QueueRow

OPEN_ALLOCATION_STATES = ("starting", "running", "stopping")
JOB_SEQ_LOCK = 0x67706A6F62736571  # "gpjobseq": the PostgreSQL advisory lock that serialises job numbering
UNNUMBERED = 0  # a job's seq from its insert until `number_at_commit` numbers it, just before its transaction commits


def number_at_commit(session: Session, job: Job) -> None:
    """Number `job`, inserted in `session`'s transaction with seq UNNUMBERED, as the last statement before that
    transaction commits: seq = max(seq) + 1, unique and without gaps however many submissions run at once.

    Numbering takes the lock it waits on, held until the transaction commits or rolls back (PostgreSQL: a
    transaction-scoped advisory lock; SQLite: the database's write lock, held since the job's insert), so the max it
    reads includes every number committed before, and no other submission reads it until this one's number is in.
    Without the lock two submissions read the same max (regression test: tests/server/test_job_numbering.py).
    Taken in the session's `before_commit` hook, the lock covers only the numbering and the COMMIT, whatever the
    caller does between its last statement and its commit; every other statement of the submission runs outside it.
    Held from the submission's first statement, it serialised all of them: ~50 submissions/s on PostgreSQL
    (benchmarks/control_plane.py)."""
    event.listen(session, "before_commit", functools.partial(_number, job=job), once=True)


def _number(session: Session, job: Job) -> None:
    session.flush()  # the rest of the transaction's writes, before the lock
    if session.get_bind().dialect.name == "postgresql":
        seq = _number_on_postgresql(session, job.id)
    else:
        seq = session.execute(_NUMBERING, {"job_id": job.id}).scalar_one()
    set_committed_value(job, "seq", seq)


def _number_on_postgresql(session: Session, job_id: str) -> int:
    """Lock and number in one round trip (measured: +5-15 % submissions/s over two): a psycopg ClientCursor binds the
    parameters itself, so one query may carry both statements. The server runs them back to back, and READ
    COMMITTED gives each statement its own snapshot, so the UPDATE's is taken after the lock is granted."""
    import psycopg  # the driver (loaded with the engine already); never imported for SQLite

    with psycopg.ClientCursor(session.connection().connection.driver_connection) as cursor:
        cursor.execute(_PG_NUMBERING, {"key": JOB_SEQ_LOCK, "job_id": job_id})
        cursor.nextset()
        row = cursor.fetchone()
    assert row is not None, "the numbered job is not in the transaction"
    return int(row[0])


_jobs, _numbered = Job.__table__, Job.__table__.alias("numbered")
_NUMBERING = _jobs.update().where(_jobs.c.id == bindparam("job_id")).values(
    seq=select(func.coalesce(func.max(_numbered.c.seq), 0) + 1).scalar_subquery()).returning(_jobs.c.seq)
_PG_NUMBERING = ("SELECT pg_advisory_xact_lock(%(key)s); UPDATE jobs SET seq = (SELECT coalesce(max(seq), 0) + 1 "
                 "FROM jobs) WHERE id = %(job_id)s RETURNING seq")


def job_shape(spec: dict[str, Any], share_group: str = "") -> TaskShape:
    """The shape of each task of a job `spec`; a fraction of a GPU is shared only within `share_group` (the job's
    organisation), and a job with an image needs a node that takes untrusted images."""
    milli = gpus_to_milli(spec["gpus"])
    count, per_gpu = (1, milli) if 0 < milli < 1000 else (milli // 1000, 1000 if milli else 0)
    return TaskShape(cpu_milli=int(Decimal(spec["cpus"]) * 1000), memory_mib=int(spec["memory_mib"]),
                     gpu_count=count, gpu_milli=per_gpu, gpu_memory_mib=int(spec.get("gpu_memory_mib", 0)),
                     gpu_models=tuple(spec.get("gpu_models", [])), share_group=share_group,
                     has_image=bool(spec.get("image")))


def job_spec(row: Job, queue: str, shapes: dict[TaskShape, TaskShape] | None = None) -> JobSpec:
    """The job as the scheduling core sees it, in the core's `queue` (QueueIndex.key). With `shapes`, a shape equal
    to one in it is replaced by that one object (and a new one added), so that the core's lookups by shape find it
    by identity."""
    shape = job_shape(row.spec, share_group=row.org_id)
    if shapes is not None:
        shape = shapes.setdefault(shape, shape)
    tasks = tuple(TaskSpec(f"{row.id}/{i}", shape) for i in range(int(row.spec["tasks"])))
    limit = row.spec.get("runtime_limit_s")
    return JobSpec(row.id, tasks, queue=queue, min_tasks=int(row.spec.get("min_tasks") or len(tasks)),
                   priority=row.priority, submitted_at=epoch_s(row.submitted_at), preemptible=row.preemptible,
                   runtime_limit_s=float(limit) if limit else None, user=row.user_id)


def epoch_s(at: datetime) -> float:
    """Seconds since the epoch of a stored time (SQLite hands back naive datetimes of UTC times). The core plans in
    these seconds: a job's submission time is how long it has waited (reservations, overdue order), not its number."""
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp()


def node_spec(node: Node, gpus: Sequence[Gpu]) -> NodeSpec:
    ordered = sorted(gpus, key=lambda g: g.index)
    devices = tuple(GpuDevice(i, g.model, g.memory_mib, g.uuid) for i, g in enumerate(ordered))
    return NodeSpec(node.name, node.cpu_milli, node.memory_mib, devices, node.site, node.rack,
                    untrusted_images=node.untrusted_images)


def resources(raw: dict[str, Any] | None) -> ResourceVector | None:
    if raw is None:
        return None
    amounts: dict[str, int] = {}
    if raw.get("gpus") is not None:
        amounts[GPU_UNITS] = int(Decimal(str(raw["gpus"])) * 1000)
    if raw.get("cpus") is not None:
        amounts[CPU] = int(Decimal(str(raw["cpus"])) * 1000)
    if raw.get("memory_mib") is not None:
        amounts[MEMORY] = int(raw["memory_mib"])
    for model, gpus in (raw.get("per_model") or {}).items():
        amounts[model_resource(model)] = int(Decimal(str(gpus)) * 1000)
    return ResourceVector(amounts)


def queue_key(org_name: str | None, name: str) -> str:
    """The scheduling core's name of a queue. Queue names are unique within an organisation and among shared queues
    (of no organisation), and NAME has no ':', so an organisation's queue is "org:name" and a shared one "name"."""
    return name if org_name is None else f"{org_name}:{name}"


class QueueIndex:
    """Every queue, and what a queue name means as seen from an organisation: its own queue of that name, else a
    shared one (a job's `queue`, a queue's `parent`). The API shows plain names; the core sees `queue_key`s."""

    def __init__(self, rows: Sequence[QueueRow], orgs: dict[str, str]) -> None:
        self.rows, self.orgs = rows, orgs
        self._by_name = {(r.org_id, r.name): r for r in rows}

    @classmethod
    def load(cls, session: Session) -> QueueIndex:
        rows = session.scalars(select(QueueRow).order_by(QueueRow.name, QueueRow.org_id)).all()
        return cls(rows, {org_id: name for org_id, name in session.execute(select(Org.id, Org.name))})

    def find(self, org_id: str | None, name: str) -> QueueRow | None:
        """The queue `name` names for organisation `org_id` (None: among shared queues only)."""
        return self._by_name.get((org_id, name)) or self._by_name.get((None, name))

    def row_key(self, row: QueueRow) -> str:
        return queue_key(self.orgs.get(row.org_id) if row.org_id else None, row.name)

    def key(self, org_id: str, name: str) -> str:
        """The core's name of the queue a job of `org_id` names; for a queue that does not exist, a key no queue
        has (the core then reports the job's queue unknown)."""
        row = self.find(org_id, name)
        return self.row_key(row) if row is not None else queue_key(self.orgs.get(org_id, org_id), name)

    def parent(self, row: QueueRow) -> QueueRow | None:
        return None if row.parent is None else self.find(row.org_id, row.parent)

    def children(self, row: QueueRow) -> list[QueueRow]:
        return [r for r in self.rows if r.parent == row.name and self.parent(r) is row]

    def _parent_key(self, row: QueueRow) -> str | None:
        if row.parent is None:
            return None
        parent = self.parent(row)
        if parent is None:  # a key no queue has: the tree refuses it, naming the parent
            return queue_key(self.orgs.get(row.org_id) if row.org_id else None, row.parent)
        return self.row_key(parent)

    def tree(self) -> QueueTree:
        """The queue tree (ValueError naming the queue when it is not a valid one: a missing parent, a cycle)."""
        return QueueTree(QueueSpec(
            self.row_key(r), self._parent_key(r), resources(r.guaranteed) or ResourceVector(), resources(r.limit),
            r.over_quota_weight, resources(r.borrow_limit), resources(r.lend_limit), r.priority,
            r.preempt_min_runtime_s, r.reclaim_min_runtime_s) for r in self.rows)


def find_queue(session: Session, org_id: str | None, name: str) -> QueueRow | None:
    """QueueIndex.find in one query: organisation `org_id`'s own queue `name`, else the shared one."""
    return session.scalar(select(QueueRow).where(
        QueueRow.name == name, or_(QueueRow.org_id == org_id, QueueRow.org_id.is_(None))).order_by(
        QueueRow.org_id.is_(None)).limit(1))


def queue_tree(session: Session) -> QueueTree:
    return QueueIndex.load(session).tree()


def upsert(session: Session, table: Any, values: dict[str, Any], keys: Sequence[str],
           changes: Callable[[Any], dict[str, Any]]) -> None:
    """INSERT `values`, or where a row with the same `keys` (a unique index's columns) exists, UPDATE it with
    `changes(excluded)` (`excluded` names the values that did not go in): one statement, so writers racing on one
    key each succeed in turn instead of one meeting a unique violation (PostgreSQL's and SQLite's ON CONFLICT)."""
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    statement = insert(table).values(**values)
    session.execute(statement.on_conflict_do_update(index_elements=list(keys), set_=changes(statement.excluded)))


def pending_job_ids(session: Session, limit: int = 5000) -> list[str]:
    """The ids of the first `limit` pending jobs, in submission order; a Kubernetes pod's job (`external_id`) is not
    among them: its backend schedules it (server/kube)."""
    return list(session.scalars(select(Job.id).where(Job.state == "pending", Job.external_id.is_(None))
                                .order_by(Job.seq).limit(limit)))


def pending_rows(session: Session, ids: Sequence[str]) -> list[Job]:
    """The rows of those of `ids` that are pending."""
    return list(session.scalars(select(Job).where(Job.id.in_(list(ids)), Job.state == "pending")))


def open_allocations(session: Session) -> list[Allocation]:
    return list(session.scalars(select(Allocation).where(Allocation.state.in_(OPEN_ALLOCATION_STATES))))


def nodes_with_gpus(session: Session) -> list[tuple[Node, list[Gpu]]]:
    nodes = session.scalars(select(Node).order_by(Node.name)).all()
    gpus: dict[str, list[Gpu]] = {}
    for gpu in session.scalars(select(Gpu).where(Gpu.retired_at.is_(None))):
        gpus.setdefault(gpu.node_id, []).append(gpu)
    return [(n, gpus.get(n.id, [])) for n in nodes]
