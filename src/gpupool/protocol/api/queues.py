"""Queues: their quotas, policies and changes."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from gpupool.protocol.api.common import NAME, Resources, UtcTime, _Request, _Response, gpus_to_milli


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
