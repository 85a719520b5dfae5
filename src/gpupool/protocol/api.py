"""Public HTTP API models, version 1 (`/api/v1`), shared by the control plane, the CLI and the dashboard.

Requests forbid unknown fields, so a misspelt field is a 422 that names it, never silently ignored.
GPU amounts are decimal strings in 10 % steps ("0.5", "1", "8"); they become milli-GPU at the edge.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from gpupool.protocol import launch

API_VERSION = "v1"
ROLES = ("viewer", "member", "project-admin", "tenant-admin", "operator")
Role = Literal["viewer", "member", "project-admin", "tenant-admin", "operator"]
NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
JOB_STATES = ("pending_approval", "pending", "scheduled", "running", "succeeded", "failed", "cancelled", "denied")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "denied"})
#: a prefix of an object id (ids are uuid4 hex): what `?id_prefix=` takes
ID_PREFIX = r"^[0-9a-f]{1,32}$"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _as_utc(moment: datetime) -> datetime:
    """A time as RFC 3339 requires it, with its offset: a database that keeps none (SQLite) holds UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


#: a job tag's key, as a Kubernetes label key is (`cost-centre`, `team.vision/owner`); its value, any short text
TAG_KEY = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
TagKey = Annotated[str, Field(pattern=TAG_KEY)]
TagValue = Annotated[str, Field(max_length=256)]
TAG_FILTER = TAG_KEY[:-1] + "=.{0,256}$"  # KEY=VALUE

#: every time the API answers with
UtcTime = Annotated[datetime, AfterValidator(_as_utc)]


def gpus_to_milli(value: str | int | float) -> int:
    """"0.5" -> 500. Fractions of one GPU must be 10 % steps; more than one GPU must be whole."""
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a number of GPUs") from None
    if not amount.is_finite() or amount < 0 or amount > 64:
        raise ValueError("must be between 0 and 64")
    milli = amount * 1000
    if amount > 1 and amount != amount.to_integral_value():
        raise ValueError("more than one GPU must be a whole number")
    if milli % 100:
        raise ValueError("fractions of a GPU go in 10 % steps (0.1, 0.2, ... 0.9)")
    return int(milli)


MAX_AMOUNT = Decimal(10) ** 9  # of GPUs or CPUs in one quota: beyond any cluster, and cheap to turn into milli


def _amount(value: str) -> str:
    """A quota amount: a finite decimal in [0, MAX_AMOUNT] ("Infinity" or "1e999999" would overflow later)."""
    try:
        amount = Decimal(value)
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite() or not 0 <= amount <= MAX_AMOUNT:
        raise ValueError(f"{value!r} is not a number between 0 and {MAX_AMOUNT}")
    return value


class Resources(_Request):
    gpus: str | None = None
    cpus: str | None = None
    memory_mib: int | None = Field(default=None, ge=0)
    per_model: dict[str, str] = Field(default_factory=dict, description="GPUs of one model, e.g. {'H100': '8'}")

    @field_validator("gpus", "cpus")
    @classmethod
    def _decimal(cls, value: str | None) -> str | None:
        return None if value is None else _amount(value)

    @field_validator("per_model")
    @classmethod
    def _per_model(cls, value: dict[str, str]) -> dict[str, str]:
        for gpus in value.values():
            _amount(gpus)
        return value


class OrgCreate(_Request):
    name: str = Field(pattern=NAME)


class OrgOut(_Response):
    id: str
    name: str


class OrgCeiling(_Request):
    """What an organisation's tenant admins may grant its queues; operators set it, and only operators grant beyond
    it. Its top-level queues (those whose parent is not a queue of its own) share the cluster with other
    organisations: their guarantees and over-quota weights add up under the ceiling. The defaults are a new
    organisation's ceiling: no guarantee, any limit, over-quota weight 1, priority at most 0."""

    guaranteed: Resources = Field(default_factory=Resources, description=(
        "the most its top-level queues guarantee together (and any one of its queues)"))
    limit: Resources | None = Field(default=None, description=(
        "every queue's limit must set each of these resources, at most to these amounts; null: no cap"))
    over_quota_weight: int = Field(default=1, ge=0, le=1000, description=(
        "the most its top-level queues' over-quota weights add up to (and any one queue's)"))
    max_priority: int = Field(default=0, ge=-1000, le=1000, description="the highest priority of any of its queues")


