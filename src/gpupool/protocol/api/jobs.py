"""Jobs: submission, pages, their allocations, events, pending reasons and approval decisions."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from gpupool.protocol import launch
from gpupool.protocol.api.common import TagKey, TagValue, UtcTime, _Request, _Response, gpus_to_milli
from gpupool.protocol.api.images import _secret_value, image_registry


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
