"""The placement engine's cached scores and device picks always equal a fresh evaluation (Hypothesis), and the
node table's keys name (kind, state) pairs exactly."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import Framework, Workload, default_registry, nodes, placement_profile
from gpupool.core.fit import node_fits
from gpupool.core.framework import placement
from gpupool.core.framework.placement import FEASIBLE_MIN
from gpupool.core.model import DeviceShare
from gpupool.core.testing.builders import make_node, make_shape, table_of

SHAPES = [make_shape(250, cpu_milli=2000), make_shape(1000), make_shape(1000, gpu_count=4),
          make_shape(0, cpu_milli=8000)]


@pytest.mark.parametrize("limits", [(placement.PATCH_MOST, nodes._LOG_KEEP), (0, 256), (2, 1), (16, 3)],
                         ids=["as shipped", "always gathered", "patched, short log", "patched, log shorter than 16"])
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["fgd", "best", "bestfit", "gpupacking", "gpuclustering", "dotprod", "spread"]),
       st.lists(st.integers(-2, len(SHAPES) - 1), min_size=1, max_size=40), st.integers(0, 10_000))
def test_cached_scores_match_fresh_evaluation(limits, policy, arrivals, seed):
    """Arrivals place a shape; a negative entry removes the oldest placed task instead, so nodes return to
    states seen before (the cache's hits) as well as reaching new ones. `limits` (how many changes are patched
    one by one, how many the table's change log keeps) sends the updates down the gather, the patch, or both."""
    patch_most, log_keep = placement.PATCH_MOST, nodes._LOG_KEEP
    placement.PATCH_MOST, nodes._LOG_KEEP = limits
    try:
        _place_and_compare(policy, arrivals, seed)
    finally:
        placement.PATCH_MOST, nodes._LOG_KEEP = patch_most, log_keep


def _place_and_compare(policy, arrivals, seed):
    table = table_of(*[make_node(f"n{i}", gpus=g, cpu_milli=16_000 * g) for i, g in enumerate([1, 2, 4, 8, 8])])
    prof = placement_profile(policy).with_workload(Workload.from_shapes(SHAPES))
    placer = Framework.build(prof, default_registry()).plugins.placer
    rng = random.Random(seed)
    placed = []
    for k in arrivals:
        if k < 0:
            if placed:
                i, shape, shares = placed.pop(0)
                table.set_state(i, table.states[i].give(shape, shares))
            continue
        shape = SHAPES[k]
        scores = placer.scores(table, shape)
        for i, (kind, state) in enumerate(zip(table.kinds, table.states, strict=True)):
            fresh = placer._evaluate(kind, state, shape)
            assert scores[i] == fresh
            assert (scores[i] >= FEASIBLE_MIN) == (node_fits(kind, state, shape) == "")
        _check_excluded(placer, table, shape, frozenset(j for j in range(len(table)) if rng.random() < 0.4), seed)
        i = placer.choose(table, shape, rng)
        if i is not None:
            shares = placer.pick(table, i, shape, rng)
            assert shares == placer.devices.pick_devices(table.kinds[i], table.states[i], shape, rng)
            table.set_state(i, table.states[i].take(shape, shares))
            placed.append((i, shape, shares))


def _check_excluded(placer, table, shape, excluded, seed):
    """`choose` with nodes excluded takes a best node outside them (the lowest index under the name tie-break), or
    None when only excluded nodes are feasible; the table's cached scores are left as they were."""
    scores = [int(v) for v in placer.scores(table, shape)]
    allowed = [scores[j] for j in range(len(table)) if j not in excluded and scores[j] >= FEASIBLE_MIN]
    chosen = placer.choose(table, shape, random.Random(seed), excluded)
    if not allowed:
        assert chosen is None
    else:
        assert chosen not in excluded and scores[chosen] == max(allowed)
        if placer.tie_break == "name":
            assert chosen == min(j for j in range(len(table)) if j not in excluded and scores[j] == max(allowed))
    assert [int(v) for v in placer.scores(table, shape)] == scores


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(SHAPES) - 1), max_size=12), st.sets(st.integers(0, 4)), st.integers(0, 10_000))
def test_random_tie_break_keeps_off_excluded_nodes(arrivals, excluded, seed):
    table = table_of(*[make_node(f"n{i}", gpus=g, cpu_milli=16_000 * g) for i, g in enumerate([1, 2, 4, 8, 8])])
    placer = Framework.build(placement_profile("random"), default_registry()).plugins.placer
    rng = random.Random(seed)
    for k in arrivals:
        i = placer.choose(table, SHAPES[k], rng)
        if i is not None:
            table.set_state(i, table.states[i].take(SHAPES[k], placer.pick(table, i, SHAPES[k], rng)))
    for shape in SHAPES:
        _check_excluded(placer, table, shape, frozenset(excluded), seed)


