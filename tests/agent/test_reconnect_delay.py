"""The reconnect delay (gpupool.agent.timing.reconnect_delay): the backoff, held to about one heartbeat while some
workload still runs, and to half the time left before the next one is fenced, so that a partition shorter than a
workload's max_disconnect ends in a reconnect before it is fenced (RELIABILITY.md T2.a; end to end in
tests/reliability/test_partitions.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.timing import HEARTBEAT_JITTER, Backoff, reconnect_cap_s, reconnect_delay

H, F = 0.25, 2.0


class MaxRng(random.Random):
    """uniform(a, b) always returns b: every delay at its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_while_work_runs_retries_come_at_least_every_heartbeat_then_the_backoff_takes_over():
    backoff = Backoff(MaxRng(), cap_s=reconnect_cap_s(F))
    before = [reconnect_delay(backoff, F, H, MaxRng()) for _ in range(6)]
    assert before == [H * (1 + HEARTBEAT_JITTER)] * 6  # the backoff alone: 0.5, 1, 1.5, 1.5 ...
    # closer to the next fence: half the time left, but not below a tenth of a heartbeat
    assert reconnect_delay(backoff, 0.2, H, MaxRng()) == pytest.approx(0.1)
    assert reconnect_delay(backoff, 0.01, H, MaxRng()) == pytest.approx(H / 10)
    # nothing runs any more (all fenced, or none): the backoff alone
    assert [reconnect_delay(backoff, None, H, MaxRng()) for _ in range(2)] == [reconnect_cap_s(F)] * 2


@given(seed=st.integers(0, 2**32), attempts=st.integers(1, 30), left=st.none() | st.floats(0, 2 * F))
def test_the_delay_never_exceeds_the_backoffs_nor_a_heartbeat_while_work_runs(seed: int, attempts: int,
                                                                             left: float | None):
    backoff, rng = Backoff(random.Random(seed), cap_s=reconnect_cap_s(F)), random.Random(seed + 1)
    for _ in range(attempts):
        ceiling = backoff.ceiling()
        delay = reconnect_delay(backoff, left, H, rng)
        assert 0 <= delay <= ceiling
        assert left is None or delay <= min(H * (1 + HEARTBEAT_JITTER), max(left / 2, H / 10))
    assert backoff.attempt == attempts
