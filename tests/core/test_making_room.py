"""Making room searches no further than it must: each candidate node is tried as soon as it is found, and reclaim
skips the search when the share rule refuses every victim it could list (Hypothesis: exactly when it refuses a
victim that holds no GPU)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import (
    ClusterSnapshot,
    FixedClock,
    Framework,
    QueueSpec,
    QueueTree,
    default_registry,
    placement_profile,
    scheduling_profile,
)
from gpupool.core.actions.reclaim import _JobUnits, _KeepsShare
from gpupool.core.actions.room import make_room
from gpupool.core.framework import Cycle
from gpupool.core.testing.builders import gpu_units, make_job, make_node, make_shape, run_on, table_of

ONE = make_shape(1000)
NO_GPU = make_shape(0, cpu_milli=1000)


def test_making_room_tries_each_candidate_as_soon_as_it_is_found():
    """Four full nodes, each a candidate: the first works, so no victim of another node is even asked about."""
    table = table_of(*[make_node(f"n{i}", gpus=4) for i in range(4)])
    running: dict = {}
    for k in range(16):
        run_on(table, running, f"n{k // 4}", f"j{k}/0", ONE)
    framework = Framework.build(placement_profile("bestfit"), default_registry())
    cycle = Cycle(ClusterSnapshot(table, (), running), framework.plugins, FixedClock(0.0), random.Random(0))
    asked: set[str] = set()

    def may_take(task):
        asked.add(task.node)
        return True

    with cycle.statement() as stmt:
        made = make_room(cycle, stmt, ONE, list(running.values()), list, may_take, None, 16, "reclaimed")
    assert made == (0, 1)
    assert asked == {"n0"}



@settings(max_examples=60, deadline=None)
@given(guaranteed=st.lists(st.integers(0, 6), min_size=3, max_size=3),
       held=st.lists(st.lists(st.integers(1, 3), max_size=4), min_size=3, max_size=3),
       nested=st.booleans(), guarantee=st.booleans())
def test_a_reclaimer_refuses_a_whole_queue_exactly_when_it_refuses_a_victim_holding_no_gpu(
        guaranteed, held, nested, guarantee):
    """Queues A, B (under P when nested) and C hold jobs of 1-3 GPUs and one job without GPU each; a 1-GPU job of
    A asks. For each victim queue, `refuses_all` agrees with the rule on the job without GPU, and when it holds
    the rule refuses every job of that queue."""
    parent = [QueueSpec("P", guaranteed=gpu_units(guaranteed[1] + guaranteed[2]))] if nested else []
    tree = QueueTree(parent + [QueueSpec(q, parent="P" if nested and q != "A" else None, guaranteed=gpu_units(g))
                               for q, g in zip("ABC", guaranteed, strict=True)])
    table = table_of(*[make_node(f"n{i}", gpus=8) for i in range(6)])
    running: dict = {}
    for n, (queue, sizes) in enumerate(zip("ABC", held, strict=True)):
        for k, size in enumerate(sizes):
            run_on(table, running, f"n{2 * n + k // 2}", f"{queue}{k}/0", make_shape(1000, gpu_count=size),
                   queue=queue)
        run_on(table, running, f"n{2 * n}", f"{queue}-cpu/0", NO_GPU, queue=queue)
    job = make_job("asker", ONE, queue="A")
    framework = Framework.build(scheduling_profile("fair-share", "bestfit"), default_registry())
    cycle = Cycle(ClusterSnapshot(table, (job,), running, queues=tree), framework.plugins, FixedClock(3600.0),
                  random.Random(0))
    may_take = _KeepsShare(cycle, tree, job, _JobUnits(cycle), guarantee)
    for queue in "BC":
        refused = may_take.refuses_all([queue])
        assert refused == (not may_take(running[f"{queue}-cpu/0"]))
        if refused:
            assert not any(may_take(t) for t in running.values() if t.queue == queue)
    assert may_take.refuses_all(["B", "C"]) == (may_take.refuses_all(["B"]) and may_take.refuses_all(["C"]))
