"""The placement engine's cached scores always equal a fresh evaluation (Hypothesis)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import Framework, Workload, default_registry, placement_profile
from gpupool.core.fit import node_fits
from gpupool.core.placement import FEASIBLE_MIN
from gpupool.core.testing.builders import make_node, make_shape, table_of

SHAPES = [make_shape(250, cpu_milli=2000), make_shape(1000), make_shape(1000, gpu_count=4),
          make_shape(0, cpu_milli=8000)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["fgd", "best", "bestfit", "gpupacking", "gpuclustering", "dotprod", "spread"]),
       st.lists(st.integers(0, len(SHAPES) - 1), min_size=1, max_size=40), st.integers(0, 10_000))
def test_cached_scores_match_fresh_evaluation(policy, arrivals, seed):
    table = table_of(*[make_node(f"n{i}", gpus=g, cpu_milli=16_000 * g) for i, g in enumerate([1, 2, 4, 8, 8])])
    prof = placement_profile(policy).with_workload(Workload.from_shapes(SHAPES))
    placer = Framework.build(prof, default_registry()).placer
    rng = random.Random(seed)
    for k in arrivals:
        shape = SHAPES[k]
        scores = placer.scores(table, shape)
        for i, (kind, state) in enumerate(zip(table.kinds, table.states, strict=True)):
            fresh = placer._evaluate(kind, state, shape)
            assert scores[i] == fresh
            assert (scores[i] >= FEASIBLE_MIN) == (node_fits(kind, state, shape) == "")
        i = placer.choose(table, shape, rng)
        if i is not None:
            table.set_state(i, table.states[i].take(shape, placer.pick(table, i, shape, rng)))