def test_a_table_without_nodes_places_nothing_and_says_why():
    placer = Framework.build(placement_profile("bestfit"), default_registry()).plugins.placer
    table = table_of()
    assert placer.choose(table, WHOLE, random.Random(0)) is None
    assert len(placer.scores(table, WHOLE)) == 0 and placer.explain(table, WHOLE) == []


def test_node_keys_name_kind_and_state(monkeypatch):
    """Equal (kind, state) pairs share a key and different pairs never do, also after the table numbers its
    pairs again (at _KEY_LIMIT), which drops every derived value: no cache outlives its numbering."""
    table = table_of(make_node("a", gpus=2), make_node("b", gpus=2), make_node("c", gpus=4))
    assert table.keys[0] == table.keys[1] != table.keys[2]
    table.set_state(0, table.states[0].take(WHOLE, FIRST_GPU))
    assert table.keys[0] != table.keys[1]
    table.set_state(1, table.states[1].take(WHOLE, FIRST_GPU))
    assert table.keys[0] == table.keys[1]
    assert table.key_count == 3  # two empty kinds, and the 2-GPU node with one GPU taken, met twice
    table.derived["memo"] = "made under the old numbering"
    monkeypatch.setattr(nodes, "_KEY_LIMIT", 3)
    table.set_state(2, table.states[2].take(WHOLE, FIRST_GPU))  # a fourth pair: the table numbers again
    assert table.derived == {}
    assert table.keys[0] == table.keys[1] != table.keys[2] and table.key_count == 2
    assert list(table.key_array()) == table.keys
    table.set_state(0, table.states[0].give(WHOLE, FIRST_GPU))
    assert len(set(table.keys)) == 3 and max(table.keys) < table.key_count


def test_a_remembered_placement_is_reused_only_for_the_same_shares_object():
    """`NodeTable.take` replays a placement from memory when the same shares object comes again for the same key
    and shape; equal-valued or different shares are placed afresh. Either way the node ends as `NodeState.take`
    leaves it, under the key its pair is named by."""
    table = table_of(make_node("a", gpus=2), make_node("b", gpus=2))
    first, second, first_again = FIRST_GPU, (DeviceShare(1, 1000),), (DeviceShare(0, 1000),)
    for i, shares in [(0, first), (1, first), (0, second), (1, first_again), (0, first)]:
        empty = table.states[1 - i]  # the other node is returned empty after each step
        expected = table.states[i].take(WHOLE, shares)
        table.take(i, WHOLE, shares)
        assert table.states[i] == expected
        assert table.keys[i] == table._key_ids[(table._kind_of[i], expected)]
        table.set_state(i, table.states[i].give(WHOLE, shares))
        assert table.states[i] == empty
    assert table.key_count == 3  # empty, GPU 0 taken, GPU 1 taken


def test_scores_stay_exact_across_a_renumbering(monkeypatch):
    renumbered = []
    renumber = nodes.NodeTable._renumber
    monkeypatch.setattr(nodes.NodeTable, "_renumber", lambda table: renumbered.append(1) or renumber(table))
    monkeypatch.setattr(nodes, "_KEY_LIMIT", 2)
    table = table_of(*[make_node(f"n{i}", gpus=2) for i in range(4)])
    placer = Framework.build(placement_profile("bestfit"), default_registry()).plugins.placer
    rng = random.Random(0)
    for _ in range(6):
        i = placer.choose(table, WHOLE, rng)
        assert i is not None
        table.set_state(i, table.states[i].take(WHOLE, placer.pick(table, i, WHOLE, rng)))
        scores = placer.scores(table, WHOLE)
        assert [int(v) for v in scores] == [placer._evaluate(k, s, WHOLE) for k, s in
                                           zip(table.kinds, table.states, strict=True)]
    assert renumbered


WHOLE = make_shape(1000)
FIRST_GPU = (DeviceShare(0, 1000),)
