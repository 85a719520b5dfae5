"""SQLAlchemy tables. ORM rows never leave `gpupool.server.db`; repositories convert them.

Invariants enforced by the database itself (RELIABILITY.md §2.1):
- I1: a GPU slot (one tenth of a GPU) has at most one open allocation: a unique partial index on
  (gpu_id, slot) WHERE released_at IS NULL;
- I3: one job per (project, user, idempotency key): a unique constraint, so a key reused by someone else makes a
  new job instead of revealing the other one;
- names are unique where people type them (organisations, projects and queues within one, shared queues (of no
  organisation) among themselves, nodes).
- the audit table is append-only: triggers refuse UPDATE and DELETE on it (migration 0003).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Org(Base):
    __tablename__ = "orgs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    #: what its tenant admins may grant its queues (api.OrgCeiling as a dict), set by operators; None: the default
    ceiling: Mapped[dict[str, Any] | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("org_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    cost_centre: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("org_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(32))
    projects: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Token(Base):
    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(64), default="")
    user_id: Mapped[str | None] = mapped_column(ForeignKey("users.id"), index=True)
    node_id: Mapped[str | None] = mapped_column(String(32), index=True)
    expires_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: a dashboard session's token: the token it was opened with (it dies with that one); None for API tokens
    session_of: Mapped[str | None] = mapped_column(String(32))


class JoinToken(Base):
    __tablename__ = "join_tokens"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column()
    used_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class QueueRow(Base):
    """A queue; `name` is unique within its organisation, and among shared queues (`org_id` None) by a partial index.
    `parent` is a queue name as seen from `org_id`: the organisation's own queue of that name, else a shared one."""

    __tablename__ = "queues"
    __table_args__ = (UniqueConstraint("org_id", "name", name="uq_queues_org_name"),
                      Index("uq_queues_shared_name", "name", unique=True, sqlite_where=text("org_id IS NULL"),
                            postgresql_where=text("org_id IS NULL")))
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64))
    org_id: Mapped[str | None] = mapped_column(ForeignKey("orgs.id"), index=True)
    parent: Mapped[str | None] = mapped_column(String(64))
    guaranteed: Mapped[dict[str, Any]] = mapped_column(default=dict)
    limit: Mapped[dict[str, Any] | None] = mapped_column()
    borrow_limit: Mapped[dict[str, Any] | None] = mapped_column()
    lend_limit: Mapped[dict[str, Any] | None] = mapped_column()
    over_quota_weight: Mapped[int] = mapped_column(default=1)
    priority: Mapped[int] = mapped_column(default=0)
    approval_above_milli: Mapped[int | None] = mapped_column()
    preempt_min_runtime_s: Mapped[float] = mapped_column(Float, default=0.0)
    reclaim_min_runtime_s: Mapped[float] = mapped_column(Float, default=0.0)
    idle_reclaim_s: Mapped[float | None] = mapped_column(Float)
    max_disconnect_s: Mapped[int | None] = mapped_column()  # its jobs' unless they name their own
    #: jobs no node of the pool could hold wait (for capacity added on demand) instead of being refused
    hold_unsatisfiable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("project_id", "user_id", "idempotency_key", name="uq_jobs_idempotency"),
                      Index("ix_jobs_state", "state"), Index("uq_jobs_external_id", "external_id", unique=True))
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    seq: Mapped[int] = mapped_column(Integer, index=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    queue: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128), default="")
    spec: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(String(24))
    attempt: Mapped[int] = mapped_column(default=0)
    preemptions: Mapped[int] = mapped_column(default=0)
    priority: Mapped[int] = mapped_column(default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reason: Mapped[dict[str, Any] | None] = mapped_column()
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    exit_code: Mapped[int | None] = mapped_column()
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    #: a job that stands for something scheduled elsewhere: a Kubernetes pod's "k8s:" + uid (server/kube/records.py);
    #: None for jobs submitted to gpupool. The scheduler never reads such a job as pending work.
    external_id: Mapped[str | None] = mapped_column(String(64))


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="ready")
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    cpu_milli: Mapped[int] = mapped_column()
    memory_mib: Mapped[int] = mapped_column()
    site: Mapped[str] = mapped_column(String(64), default="")
    rack: Mapped[str] = mapped_column(String(64), default="")
    boot_id: Mapped[str] = mapped_column(String(64), default="")
    last_seen: Mapped[datetime | None] = mapped_column()
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: the agent found a container toolkit safe for any tenant's image (nvidia-ctk >= 1.17.8); only such nodes
    #: run jobs with an image
    untrusted_images: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: who the node's process jobs run as, as its agent says (protocol.agent.JobsAs)
    jobs_as: Mapped[str] = mapped_column(String(16), default="unknown", server_default="unknown")
    #: draining (services.draining): since when it takes no new work (it is cordoned too), when what still runs
    #: there is evicted (None: never, it ends on its own), and whether the node is removed once empty
    drain_since: Mapped[datetime | None] = mapped_column()
    drain_deadline: Mapped[datetime | None] = mapped_column()
    remove_when_drained: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: where other nodes reach it, as its agent says (gangs' MASTER_ADDR and hostfile); None: unsaid (its name)
    address: Mapped[str | None] = mapped_column(String(253))


class AgentCertificate(Base):
    """Every client certificate issued to an agent (gpupool.server.agent_ca). A channel is opened only with one
    listed here for the credential's node and not revoked: `revoked_at` is the denylist, checked on each connect."""

    __tablename__ = "agent_certificates"
    serial: Mapped[str] = mapped_column(String(40), primary_key=True)  # hex
    node_id: Mapped[str] = mapped_column(String(32), index=True)
    not_after: Mapped[datetime] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Gpu(Base):
    """One GPU slot of a node, by index; its id stays while allocations name it (history). A reset node's rows are
    retired (`retired_at`): out of service until the node joins again and reports a GPU at that index. A retired row
    gives its uuid up when another row takes that uuid (it then holds "retired:<its id>")."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    index: Mapped[int] = mapped_column()
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    model: Mapped[str] = mapped_column(String(64))
    memory_mib: Mapped[int] = mapped_column()
    fake: Mapped[bool] = mapped_column(Boolean, default=False)
    retired_at: Mapped[datetime | None] = mapped_column()


class Allocation(Base):
    __tablename__ = "allocations"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    task_index: Mapped[int] = mapped_column()
    attempt: Mapped[int] = mapped_column()
    #: None for a Kubernetes pod's allocation: its node is a Kubernetes Node, named in `node_name`
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    node_name: Mapped[str | None] = mapped_column(String(253))
    #: the GPU model of an allocation without a gpupool node (metering prices it; others' come from their Gpu rows)
    gpu_model: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    gpu_milli: Mapped[int] = mapped_column(default=0)
    cpu_milli: Mapped[int] = mapped_column(default=0)
    memory_mib: Mapped[int] = mapped_column(default=0)
    shares: Mapped[list[Any]] = mapped_column(default=list)
    leader_epoch: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    released_at: Mapped[datetime | None] = mapped_column()
    exit_code: Mapped[int | None] = mapped_column()
    release_reason: Mapped[str] = mapped_column(String(32), default="")
    #: the ledger holds this allocation's usage up to here (metering is idempotent per period)
    metered_until: Mapped[datetime | None] = mapped_column()
    #: task 0 of a gang: the MASTER_PORT its agent chose and reported; the other tasks are launched with it
    rendezvous_port: Mapped[int | None] = mapped_column()


class AllocationSlot(Base):
    """One tenth of one GPU held by an allocation (fractions are granted in 10 % steps)."""

    __tablename__ = "allocation_slots"
    __table_args__ = (Index("uq_open_gpu_slot", "gpu_id", "slot", unique=True,
                            sqlite_where=text("released_at IS NULL"), postgresql_where=text("released_at IS NULL")),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id"), index=True)
    gpu_id: Mapped[str] = mapped_column(ForeignKey("gpus.id"))
    slot: Mapped[int] = mapped_column()
    released_at: Mapped[datetime | None] = mapped_column()


class Lease(Base):
    """The scheduler lease: one holder at a time; `epoch` grows at every takeover (fencing token)."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(default=0)
    expires_at: Mapped[datetime] = mapped_column()


class PoolKey(Base):
    """The fingerprint of one key every control plane of the pool must hold (gpupool.server.pool_keys): `name` is
    master_key, agent_ca or order_key."""

    __tablename__ = "pool_keys"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(128))
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class Price(Base):
    """What one GPU-hour of a model costs, in cents (the unit of every amount in the ledger)."""

    __tablename__ = "prices"
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    cents_per_gpu_hour: Mapped[int] = mapped_column()


