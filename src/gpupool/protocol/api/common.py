"""What every API model shares: the request and response bases (unknown request fields are refused),
names, roles, job states, times, tags and GPU amounts."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

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
