"""Backoff, heartbeat jitter and the self-fence timer, driven by an injected clock and rng."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.clock import ManualClock
from gpupool.agent.timing import Backoff, Silence, jittered, reconnect_cap_s


class MaxRng(random.Random):
    """uniform(a, b) always returns b: exposes the ceiling of each delay."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_ceiling_doubles_up_to_the_cap():
    backoff = Backoff(MaxRng(), base_s=0.5, cap_s=30.0)
    assert [backoff.next_delay() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff.attempt == 9


def test_backoff_reset_starts_over():
    backoff = Backoff(MaxRng())
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 0.5


@given(seed=st.integers(0, 2**32), steps=st.integers(1, 80))
def test_backoff_full_jitter_stays_within_zero_and_the_ceiling(seed, steps):
    backoff = Backoff(random.Random(seed), base_s=0.5, cap_s=30.0)
    for n in range(steps):
        ceiling = min(30.0, 0.5 * 2**n)
        assert 0.0 <= backoff.next_delay() <= ceiling


def test_backoff_is_deterministic_for_a_seed():
    assert [Backoff(random.Random(7)).next_delay() for _ in range(3)] == [
        Backoff(random.Random(7)).next_delay() for _ in range(3)
    ]


@pytest.mark.parametrize(("base", "cap"), [(0, 1), (-1, 1), (2, 1)])
def test_backoff_rejects_bad_bounds(base, cap):
    with pytest.raises(ValueError):
        Backoff(random.Random(), base_s=base, cap_s=cap)


@given(seed=st.integers(0, 2**32))
def test_heartbeat_jitter_is_within_twenty_percent(seed):
    assert 4.0 <= jittered(5.0, random.Random(seed)) <= 6.0


def test_silence_counts_from_construction_and_from_every_frame_heard():
    clock = ManualClock(100.0)
    silence = Silence(clock)
    clock.advance(39.9)
    assert silence.silence_s() == pytest.approx(39.9)
    silence.heard()
    assert silence.silence_s() == 0.0
    clock.advance(2.5)
    assert silence.silence_s() == pytest.approx(2.5)



def test_manual_clock_does_not_go_backwards():
    with pytest.raises(ValueError):
        ManualClock().advance(-1)


def test_reconnect_cap_scales_with_the_fence_and_keeps_the_defaults():
    assert reconnect_cap_s(40.0) == 30.0  # the default F: the usual 30 s cap
    assert reconnect_cap_s(2.0) == 1.5  # scaled by 1/20: back within G = 3 s of a control-plane restart
    assert reconnect_cap_s(0.2) == 0.5  # never below the first delay's ceiling
    assert reconnect_cap_s(400.0) == 30.0
