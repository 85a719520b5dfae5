"""Metric cases of ALGORITHMS.md §1 ("How to test") and nearest-rank percentiles (§0)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpupool.core.metrics import (
    ESTIMATE_BUCKETS,
    WAIT_BUCKETS_S,
    Interval,
    cluster_figures,
    histogram,
    nearest_rank,
    window_ratios,
)
from gpupool.core.testing.builders import make_node, table_of


def test_gar_and_gfr_on_three_nodes():
    table = table_of((make_node("n1", gpus=8), [0] * 8), (make_node("n2", gpus=8), [0] * 3 + [1000] * 5),
                     make_node("n3", gpus=8))
    figures = cluster_figures(table)
    assert figures.gar == Fraction(11, 24)
    assert figures.gfr == Fraction(1, 3)
    assert figures.gfr_gpu == Fraction(5000, 13000)


def test_unschedulable_nodes_leave_the_denominator():
    table = table_of(make_node("a", gpus=8), make_node("b", gpus=8))
    table.set_state(1, table.states[1].with_schedulable(False))
    figures = cluster_figures(table)
    assert figures.capacity_milli == 8000 and figures.gpus_unavailable == 8


@pytest.mark.parametrize(
    ("intervals", "want_gar", "want_sor"),
    [([Interval(0, 10, 8000), Interval(5, 10, 3000)], 95 / 240, 95 / 240),
     ([Interval(0, 10, 8000), Interval(5, 10, 3000), Interval(4, 5, 3000, held_idle=True)], 95 / 240, 98 / 240)],
    ids=["running only", "B reserved an hour before it ran"],
)
def test_window_gar_and_sor(intervals, want_gar, want_sor):
    gar, sor = window_ratios(intervals, 24_000, 0, 10)
    assert gar == pytest.approx(want_gar) and sor == pytest.approx(want_sor)


def test_jwtd_buckets_and_percentiles():
    waits = [0, 30, 300, 7200]
    assert histogram(waits, WAIT_BUCKETS_S) == [2, 1, 0, 1, 0, 0]
    assert nearest_rank(waits, 50) == 30
    assert nearest_rank(waits, 90) == 7200


def test_jtted_ratios():
    ratios = [Fraction(8, 10), Fraction(3, 2), Fraction(1)]
    assert histogram(ratios, ESTIMATE_BUCKETS) == [0, 1, 1, 1, 0]
    assert nearest_rank(ratios, 1, 2) == 1


def test_nearest_rank_uses_exact_integer_rank():
    values = list(range(1, 101))
    assert nearest_rank(values, 7) == 7  # a float 0.07*100 would give rank 8
    assert nearest_rank([2, 4], 1, 2) == 2
