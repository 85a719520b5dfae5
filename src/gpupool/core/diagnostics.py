"""Why a job is still pending: one structured, bounded, serialisable reason per job per cycle."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class PendingKind(StrEnum):
    NO_NODE_FITS = "no_node_fits"
    GANG_INCOMPLETE = "gang_incomplete"
    OVER_QUOTA = "over_quota"
    RESERVED_FOR = "reserved_for"
    LOWER_PRIORITY = "lower_priority"
    BACKFILL_WINDOW = "backfill_window"
    BUDGET_EXHAUSTED = "budget_exhausted"
    INVALID_REQUEST = "invalid_request"


MAX_DETAILS = 5


def iso_utc(t: float) -> str:
    """Seconds since the epoch as an ISO 8601 UTC time to the second ("2026-12-06T10:00:00Z"): how messages give
    times (a reader adds how far away it is when reading: the message is written once per change)."""
    return datetime.fromtimestamp(round(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class PendingReason:
    """`details` are (phrase, count) pairs, at most MAX_DETAILS, most common first. `at` is the time the message
    names (in it as `iso_utc(at)`), `holder` the job or queue that holds what the job needs ("" when none does)."""

    kind: PendingKind
    message: str
    details: tuple[tuple[str, int], ...] = ()
    at: float | None = None
    holder: str = ""

    def __post_init__(self) -> None:
        if len(self.details) > MAX_DETAILS:
            object.__setattr__(self, "details", self.details[:MAX_DETAILS])

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind.value, "message": self.message,
                                  "details": [{"reason": r, "nodes": n} for r, n in self.details]}
        if self.at is not None:
            out["at"] = self.at
        if self.holder:
            out["holder"] = self.holder
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> PendingReason:
        details = data.get("details") or []
        assert isinstance(details, list)
        at = data.get("at")
        return cls(PendingKind(str(data["kind"])), str(data["message"]),
                   tuple((str(d["reason"]), int(d["nodes"])) for d in details),
                   float(at) if isinstance(at, int | float) else None, str(data.get("holder") or ""))


def no_node_fits(total_nodes: int, reasons: list[tuple[str, int]], task_index: int, tasks: int) -> PendingReason:
    what = f"task {task_index + 1} of {tasks}" if tasks > 1 else "the task"
    summary = ", ".join(f"{n} {r}" for r, n in reasons)
    return PendingReason(PendingKind.NO_NODE_FITS,
                         f"0/{total_nodes} nodes can take {what}: {summary or 'no nodes'}", tuple(reasons))
