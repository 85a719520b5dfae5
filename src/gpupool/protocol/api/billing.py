"""Usage, prices, budgets and cluster samples."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from gpupool.protocol.api.common import NAME, UtcTime, _Request, _Response


class UsageRow(_Response):
    project: str
    user: str
    node: str
    job: str
    gpus: float
    gpu_models: list[str]
    since: UtcTime | None


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
