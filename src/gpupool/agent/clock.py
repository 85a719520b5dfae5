"""The agent's two clocks: monotonic for timers (heartbeats, fencing, grace periods), wall for order expiry.

Both follow the `now() -> float` protocol of `gpupool.agent.devices.base.Clock`, so tests inject a fixed or manual
clock wherever timing matters.
"""

from __future__ import annotations

import time

from gpupool.agent.devices.base import Clock, MonotonicClock


class WallClock:
    """Seconds since the Unix epoch: what the control plane's `expires_at` and `started_at` are measured in."""

    def now(self) -> float:
        return time.time()  # noqa: TID251 - launch orders expire at a wall-clock instant set by the control plane


class ManualClock:
    """A clock that moves only when told (`advance`, `set`): for tests of timers and expiry."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move forward by `seconds` (must be >= 0)."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds

    def set(self, now: float) -> None:
        self._now = now


__all__ = ["Clock", "ManualClock", "MonotonicClock", "WallClock"]