class OrgCeilingOut(_Response):
    org: str
    guaranteed: dict[str, Any]
    limit: dict[str, Any] | None
    over_quota_weight: int
    max_priority: int
    granted_guaranteed: dict[str, Any] = Field(description="what its top-level queues guarantee together now")
    granted_over_quota_weight: int = Field(description="their over-quota weights added up")


class ProjectCreate(_Request):
    name: str = Field(pattern=NAME)
    org: str | None = Field(default=None, description="organisation name (operators only)")
    cost_centre: str = Field(default="", max_length=64)


class ProjectOut(_Response):
    id: str
    name: str
    org: str
    cost_centre: str


class UserCreate(_Request):
    name: str = Field(pattern=NAME)
    role: Role = "member"
    projects: list[str] = Field(default_factory=list, max_length=64)
    org: str | None = None


class UserOut(_Response):
    id: str
    name: str
    org: str
    role: Role
    projects: list[str]


class TokenCreate(_Request):
    name: str = Field(default="", max_length=64)
    user: str | None = Field(default=None, description="user name in your organisation (admins only)")
    org: str | None = Field(default=None, description="organisation of `user` (operators only)")
    ttl_s: int | None = Field(default=None, ge=60, le=366 * 86400)


class TokenOut(_Response):
    id: str
    prefix: str
    name: str
    user: str | None
    expires_at: UtcTime | None
    revoked_at: UtcTime | None
    token: str | None = Field(default=None, description="the secret, shown once at creation")


class JoinTokenCreate(_Request):
    ttl_s: int = Field(default=3600, ge=60, le=86400)


class JoinTokenOut(_Response):
    token: str
    expires_at: UtcTime
    ca_hash: str = Field(default="", description="sha256 of the agent CA's public key: `gpupool agent --ca-hash`")


class QueueCreate(_Request):
    name: str = Field(pattern=NAME)
    parent: str | None = None
    org: str | None = None
    guaranteed: Resources = Field(default_factory=Resources)
    limit: Resources | None = None
    borrow_limit: Resources | None = None
    lend_limit: Resources | None = None
    over_quota_weight: int = Field(default=1, ge=0, le=1000)
    priority: int = Field(default=0, ge=-1000, le=1000)
    approval_above_gpus: str | None = Field(default=None, description="jobs asking more need a project admin")
    preempt_min_runtime_s: float = Field(default=0, ge=0)
    reclaim_min_runtime_s: float = Field(default=0, ge=0)
    idle_reclaim_s: float | None = Field(default=None, gt=0)
    max_disconnect_s: int | None = Field(default=None, ge=1, le=7 * 86400, description=(
        "its jobs' max_disconnect unless a job names its own (never above the pool's): how long their tasks keep "
        "running on a node that hears from no control plane"))
    hold_unsatisfiable: bool = Field(default=False, description=(
        "let its jobs that no node of the pool could hold, even empty, wait (for capacity added on demand) instead "
        "of refusing them at submission"))

    @field_validator("approval_above_gpus")
    @classmethod
    def _threshold(cls, value: str | None) -> str | None:
        if value is not None:
            gpus_to_milli(value)
        return value


class QueueOut(_Response):
    name: str
    parent: str | None
    org: str | None
    guaranteed: dict[str, Any]
    limit: dict[str, Any] | None
    over_quota_weight: int
    priority: int
    max_disconnect_s: int | None = None
    hold_unsatisfiable: bool = False
    used_gpus: float = 0
    fair_share_gpus: float = 0
    pending_jobs: int = 0
    running_jobs: int = 0
    oldest_pending_at: UtcTime | None = Field(default=None, description="when its longest-waiting pending job was "
                                                                       "submitted; none when nothing is pending")
    warnings: list[str] = Field(default_factory=list, description=(
        "what the change left questionable (a guarantee above the pool's capacity, when the setting "
        "quota_above_capacity is warn)"))


