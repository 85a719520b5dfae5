"""The reconnect delay (gpupool.agent.timing.reconnect_delay): the backoff, held to about one heartbeat while the
self-fence has not fired, so that a partition shorter than F ends in a reconnect before the fence (RELIABILITY.md
T2.a; end to end in tests/reliability/test_partitions.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.clock import ManualClock
from gpupool.agent.timing import HEARTBEAT_JITTER, Backoff, FenceTimer, reconnect_cap_s, reconnect_delay

H, F = 0.25, 2.0


class MaxRng(random.Random):
    """uniform(a, b) always returns b: every delay at its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_until_the_fence_fires_retries_come_at_least_every_heartbeat_then_the_backoff_takes_over():
    clock = ManualClock(0.0)
    fence, backoff = FenceTimer(F, clock), Backoff(MaxRng(), cap_s=reconnect_cap_s(F))
    before = [reconnect_delay(backoff, fence, H, MaxRng()) for _ in range(6)]
    assert before == [H * (1 + HEARTBEAT_JITTER)] * 6  # the backoff alone: 0.5, 1, 1.5, 1.5 ...
    clock.advance(F - 0.2)  # closer to the fence: half the time left, but not below a tenth of a heartbeat
    assert reconnect_delay(backoff, fence, H, MaxRng()) == pytest.approx(0.1)
    clock.advance(0.19)
    assert reconnect_delay(backoff, fence, H, MaxRng()) == pytest.approx(H / 10)
    clock.advance(0.01)
    assert fence.should_fence()
    assert [reconnect_delay(backoff, fence, H, MaxRng()) for _ in range(2)] == [reconnect_cap_s(F)] * 2
    fence.heard()  # back, and silent again: short retries until the next fence
    assert reconnect_delay(backoff, fence, H, MaxRng()) == H * (1 + HEARTBEAT_JITTER)


@given(seed=st.integers(0, 2**32), attempts=st.integers(1, 30), fenced=st.booleans())
def test_the_delay_never_exceeds_the_backoffs_nor_a_heartbeat_before_the_fence(seed: int, attempts: int,
                                                                              fenced: bool):
    clock = ManualClock(0.0)
    fence = FenceTimer(F, clock)
    if fenced:
        clock.advance(F)
        fence.should_fence()
    backoff, rng = Backoff(random.Random(seed), cap_s=reconnect_cap_s(F)), random.Random(seed + 1)
    for _ in range(attempts):
        ceiling = backoff.ceiling()
        delay = reconnect_delay(backoff, fence, H, rng)
        assert 0 <= delay <= ceiling
        assert fenced or delay <= min(H * (1 + HEARTBEAT_JITTER), max(fence.remaining_s() / 2, H / 10))
    assert backoff.attempt == attempts
