"""Time as a parameter: the core never reads the wall clock.

The server passes a real clock, the simulator a `SimClock` advanced by its event engine, and tests
a `FixedClock`. `now()` is seconds in the clock's own epoch.
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class FixedClock:
    """A clock that reads `at` until `advance` moves it."""

    def __init__(self, at: float = 0.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += seconds
