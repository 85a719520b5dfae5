"""KAI-style fair-share division (ALGORITHMS.md §4.4, §4.5): "How to test" cases 6–8 and the phase rules."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.division import QueueNode, ShareRequest, divide, divide_tree

Q = ShareRequest


@pytest.mark.parametrize(
    ("total", "queues", "kwargs", "want"),
    [
        (10, [Q("A", 8, deserved=2, weight=1, created=0), Q("B", 8, deserved=2, weight=3, created=1)], {},
         {"A": 4, "B": 6}),
        (10, [Q("A", 3), Q("B", 10)], {}, {"A": 3, "B": 7}),
        (10, [Q("A", 10, usage=Fraction(3, 10)), Q("B", 10)], {"k_value": Fraction(1)}, {"A": 4, "B": 6}),
        (10, [Q("A", 10, usage=Fraction(3, 10)), Q("B", 10)], {"k_value": Fraction(0)}, {"A": 5, "B": 5}),
        (10, [Q("A", 10, usage=Fraction(3, 10)), Q("B", 10)], {"k_value": Fraction(-2)}, {"A": 5, "B": 5}),
        (10, [Q("A", 8, deserved=6), Q("B", 8, deserved=6)], {}, {"A": 6, "B": 6}),
        (10, [Q("A", 8, deserved=-1), Q("B", 8, deserved=1)], {}, {"A": 8, "B": 2}),
        (10, [Q("A", 10, weight=0), Q("B", 4)], {}, {"A": 0, "B": 4}),
        (10, [Q("A", 10, deserved=3, weight=0), Q("B", 4)], {}, {"A": 3, "B": 4}),
        (10, [Q("A", 10, limit=2), Q("B", 10, limit=5)], {}, {"A": 2, "B": 5}),
        (10, [Q("A", 10, deserved=4, limit=3), Q("B", 10)], {}, {"A": 3, "B": 7}),
        (8, [Q("A", 6, priority=1), Q("B", 10, created=-1)], {}, {"A": 6, "B": 2}),
        (9, [Q("A", 10, priority=1), Q("B", 10, priority=1), Q("C", 10)], {}, {"A": 4, "B": 4, "C": 1}),
        (10, [Q("A", 10, priority=1), Q("B", 10, priority=1), Q("C", 10)], {}, {"A": 5, "B": 5, "C": 0}),
        (10, [Q("solo", 4, limit=6)], {}, {"solo": 4}),
        (10, [Q("A", 10, created=1), Q("B", 10, created=0), Q("C", 10, created=0)], {},
         {"A": 3, "B": 4, "C": 3}),
        (10_000, [Q("A", 10_000), Q("B", 10_000, weight=2)], {"quantum": 1000}, {"A": 3000, "B": 7000}),
        (10_000, [Q("A", 10_000), Q("B", 10_000, weight=2)], {"quantum": 1}, {"A": 3333, "B": 6667}),
        (6000, [Q("A", 1700), Q("B", 10_000, weight=3)], {"quantum": 1000}, {"A": 1700, "B": 4300}),
        (0, [Q("A", 5, deserved=2)], {}, {"A": 2}),
    ],
    ids=[
        "case 6: deserved then weights 1:3, phase-3 tie goes to the older queue",
        "case 7: water-filling hands A's surplus to B in round 2",
        "case 8: time-based usage 0.3 with k=1 shifts the leftover unit to B",
        "k=0 ignores usage",
        "negative k counts as 0",
        "over-committed deserved keeps phase-1 shares and skips phases 2-3",
        "deserved -1 is unlimited and counts as the total",
        "weight 0 gets nothing over quota",
        "weight 0 keeps its deserved quota",
        "limit caps both queues and the rest stays unassigned",
        "limit caps deserved too",
        "higher priority level is satisfied first",
        "higher level's fractional leftover flows to the lower level's phase 2",
        "lower level gets nothing when the higher level absorbs everything",
        "single queue at a level runs the loop and stops at its request (gpupool differs from KAI)",
        "phase-3 tie on fraction: older first, then name",
        "quantum 1000: phase 2 whole GPUs, leftover GPU to the larger fraction",
        "quantum 1: the same division in milli-units",
        "phase 3 never gives more than the queue still asks for",
        "zero total is over-committed by any deserved",
    ],
)
def test_divide(total, queues, kwargs, want):
    assert divide(total, queues, **kwargs) == want
    assert divide(total, list(reversed(queues)), **kwargs) == want


@pytest.mark.parametrize(
    ("make", "field"),
    [(lambda: Q("A", -1), "request"), (lambda: Q("A", 1, deserved=-2), "deserved"),
     (lambda: Q("A", 1, limit=-3), "limit"), (lambda: Q("A", 1, weight=-1), "weight"),
     (lambda: Q("A", 1, usage=Fraction(-1, 2)), "usage"), (lambda: divide(-1, [Q("A", 1)]), "total"),
     (lambda: divide(10, [Q("A", 1)], quantum=0), "quantum"), (lambda: divide(10, [Q("A", 1), Q("A", 2)]), "unique")],
    ids=["negative request", "deserved below -1", "limit below -1", "negative weight", "negative usage",
         "negative total", "quantum 0", "duplicate names"],
)
def test_bad_inputs_name_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_float_amounts_are_rejected():
    with pytest.raises(TypeError, match="request"):
        Q("A", 1.5)  # type: ignore[arg-type]


def test_two_level_tree_divides_each_parent_share_among_its_children():
    research = QueueNode(Q("research", 12, deserved=4, weight=1, created=0),
                         (QueueNode(Q("vision", 9, created=0)), QueueNode(Q("nlp", 3, created=1))))
    prod = QueueNode(Q("prod", 8, deserved=4, weight=1, created=1),
                     (QueueNode(Q("serving", 8, deserved=3)),))
    shares = divide_tree(16, [research, prod])
    assert shares == {"research": 8, "prod": 8, "vision": 5, "nlp": 3, "serving": 8}


def test_tree_rejects_a_name_used_twice():
    tree = [QueueNode(Q("a", 4), (QueueNode(Q("x", 2)),)), QueueNode(Q("b", 4), (QueueNode(Q("x", 2)),))]
    with pytest.raises(ValueError, match="twice"):
        divide_tree(8, tree)


queue_specs = st.lists(
    st.tuples(st.integers(0, 50), st.integers(-1, 20), st.integers(-1, 40), st.integers(0, 4), st.integers(0, 2),
              st.integers(0, 3), st.fractions(0, 1, max_denominator=20)),
    min_size=1, max_size=6,
)


@given(st.integers(0, 100), queue_specs, st.sampled_from([Fraction(0), Fraction(1), Fraction(5, 2)]),
       st.sampled_from([1, 3, 10]))
def test_division_invariants(total, specs, k_value, quantum):
    queues = [Q(f"q{i}", r, deserved=d, limit=lim, weight=w, priority=p, created=c, usage=u)
              for i, (r, d, lim, w, p, c, u) in enumerate(specs)]
    shares = divide(total, queues, k_value, quantum)
    phase1 = {q.name: min(total if q.deserved == -1 else q.deserved, q.requestable) for q in queues}
    for q in queues:
        assert phase1[q.name] <= shares[q.name] <= q.requestable
    if sum(phase1.values()) <= total:
        assert sum(shares.values()) <= total
    else:
        assert shares == phase1


@given(st.integers(0, 100), st.lists(st.tuples(st.integers(0, 50), st.integers(1, 4), st.integers(0, 2)),
                                     min_size=1, max_size=6))
def test_without_usage_nothing_is_left_while_a_weighted_queue_waits(total, specs):
    queues = [Q(f"q{i}", r, weight=w, priority=p) for i, (r, w, p) in enumerate(specs)]
    shares = divide(total, queues)
    assert sum(shares.values()) == min(total, sum(q.request for q in queues))
