"""Quotas: Kueue borrowing/lending (ALGORITHMS.md §5 test 1), limits, guarantees for non-preemptible jobs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import QueueSpec, QueueTree, ResourceVector
from gpupool.core.queues import GPU_UNITS
from gpupool.core.quota import add_usage, admission_reason, headroom

G = GPU_UNITS


def rv(**kw):
    return ResourceVector({G if k == "gpu" else k: v for k, v in kw.items()})


def _tree(a=None, b=None):
    return QueueTree([QueueSpec("a", guaranteed=rv(gpu=9), **(a or {})), QueueSpec("b", guaranteed=rv(gpu=12),
                                                                                     **(b or {}))])


@pytest.mark.parametrize(
    ("a", "b", "want_max"),
    [({}, {}, 21), ({"borrow_limit": rv(gpu=1)}, {}, 10), ({}, {"lend_limit": rv(gpu=1)}, 10)],
    ids=["b idle lends all", "a may borrow 1", "b lends only 1"],
)
def test_borrowing_and_lending(a, b, want_max):
    tree = _tree(a, b)
    cluster = rv(gpu=21)
    admits = [n for n in range(1, 23) if not admission_reason(tree, {}, "a", rv(gpu=n), cluster)]
    assert max(admits) == want_max


def test_without_the_cluster_bound_a_parent_of_the_clusters_capacity_does_not_bound_its_children():
    # before placement the cluster's capacity is left to placement, and so is what siblings keep unlent of it
    # (checked after placement); a parent's own capacity (guarantee plus borrow limit) and limits still refuse
    tree = _tree({}, {"lend_limit": rv(gpu=1)})
    assert admission_reason(tree, {}, "a", rv(gpu=40), None) == ""
    assert "while its siblings keep 11" in admission_reason(tree, {}, "a", rv(gpu=11), rv(gpu=21))
    assert "the cluster has 21" in admission_reason(tree, {"b": rv(gpu=12)}, "a", rv(gpu=10), rv(gpu=21))
    org = QueueTree([QueueSpec("org", guaranteed=rv(gpu=2), borrow_limit=rv(gpu=1)), QueueSpec("x", parent="org"),
                     QueueSpec("y", parent="org", limit=rv(gpu=1))])
    assert "org has 3 gpu for its children" in admission_reason(org, {}, "x", rv(gpu=4), None)
    assert "would exceed its gpu limit" in admission_reason(org, {}, "y", rv(gpu=2), None)


def test_limit_caps_and_names_the_queue():
    tree = QueueTree([QueueSpec("a", guaranteed=rv(gpu=1000), limit=rv(gpu=4000))])
    assert admission_reason(tree, {}, "a", rv(gpu=4000), rv(gpu=8000)) == ""
    assert "queue a would exceed its gpu limit" in admission_reason(tree, {}, "a", rv(gpu=4001), rv(gpu=8000))


def test_non_preemptible_work_must_fit_the_guarantee():
    tree = QueueTree([QueueSpec("a", guaranteed=rv(gpu=1000), limit=rv(gpu=4000))])
    charge = ResourceVector({G: 2000, "np:gpu": 2000})
    assert "non-preemptible" in admission_reason(tree, {}, "a", charge, rv(gpu=8000))
    assert admission_reason(tree, {}, "a", rv(gpu=2000), rv(gpu=8000)) == ""


def test_parent_limits_apply_to_children():
    tree = QueueTree([QueueSpec("org", limit=rv(gpu=3000)), QueueSpec("x", parent="org"),
                      QueueSpec("y", parent="org")])
    used = {"org": rv(gpu=2000), "y": rv(gpu=2000)}
    assert "org has 3000 gpu for its children, they would use 4000" in admission_reason(
        tree, used, "x", rv(gpu=2000), rv(gpu=10_000))
    assert admission_reason(tree, used, "x", rv(gpu=1000), rv(gpu=10_000)) == ""


def test_unknown_or_inner_queues_are_refused():
    tree = QueueTree([QueueSpec("org"), QueueSpec("x", parent="org")])
    assert "unknown leaf queue" in admission_reason(tree, {}, "org", rv(gpu=1), rv(gpu=10))
    assert "unknown leaf queue" in admission_reason(tree, {}, "nope", rv(gpu=1), rv(gpu=10))


@pytest.mark.parametrize(
    ("specs", "message"),
    [([QueueSpec("a", parent="ghost")], "not declared"), ([QueueSpec("a"), QueueSpec("a")], "declared twice"),
     ([QueueSpec("a", parent="b"), QueueSpec("b", parent="a")], "cycle")],
    ids=["missing parent", "duplicate", "cycle"],
)
def test_bad_trees_are_rejected(specs, message):
    with pytest.raises(ValueError, match=message):
        QueueTree(specs)


def test_fair_share_is_capped_by_what_the_queue_may_hold():
    from gpupool.core.quota import fair_shares
    from gpupool.core.testing.builders import make_job, make_shape

    # a may borrow 1 over its guarantee of 2 (so hold 3), b may hold 4 (its limit): neither is owed GPUs it
    # could never hold, and c (no caps) gets the rest (without the borrow cap a would be owed 5 and c 3).
    tree = QueueTree([QueueSpec("a", guaranteed=rv(gpu=2000), borrow_limit=rv(gpu=1000)),
                      QueueSpec("b", guaranteed=rv(gpu=2000), limit=rv(gpu=4000)), QueueSpec("c")])
    pending = [make_job(f"{q}{k}", make_shape(1000), queue=q) for q in "abc" for k in range(10)]
    shares = fair_shares(tree, {}, pending, 12_000)
    assert shares == {"a": 3000, "b": 4000, "c": 5000}


def _opt(draw_value):
    return None if draw_value is None else rv(gpu=draw_value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(0, 16)),
                          st.one_of(st.none(), st.integers(0, 8)), st.one_of(st.none(), st.integers(0, 8))),
                min_size=5, max_size=5),
       st.lists(st.integers(0, 12), min_size=3, max_size=3), st.integers(0, 40), st.sampled_from(["a1", "a2", "b1"]),
       st.sampled_from(["a1", "a2", "b1"]), st.integers(0, 6), st.booleans())
def test_the_headroom_is_exactly_what_admission_allows(rules, leaf_usage, cluster_gpus, leaf, other, extra,
                                                       unbounded):
    # research (a1, a2) and product (b1) under the cluster; each queue draws (guaranteed, limit, borrow, lend)
    names, parents = ["a", "b", "a1", "a2", "b1"], [None, None, "a", "a", "b"]
    tree = QueueTree([QueueSpec(n, parent=p, guaranteed=rv(gpu=g), limit=_opt(lim), borrow_limit=_opt(bor),
                                lend_limit=_opt(lend))
                      for n, p, (g, lim, bor, lend) in zip(names, parents, rules, strict=True)])
    used = {}
    for name, amount in zip(["a1", "a2", "b1"], leaf_usage, strict=True):
        add_usage(used, tree, name, rv(gpu=amount))
    # unbounded: the cluster's capacity is no rule (a check before placement); a resource no rule bounds is left out
    cluster = None if unbounded else rv(gpu=cluster_gpus)
    rooms = headroom(tree, used, leaf, cluster)
    if G not in rooms:
        assert unbounded and admission_reason(tree, used, leaf, rv(gpu=10**6), cluster) == ""
        return
    room = rooms[G]
    if room >= 0:
        assert admission_reason(tree, used, leaf, rv(gpu=room), cluster) == ""
    assert admission_reason(tree, used, leaf, rv(gpu=max(0, room + 1)), cluster) != ""
    # without the cluster's bound, admission allows at least as much
    assert room <= headroom(tree, used, leaf, None).get(G, room)
    # any queue taking `extra` more shrinks the room by at most `extra`; giving it back never shrinks it
    grown = dict(used)
    add_usage(grown, tree, other, rv(gpu=extra))
    assert room - extra <= headroom(tree, grown, leaf, cluster)[G] <= room