class QueueUpdate(_Request):
    """The parts of a queue to change; a part left out stays. `limit`, `borrow_limit`, `lend_limit`,
    `approval_above_gpus` and `max_disconnect_s` given as null are removed."""

    guaranteed: Resources | None = None
    limit: Resources | None = None
    borrow_limit: Resources | None = None
    lend_limit: Resources | None = None
    over_quota_weight: int | None = Field(default=None, ge=0, le=1000)
    priority: int | None = Field(default=None, ge=-1000, le=1000)
    approval_above_gpus: str | None = None
    max_disconnect_s: int | None = Field(default=None, ge=1, le=7 * 86400)
    hold_unsatisfiable: bool | None = None

    @field_validator("approval_above_gpus")
    @classmethod
    def _threshold(cls, value: str | None) -> str | None:
        if value is not None:
            gpus_to_milli(value)
        return value


class QueueChange(_Response):
    """What a queue update or deletion did, or (dry_run) would do."""

    queue: QueueOut
    dry_run: bool
    changes: list[str] = Field(description="each changed field: `field: before -> after`")
    warnings: list[str] = Field(default_factory=list)
    jobs_moved: list[str] = Field(default_factory=list, description="ids of the jobs moved to another queue")


# Image references (OCI distribution's grammar, as podman and docker read them) ---------------------------------

