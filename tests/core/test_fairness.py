"""Decay, time-based normalised usage (ALGORITHMS.md §4.2, §4.5) and DRF progressive filling (§4.1)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.fairness import decayed, dominant_share, drf_allocate, normalised_usage

HOUR = 3600
DAY = 24 * HOUR


@pytest.mark.parametrize(
    ("amount", "age_s", "half_life_s", "want"),
    [(100, 14 * DAY, 7 * DAY, 25.0), (100, 7 * DAY, 7 * DAY, 50.0), (100, 0, 7 * DAY, 100.0),
     (100, 30 * DAY, 0, 100.0)],
    ids=["case 4: two half-lives", "case 4: one half-life", "no age", "half-life 0 means no decay"],
)
def test_decayed(amount, age_s, half_life_s, want):
    assert decayed(amount, age_s, half_life_s) == want


@pytest.mark.parametrize(("args", "field"), [((-1, 0, 1), "amount"), ((1, -1, 1), "age_s"), ((1, 0, -1), "half_life")],
                         ids=["negative amount", "negative age", "negative half-life"])
def test_decayed_rejects_negatives(args, field):
    with pytest.raises(ValueError, match=field):
        decayed(*args)


def test_usage_without_decay_is_exact():
    # 10 GPUs (milli) over a 10 h window; the queue held 8 GPUs for 3 h = 24 GPU·h => 0.24.
    events = [(0, 3 * HOUR, 8000)]
    assert normalised_usage(events, 10_000, now=10 * HOUR, window_s=10 * HOUR) == Fraction(6, 25)


@pytest.mark.parametrize(
    ("events", "want"),
    [([(-5 * HOUR, 2 * HOUR, 10_000)], Fraction(2, 10)), ([(8 * HOUR, 20 * HOUR, 10_000)], Fraction(2, 10)),
     ([(-9 * HOUR, -1 * HOUR, 10_000)], Fraction(0)), ([], Fraction(0)),
     ([(0, HOUR, 5000), (0, HOUR, 5000)], Fraction(1, 10))],
    ids=["clipped at the window start", "clipped at now", "entirely before the window", "no events",
         "overlapping events add up"],
)
def test_usage_is_clipped_to_the_window(events, want):
    assert normalised_usage(events, 10_000, now=10 * HOUR, window_s=10 * HOUR) == want


def test_decayed_usage_uses_the_exact_integral():
    # Window 2T, the queue held all capacity over the last T: (1 - 1/2) / (1 - 1/4) = 2/3.
    t = 7 * DAY
    assert normalised_usage([(t, 2 * t, 8)], 8, now=2 * t, window_s=2 * t, half_life_s=t) == pytest.approx(2 / 3)


def test_full_use_is_one_with_or_without_decay():
    for half_life in (0, HOUR, 100 * DAY):
        got = normalised_usage([(0, 10 * HOUR, 4)], 4, now=10 * HOUR, window_s=10 * HOUR, half_life_s=half_life)
        assert got == pytest.approx(1.0)


def test_decayed_usage_matches_a_riemann_sum():
    now, window, half_life, steps = 10 * HOUR, 10 * HOUR, 3 * HOUR, 20_000

    def integral(low, high):
        return sum(2 ** (-(now - (low + (i + 0.5) * (high - low) / steps)) / half_life)
                   for i in range(steps)) * (high - low) / steps

    want = 3 * integral(2 * HOUR, 5 * HOUR) / (10 * integral(0, window))
    got = normalised_usage([(2 * HOUR, 5 * HOUR, 3)], 10, now=now, window_s=window, half_life_s=half_life)
    assert got == pytest.approx(want, rel=1e-6)


def test_recent_usage_counts_more_than_old_usage():
    def usage(start):
        return normalised_usage([(start, start + HOUR, 1)], 1, now=10 * HOUR, window_s=10 * HOUR,
                                half_life_s=2 * HOUR)

    assert usage(9 * HOUR) > usage(5 * HOUR) > usage(0) > 0
    assert usage(9 * HOUR) / usage(7 * HOUR) == pytest.approx(2.0)


@given(st.integers(1, 10**6), st.floats(0, 999))
def test_short_intervals_do_not_lose_precision(capacity, age):
    # With a huge half-life, subtracting two exponentials would cancel; the expm1 form keeps the digits.
    got = normalised_usage([(1000 - age - 1e-3, 1000 - age, capacity)], capacity, now=1000, window_s=1000,
                           half_life_s=10**12)
    assert got == pytest.approx(1e-6, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"capacity_per_s": 0}, "capacity_per_s"), ({"window_s": 0}, "window_s"), ({"half_life_s": -1}, "half_life_s"),
     ({"usage_events": [(5, 4, 1)]}, "end_s"), ({"usage_events": [(0, 1, -1)]}, "amount")],
    ids=["zero capacity", "empty window", "negative half-life", "end before start", "negative amount"],
)
def test_normalised_usage_rejects_bad_input(kwargs, field):
    args = {"usage_events": [], "capacity_per_s": 1, "now": 10, "window_s": 10, "half_life_s": 0} | kwargs
    with pytest.raises(ValueError, match=field):
        normalised_usage(**args)


PAPER_CAPACITY = {"cpu": 9, "mem_gb": 18}
PAPER_DEMANDS = {"A": {"cpu": 1, "mem_gb": 4}, "B": {"cpu": 3, "mem_gb": 1}}


@pytest.mark.parametrize(
    ("weights", "tie", "want"),
    [(None, "id", {"A": 3, "B": 2}), (None, "reverse", {"A": 3, "B": 2}),
     ({"A": 2}, "id", {"A": 4, "B": 1}), ({"A": 2}, "reverse", {"A": 3, "B": 2})],
    ids=["case 1: paper example", "case 1 with ties to B", "case 2: w_A=2, ties to the lower id",
         "case 2: w_A=2, ties to B"],
)
def test_drf_progressive_filling(weights, tie, want):
    assert drf_allocate(PAPER_CAPACITY, PAPER_DEMANDS, weights, tie) == want


def test_drf_paper_example_dominant_shares_are_equal():
    placed = drf_allocate(PAPER_CAPACITY, PAPER_DEMANDS)
    shares = [dominant_share({r: a * placed[u] for r, a in PAPER_DEMANDS[u].items()}, PAPER_CAPACITY) for u in "AB"]
    assert shares == [Fraction(2, 3), Fraction(2, 3)]


def test_zero_demand_resource_never_dominates():
    assert dominant_share({"cpu": 2, "gpu": 0}, {"cpu": 10, "gpu": 4}) == Fraction(1, 5)
    placed = drf_allocate({"cpu": 6, "gpu": 2}, {"A": {"cpu": 1}, "B": {"cpu": 1, "gpu": 1}})
    assert placed == {"A": 4, "B": 2}


def test_zero_capacity_resource_is_excluded_and_blocks_its_users():
    assert dominant_share({"cpu": 3, "fpga": 1}, {"cpu": 6, "fpga": 0}) == Fraction(1, 2)
    placed = drf_allocate({"cpu": 6, "fpga": 0}, {"A": {"cpu": 1}, "B": {"cpu": 1, "fpga": 1}})
    assert placed == {"A": 6, "B": 0}


def test_blocked_user_does_not_stop_the_others():
    # a keeps the smallest weighted share (1/10) but its next task needs a second GPU: the paper would stop
    # there; the work-conserving variant blocks a and lets b fill the CPUs.
    placed = drf_allocate({"cpu": 10, "gpu": 1}, {"a": {"cpu": 1, "gpu": 1}, "b": {"cpu": 1}}, {"a": 10})
    assert placed == {"a": 1, "b": 9}


def test_max_tasks_bounds_pending_work():
    placed = drf_allocate({"gpu": 8}, {"a": {"gpu": 1}, "b": {"gpu": 1}}, max_tasks={"a": 2})
    assert placed == {"a": 2, "b": 6}


@pytest.mark.parametrize(
    ("args", "field"),
    [(({"cpu": 1}, {"A": {"cpu": 0}}), "demand some"), (({"cpu": 1}, {"A": {"cpu": -1}}), "demands"),
     (({"cpu": -1}, {"A": {"cpu": 1}}), "capacity"), (({"cpu": 1}, {"A": {"cpu": 1}}, {"A": 0}), "weights"),
     (({"cpu": 1}, {"A": {"cpu": 1}}, None, "random"), "tie")],
    ids=["all-zero task", "negative demand", "negative capacity", "zero weight", "unknown tie rule"],
)
def test_drf_rejects_bad_input(args, field):
    with pytest.raises(ValueError, match=field):
        drf_allocate(*args)


@given(st.dictionaries(st.sampled_from(["u1", "u2", "u3", "u4"]),
                       st.fixed_dictionaries({"cpu": st.integers(1, 5), "gpu": st.integers(0, 3)}), min_size=1),
       st.integers(0, 40), st.integers(0, 12))
def test_drf_fits_and_is_work_conserving(demands, cpu, gpu):
    capacity = {"cpu": cpu, "gpu": gpu}
    placed = drf_allocate(capacity, demands)
    for resource, amount in capacity.items():
        used = sum(task[resource] * placed[user] for user, task in demands.items())
        assert used <= amount
    free = {r: a - sum(t[r] * placed[u] for u, t in demands.items()) for r, a in capacity.items()}
    assert not any(all(task[r] <= free[r] for r in task) for task in demands.values())
