"""Making room groups its victims by node once per list and cycle; after evictions and moves in the cycle the
grouping it uses, and its order of nodes by victim GPU, equal those made afresh from the tasks as they run now
(Hypothesis)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import ClusterSnapshot, FixedClock, Framework, default_registry, placement_profile
from gpupool.core.actions.room import _by_node
from gpupool.core.framework import Cycle
from gpupool.core.testing.builders import make_node, make_shape, run_on, table_of

WHOLE = make_shape(1000)


def _fresh(cycle: Cycle, victims) -> tuple[dict, list]:
    by_node: dict = {}
    for task in victims:
        current = cycle.workspace.running(task.task_id)
        if current is not None and current.node == task.node:
            by_node.setdefault(cycle.workspace.table.index[task.node], []).append(current)
    return by_node, sorted((sum(t.shape.total_gpu_milli for t in ts), i) for i, ts in by_node.items())


def _used(cycle: Cycle, victims) -> tuple[dict, list]:
    by_node, ascending = _by_node(cycle, victims)
    return by_node, list(ascending)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["evict", "move"]), st.integers(0, 11)), max_size=8))
def test_the_grouping_follows_evictions_and_moves(changes):
    table = table_of(*[make_node(f"n{i}", gpus=4) for i in range(4)])
    running: dict = {}
    for k in range(12):
        run_on(table, running, f"n{k % 3}", f"j{k}/0", WHOLE)  # n3 stays empty: moves go there
    framework = Framework.build(placement_profile("bestfit"), default_registry())
    cycle = Cycle(ClusterSnapshot(table, (), running), framework.plugins, FixedClock(0.0), random.Random(0))
    victims = sorted(running.values(), key=lambda t: t.task_id)
    assert _used(cycle, victims) == _fresh(cycle, victims)
    with cycle.statement() as stmt:
        for action, k in changes:
            task = cycle.workspace.running(f"j{k}/0")
            if task is None:
                continue
            if action == "evict":
                stmt.evict(task, "test")
            elif task.node != "n3" and table.states[3].gpu_idle >= 1000:
                stmt.move(task, 3, framework.plugins.placer.pick(table, 3, WHOLE, cycle.rng))
            assert _used(cycle, victims) == _fresh(cycle, victims)