_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:.]+\])"
_REMOTE = re.compile(rf"(?P<path>{_PATH}(?:/{_PATH})*)(?::[\w][\w.-]{{0,127}})?"
                     r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?", re.ASCII)
_REGISTRY = re.compile(rf"{_DOMAIN}(?::[0-9]{{1,5}})?", re.ASCII)
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+", re.IGNORECASE)
MAX_IMAGE_NAME = 255
#: registry host names that always mean this machine or a cloud's metadata service
LOCAL_HOSTS = ("localhost", "metadata.google.internal")


def image_registry(reference: str) -> str:
    """The registry ("host" or "host:port", "" for the default registry) of a well-formed image reference;
    ValueError naming what is wrong otherwise. The first path component is a registry when it has a dot or a
    colon or is "localhost" (docker's rule)."""
    first, slash, rest = reference.partition("/")
    has_registry = bool(slash) and (any(c in first for c in ".:[") or first == "localhost")
    registry, remote = (first, rest) if has_registry else ("", reference)
    if registry and not _REGISTRY.fullmatch(registry):
        raise ValueError(f"{registry!r} is not a registry host[:port]")
    match = _REMOTE.fullmatch(remote)
    if match is None or len(registry) + 1 + len(match["path"]) > MAX_IMAGE_NAME:
        raise ValueError("not an image reference: [registry[:port]/]path[:tag][@digest], lower case path "
                         f"components, at most {MAX_IMAGE_NAME} characters of name")
    return registry


def registry_allow(setting: str) -> frozenset[str]:
    """The hosts of a comma-separated allow list ("host" or "host:port" each), lower-cased."""
    return frozenset(entry.strip().lower() for entry in setting.split(",") if entry.strip())


def registry_problem(reference: str, allowed: Collection[str]) -> str | None:
    """Why a well-formed image `reference` may not be pulled, or None: see `_host_problem`; a registry ("host:port")
    or host in `allowed` may always be pulled from."""
    registry = image_registry(reference).lower()
    host = registry[: registry.index("]") + 1] if registry.startswith("[") else registry.partition(":")[0]
    if not registry or registry in allowed or host in allowed:
        return None
    problem = _host_problem(host.strip("[]"))
    return problem and f"registry host {host!r} is {problem}; an operator may allow it with GPUPOOL_REGISTRY_ALLOW"


def _host_problem(host: str) -> str | None:
    """What makes `host` a registry not to pull from unasked: a loopback, private, link-local (cloud metadata) or
    otherwise non-global address; a numeric host that is not a plain address (resolvers read "0177.1" or
    "2130706433" as one); a name of this machine or of a metadata service. None for anything else."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if all(_NUMERIC_LABEL.fullmatch(label) for label in host.split(".")):
            return "a numeric host that is not a plain address"
        if host in LOCAL_HOSTS or host.endswith(".localhost"):
            return "this machine or a metadata service"
        return None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return None if (mapped or address).is_global else "a loopback, private, link-local or metadata address"


MAX_SECRET_CHARS = 16_384


def _secret_value(secret: str) -> str:
    """A secret variable's value: what a process may be given (protocol.launch), at most MAX_SECRET_CHARS."""
    if len(secret) > MAX_SECRET_CHARS:
        raise ValueError(f"must be at most {MAX_SECRET_CHARS} characters")
    return launch.process_text(secret)


class JobCreate(_Request):
    """A job. Every string that reaches its processes (command, env, secret_env, workdir, image) follows
    gpupool.protocol.launch; a bad one answers 422 naming it (`command[2]` is loc ["body", "command", 2], a bad
    variable name ["body", "env", NAME, "[key]"], its value ["body", "env", NAME]); secret values are never quoted."""

    command: list[launch.Arg] = Field(min_length=1, max_length=launch.MAX_ARGS)
    name: str = Field(default="", max_length=128)
    project: str | None = None
    queue: str | None = None
    image: str | None = Field(default=None, max_length=512, description=(
        "an OCI image reference; its registry must not be a private, loopback or link-local address unless the "
        "operator allows it (GPUPOOL_REGISTRY_ALLOW)"))
    env: dict[launch.JobEnvName, launch.EnvValue] = Field(default_factory=dict, max_length=128)
    workdir: launch.Workdir | None = Field(default=None, max_length=launch.MAX_WORKDIR)
    tasks: int = Field(default=1, ge=1, le=256, description="gang size")
    min_tasks: int | None = Field(default=None, ge=1, le=256)
    gpus: str = Field(default="1", description="GPUs per task: a 10 % step below one, or a whole number")
    gpu_memory_mib: int = Field(default=0, ge=0, le=1 << 20)
    gpu_models: list[str] = Field(default_factory=list, max_length=16)
    cpus: str = Field(default="1")
    memory_mib: int = Field(default=1024, ge=0, le=1 << 24)
    priority: int = Field(default=0, ge=-1000, le=1000)
    preemptible: bool = True
    runtime_limit_s: int | None = Field(default=None, ge=1, le=366 * 86400)
    max_disconnect_s: int | None = Field(default=None, ge=1, le=7 * 86400, description=(
        "how long the job's tasks keep running on a node that hears from no control plane before they are stopped "
        "and the job requeued elsewhere; at most the pool's max_disconnect (default: the queue's, else the pool's)"))
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=32)
    secret_env: dict[launch.JobEnvName, Annotated[str, AfterValidator(_secret_value)]] = Field(
        default_factory=dict, max_length=64,
        description="environment variables stored encrypted and given only to the job's tasks; never shown again")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: str) -> str:
        gpus_to_milli(value)
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None:
            image_registry(value)
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: str) -> str:
        try:
            amount = Decimal(value)
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a number of CPUs") from None
        if not amount.is_finite() or amount < 0 or amount > 4096 or (amount * 1000) % 1:
            raise ValueError("must be between 0 and 4096 in steps of 0.001")
        return value

    @model_validator(mode="after")
    def _fits_a_launch_order(self) -> JobCreate:
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"secret_env: {', '.join(both)} also in env; set each variable in one of them")
        launch.fits_a_frame([*self.command, self.workdir or "", self.image or ""], self.env, self.secret_env)
        return self


class PendingReasonOut(_Response):
    kind: str
    message: str = Field(description="in the scheduler's words; a time in it is ISO 8601 UTC followed by how far "
                                     "from now it is (\"2026-12-06T10:00:00Z, in 3 min\")")
    details: list[dict[str, Any]] = Field(default_factory=list)
    at: UtcTime | None = Field(default=None, description="the time the message names (a reservation's start)")
    holder: str | None = Field(default=None, description="the job or queue that holds what the job needs")


