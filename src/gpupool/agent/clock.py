"""The agent's clocks: monotonic for timers (heartbeats, fencing, grace periods), wall for order expiry.

Order expiry is judged on the control plane's clock, which set `expires_at`: `ServerClock` is this host's wall clock
corrected by the offset seen in the `Date` header of each channel handshake (RELIABILITY.md T4: an agent whose clock
is minutes off must still accept fresh orders and refuse stale ones).

Both follow the `now() -> float` protocol of `gpupool.agent.devices.base.Clock`, so tests inject a fixed or manual
clock wherever timing matters.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

from gpupool.agent.devices.base import Clock, MonotonicClock


class WallClock:
    """Seconds since the Unix epoch: what the control plane's `expires_at` and `started_at` are measured in.
    `skew_s` shifts it (tests of clock skew: GPUPOOL_TEST_CLOCK_SKEW_S)."""

    def __init__(self, skew_s: float = 0.0) -> None:
        self.skew_s = skew_s

    def now(self) -> float:
        return time.time() + self.skew_s  # noqa: TID251 - launch orders expire at an instant set by the control plane


class ServerClock:
    """The control plane's wall clock as this agent estimates it: `local` plus the offset of the latest `sync`.

    Contract: before any `sync` it is `local` unchanged. `sync(date_header)` takes an HTTP `Date` value (whole
    seconds, rounded down by the server) and sets the offset so that `now()` never runs behind the server's
    clock: it reads up to about one second (plus the handshake's latency) ahead, so an order is refused at most
    that early and never accepted after it expired. An unparseable header changes nothing.
    """

    def __init__(self, local: Clock) -> None:
        self._local = local
        self.offset_s = 0.0

    def now(self) -> float:
        return self._local.now() + self.offset_s

    def sync(self, date_header: str | None) -> None:
        if not date_header:
            return
        try:
            server = parsedate_to_datetime(date_header).timestamp()
        except (TypeError, ValueError, IndexError):
            return
        self.offset_s = server + 1.0 - self._local.now()


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


__all__ = ["Clock", "ManualClock", "MonotonicClock", "ServerClock", "WallClock"]