class ResourcePrice(Base):
    """What one hour of a CPU core ("cpu") or of a GiB of memory ("memory") costs, in cents."""

    __tablename__ = "resource_prices"
    resource: Mapped[str] = mapped_column(String(16), primary_key=True)
    cents_per_hour: Mapped[int] = mapped_column()


class UsageDaily(Base):
    """The ledger summed per UTC day (of each entry's start) and (organisation, project, user, queue, model, tags):
    derived, written in the same transaction as the ledger entries it sums, so reports over whole days read
    thousands of rows instead of millions. The ledger stays the record; `gpupool check` compares the two."""

    __tablename__ = "usage_daily"
    __table_args__ = (UniqueConstraint("day", "org_id", "project_id", "user_id", "queue", "model", "tags_key",
                                       name="uq_usage_daily_group"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    day: Mapped[datetime] = mapped_column(index=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    user_id: Mapped[str] = mapped_column(String(32))
    queue: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(64))
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    tags_key: Mapped[str] = mapped_column(String(512))
    gpu_milli_seconds: Mapped[int] = mapped_column(BigInteger)
    cpu_milli_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    memory_mib_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cost_micro_cents: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[int] = mapped_column()


class LedgerEntry(Base):
    """Append-only usage: one row per allocation and metering period, unique by `source_key`.

    `gpu_milli_seconds` is milli-GPU held x seconds (fractions count as they were granted), `cpu_milli_seconds` and
    `memory_mib_seconds` the same for the allocation's CPU and memory; `cost_micro_cents` is each times its price
    (the model's per GPU-hour, per CPU-core-hour, per GiB-hour), summed, in millionths of a cent, so sums stay exact
    integers.
    """

    __tablename__ = "ledger"
    __table_args__ = (Index("ix_ledger_period", "org_id", "start"), Index("ix_ledger_start", "start"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source_key: Mapped[str] = mapped_column(String(128), unique=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    user_id: Mapped[str] = mapped_column(String(32))
    queue: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    allocation_id: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(64))
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    start: Mapped[datetime] = mapped_column()
    end: Mapped[datetime] = mapped_column()
    gpu_milli: Mapped[int] = mapped_column()
    gpu_milli_seconds: Mapped[int] = mapped_column(BigInteger)
    cpu_milli: Mapped[int] = mapped_column(default=0, server_default="0")
    cpu_milli_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    memory_mib: Mapped[int] = mapped_column(default=0, server_default="0")
    memory_mib_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cost_micro_cents: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Budget(Base):
    """A GPU-hour or money budget per project or queue and period; a hard one stops admitting new jobs."""

    __tablename__ = "budgets"
    __table_args__ = (UniqueConstraint("org_id", "scope", "name"),)  # project names are per organisation
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    org_id: Mapped[str | None] = mapped_column(ForeignKey("orgs.id"))
    scope: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(64))
    period: Mapped[str] = mapped_column(String(8))
    gpu_hours: Mapped[float | None] = mapped_column(Float)
    cents: Mapped[int | None] = mapped_column()
    hard: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ClusterSample(Base):
    """Cluster figures sampled every minute, for the dashboard's charts."""

    __tablename__ = "cluster_samples"
    at: Mapped[datetime] = mapped_column(primary_key=True)
    gpus: Mapped[float] = mapped_column(Float)
    allocated: Mapped[float] = mapped_column(Float)
    used: Mapped[float] = mapped_column(Float)
    #: GPUs idle but held by a reservation for a waiting job (allocated + reserved over gpus is SOR)
    reserved: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    fragmented_nodes: Mapped[int] = mapped_column()
    gpu_nodes: Mapped[int] = mapped_column()


class AuditEntry(Base):
    """Append-only record of one mutating HTTP request with a verified identity, whatever its outcome, and of a
    bounded sample of those without one (RELIABILITY.md S10; gpupool.server.guard.AuditLog).

    The database refuses UPDATE, and DELETE of rows less than a day old (triggers from migrations 0003 and 0007):
    only the retention's pruning deletes, and only older rows. `request_id` is the server's own id of the request,
    `client_request_id` the client's `X-Request-ID` (unchecked, kept apart). `route` is the route's template
    (`/api/v1/jobs/{job_id}/cancel`), or the raw path when no route matched; `object_id` is the path's id or the id
    of what the request created; `actor_kind` is user, node, join (an agent registering with a join token that
    verified) or anonymous (no verified credential).
    """

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_org", "org_id", "id"), Index("ix_audit_at", "at"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    request_id: Mapped[str] = mapped_column(String(64))
    client_request_id: Mapped[str] = mapped_column(String(64), default="", server_default="")
    actor_kind: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(64), default="")
    actor_name: Mapped[str] = mapped_column(String(128), default="")
    token_prefix: Mapped[str] = mapped_column(String(16), default="")
    org_id: Mapped[str | None] = mapped_column(String(32))
    method: Mapped[str] = mapped_column(String(8))
    route: Mapped[str] = mapped_column(String(256))
    object_id: Mapped[str] = mapped_column(String(128), default="")
    status: Mapped[int] = mapped_column()
    source: Mapped[str] = mapped_column(String(64), default="")


class OrgKey(Base):
    """An organisation's data key, wrapped (AES-256-GCM) by the master key whose id is `master_key_id`; the
    master key itself lives in a file outside the database (RELIABILITY.md S9)."""

    __tablename__ = "org_keys"
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), primary_key=True)
    master_key_id: Mapped[str] = mapped_column(String(32))
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    rewrapped_at: Mapped[datetime | None] = mapped_column()


class JobSecret(Base):
    """A job's secret environment, sealed with its organisation's data key (the names are in the job's spec)."""

    __tablename__ = "job_secrets"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