class AllocationOut(_Response):
    id: str
    task_index: int
    attempt: int
    node: str
    state: str
    gpus: list[dict[str, Any]]
    started_at: UtcTime | None
    released_at: UtcTime | None
    exit_code: int | None


class JobOut(_Response):
    id: str
    name: str
    project: str
    user: str
    queue: str
    state: str
    attempt: int
    preemptions: int
    priority: int
    gpus: str
    tasks: int
    command: list[str]
    tags: dict[str, str]
    submitted_at: UtcTime
    started_at: UtcTime | None
    finished_at: UtcTime | None
    exit_code: int | None
    reason: PendingReasonOut | None = None
    allocations: list[AllocationOut] = Field(default_factory=list)
    secret_env: list[str] = Field(default_factory=list, description="names of the job's secret variables")


class JobPage(_Response):
    items: list[JobOut]
    next_cursor: str | None = None


class EventOut(_Response):
    at: UtcTime
    kind: str
    message: str


class Decision(_Request):
    note: str = Field(default="", max_length=500)


class GpuOut(_Response):
    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated_milli: int
    utilization_pct: int | None = None
    temperature_c: int | None = None
    fake: bool = False


class NodeOut(_Response):
    name: str
    state: str
    cordoned: bool
    cpu_milli: int
    memory_mib: int
    site: str
    gpus: list[GpuOut]
    last_seen: UtcTime | None
    untrusted_images: bool = Field(default=False, description="runs jobs with an image (its agent found a "
                                                               "container toolkit safe for any tenant's image)")
    jobs_as: str = Field(default="unknown", description="who its process jobs run as: dynamic-uid (a transient uid "
                                                        "per job), local-user, agent-user (the agent's own, not "
                                                        "root), root, or unknown (an agent that does not say)")
    drain_since: UtcTime | None = Field(default=None, description="draining since then: it takes no new work")
    drain_deadline: UtcTime | None = Field(default=None, description="when work still running on the draining "
                                                                     "node is evicted (None: it ends on its own)")
    removing: bool = Field(default=False, description="removed once its evicted work has stopped")
    tasks: int = Field(default=0, description="tasks open there (starting, running or stopping)")


class DrainRequest(_Request):
    deadline_s: int | None = Field(default=None, ge=0, le=366 * 86400, description=(
        "seconds from now after which work still running there is stopped (with the pool's kill grace) and "
        "requeued; none: it ends on its own"))
    dry_run: bool = Field(default=False, description="say what would be evicted; change nothing")


class NodeWork(_Response):
    job: str
    task_index: int
    project: str
    user: str
    state: str = Field(description="the allocation's state: starting, running or stopping")


class NodeActionOut(_Response):
    """What `drain`, `undrain` or `remove` did on a node (with dry_run: would do)."""

    node: str
    action: Literal["drain", "undrain", "remove"]
    dry_run: bool
    deadline: UtcTime | None = None
    work: list[NodeWork] = Field(description="what runs there: evicted at the deadline (drain), requeued now "
                                             "(remove with force)")
    message: str


class UsageRow(_Response):
    project: str
    user: str
    node: str
    job: str
    gpus: float
    gpu_models: list[str]
    since: UtcTime | None


class Whoami(_Response):
    user: str | None
    org: str | None
    role: str
    projects: list[str]


class PriceSet(_Request):
    model: str = Field(min_length=1, max_length=64)
    cents_per_gpu_hour: int = Field(ge=0, le=10_000_000)


MAX_BUDGET_GPU_HOURS = 1e9  # in one period: beyond any cluster
MAX_BUDGET_CENTS = (1 << 31) - 1  # the database's integer column


class ResourcePriceSet(_Request):
    resource: Literal["cpu", "memory"] = Field(description="cpu: per CPU-core-hour; memory: per GiB-hour")
    cents_per_hour: int = Field(ge=0, le=10_000_000)


