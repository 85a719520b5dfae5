"""Pure timing logic of the agent channel: reconnect backoff, heartbeat jitter and the self-fence timer.

Nothing here sleeps or reads a global clock: the caller injects a `Clock` and a `random.Random`, so every rule is
testable step by step (RELIABILITY.md §2.2 gives the defaults).
"""

from __future__ import annotations

import random

from gpupool.agent.clock import Clock

DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_FENCE_S = 40.0
DEFAULT_KILL_GRACE_S = 10.0
HEARTBEAT_JITTER = 0.2


class Backoff:
    """Exponential backoff with full jitter: the n-th delay (n = 0, 1, ...) is uniform in [0, min(cap, base * 2^n)].

    `reset()` after a connection that worked starts again from n = 0.
    """

    def __init__(self, rng: random.Random, *, base_s: float = 0.5, cap_s: float = 30.0) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("need 0 < base_s <= cap_s")
        self._rng = rng
        self._base_s = base_s
        self._cap_s = cap_s
        self._attempt = 0

    @property
    def attempt(self) -> int:
        """How many delays were handed out since the last reset."""
        return self._attempt

    def ceiling(self) -> float:
        """The upper bound of the next delay."""
        return min(self._cap_s, self._base_s * 2.0 ** min(self._attempt, 64))

    def next_delay(self) -> float:
        """The next delay in seconds (advances the attempt counter)."""
        delay = self._rng.uniform(0.0, self.ceiling())
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0


def reconnect_cap_s(fence_s: float, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """The reconnect backoff's cap for a node that fences after `fence_s`: 3/4 of F, at most `cap_s` (30 s with the
    default F of 40 s) and at least `base_s`. After a control-plane restart every node has a fresh grace G > F to
    come back before it can be declared lost (RELIABILITY.md §2.2, G >= 4H + reconnect); a fixed 30 s cap would
    outlast G whenever the timings are scaled down."""
    return max(base_s, min(cap_s, 0.75 * fence_s))


def reconnect_delay(backoff: Backoff, time_left_s: float | None, heartbeat_s: float, rng: random.Random) -> float:
    """The wait before the next connection attempt: the backoff's next delay, but while some workload still runs
    (`time_left_s`: seconds until the next one is fenced; None when none runs) at most one jittered heartbeat, and at
    most half the time left (not below a tenth of a heartbeat). Until a workload's max_disconnect passes it runs, and
    a partition shorter than that must end in a reconnect before it does: a 0.5 G partition (RELIABILITY.md T2.a)
    leaves little time, which a backoff delay of up to 3/4 F overshot in 8 runs of 20 (scaled timings). With nothing
    running, the backoff spares the control plane (many agents reconnecting after it restarted)."""
    delay = backoff.next_delay()
    if time_left_s is None:
        return delay
    return min(delay, jittered(heartbeat_s, rng), max(time_left_s / 2, heartbeat_s / 10))


def jittered(interval_s: float, rng: random.Random, jitter: float = HEARTBEAT_JITTER) -> float:
    """`interval_s` scaled by a uniform factor in [1 - jitter, 1 + jitter] (heartbeats: ±20 %)."""
    return interval_s * rng.uniform(1.0 - jitter, 1.0 + jitter)


class Silence:
    """How long the control plane has been silent: `heard()` records any server frame; the count starts at
    construction, so an agent that never reaches a control plane counts its silence too. Each workload is fenced when
    this reaches its max_disconnect (Workloads.fence)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last_heard = clock.now()

    def heard(self) -> None:
        """A server frame arrived: the silence starts again from zero."""
        self._last_heard = self._clock.now()

    def silence_s(self) -> float:
        return self._clock.now() - self._last_heard