class BudgetCreate(_Request):
    """A budget of GPU-hours or cents per period: a finite amount above 0 and within the bounds above (JSON's `1e999`
    arrives as infinity, which would be a budget never used up)."""

    scope: Literal["project", "queue"]
    name: str = Field(pattern=NAME)
    period: Literal["day", "week", "month"] = "month"
    gpu_hours: float | None = Field(default=None, gt=0, le=MAX_BUDGET_GPU_HOURS, allow_inf_nan=False)
    cents: int | None = Field(default=None, gt=0, le=MAX_BUDGET_CENTS)
    hard: bool = False


# Months and dates of usage reports: years a ledger can hold, whose neighbours datetime can still reach ----------

FIRST_YEAR, LAST_YEAR = 2000, 2199


def _year(year: int) -> None:
    if not FIRST_YEAR <= year <= LAST_YEAR:
        raise ValueError(f"the year must be from {FIRST_YEAR} to {LAST_YEAR}")


def _month(value: str) -> str:
    """A month "YYYY-MM" with a year from FIRST_YEAR to LAST_YEAR."""
    if not re.fullmatch(r"\d{4}-\d{2}", value, re.ASCII) or not 1 <= int(value[5:]) <= 12:
        raise ValueError("use YYYY-MM, e.g. 2026-11")
    _year(int(value[:4]))
    return value


def _moment(value: str) -> str:
    """An ISO date or date and time ("2026-11-01", "2026-11-01T12:00") with a year from FIRST_YEAR to LAST_YEAR."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("use an ISO date like 2026-11-01 or 2026-11-01T12:00") from None
    _year(moment.year)
    return value


Month = Annotated[str, AfterValidator(_month)]
Moment = Annotated[str, AfterValidator(_moment)]


class BudgetUpdate(_Request):
    """The parts of a budget to change; a part left out stays. Setting gpu_hours drops cents and the other way
    round (a budget counts one of them)."""

    period: Literal["day", "week", "month"] | None = None
    gpu_hours: float | None = Field(default=None, gt=0, le=MAX_BUDGET_GPU_HOURS, allow_inf_nan=False)
    cents: int | None = Field(default=None, gt=0, le=MAX_BUDGET_CENTS)
    hard: bool | None = None

    @model_validator(mode="after")
    def _one_amount(self) -> BudgetUpdate:
        if self.gpu_hours is not None and self.cents is not None:
            raise ValueError("gpu_hours, cents: set at most one of them")
        return self


class BudgetOut(_Response):
    id: str
    scope: str
    name: str
    period: str
    gpu_hours: float | None
    cents: int | None
    hard: bool
    used_gpu_hours: float
    used_cents: float
    exceeded: bool
    currency: str = Field(default="USD", description="the currency of cents (setting `currency`)")
    period_start: UtcTime | None = Field(default=None, description="the current period's start (UTC)")
    period_end: UtcTime | None = Field(default=None, description="the current period's end, when the budget renews")


class BudgetChange(_Response):
    """What a budget update or deletion did, or (dry_run) would do."""

    budget: BudgetOut
    dry_run: bool
    changes: list[str]


class UsageOut(_Response):
    key: str
    gpu_hours: float
    cpu_hours: float = Field(default=0, description="CPU-core-hours")
    memory_gib_hours: float = 0
    cost: float
    entries: int
    currency: str = Field(default="USD", description="the currency of cost (setting `currency`)")


class SampleOut(_Response):
    at: UtcTime
    gpus: float
    allocated: float
    used: float
    reserved: float = Field(default=0.0, description="GPUs idle but held by a reservation for a waiting job")
    gar: float
    gfr: float
    sor: float = Field(default=0.0, description="scheduling occupancy: GPUs allocated or held for a waiting job, "
                                                "over all GPUs (ALGORITHMS.md 1.2; at or above gar)")


class AuditOut(_Response):
    id: int
    at: UtcTime
    request_id: str
    client_request_id: str = Field(default="", description="the client's X-Request-ID, as it sent it")
    actor_kind: str
    actor: str
    actor_name: str
    token_prefix: str
    org: str | None
    method: str
    route: str
    object_id: str
    status: int
    source: str


class AuditPage(_Response):
    items: list[AuditOut]
    next_cursor: str | None = None
