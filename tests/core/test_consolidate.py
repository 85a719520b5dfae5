"""Consolidation: a blocked job starts after moves; only movable tasks move; budgets hold."""

from __future__ import annotations

import random

import pytest

from gpupool.core import Bind, ClusterSnapshot, FixedClock, Framework, default_registry, placement_profile, run_cycle
from gpupool.core.decisions import Move
from gpupool.core.testing.builders import make_job, make_node, make_shape, run_on, table_of

ONE, TWO = make_shape(1000), make_shape(1000, gpu_count=2)


def _cluster(preemptible=True, checkpointable=False):
    table = table_of(make_node("n1", gpus=2), make_node("n2", gpus=2))
    running = {}
    run_on(table, running, "n1", "a/0", ONE, [0], preemptible, checkpointable)
    run_on(table, running, "n2", "b/0", ONE, [0], preemptible, checkpointable)
    return table, running


def _cycle(table, running, job, recent=(), now=10_000.0, **budget):
    profile = placement_profile("bestfit").with_actions("allocate", "consolidate").with_args("consolidate", **budget)
    framework = Framework.build(profile, default_registry())
    snapshot = ClusterSnapshot(table, (job,), running, recent_moves=tuple(recent))
    return run_cycle(snapshot, framework, clock=FixedClock(now), rng=random.Random(0))


def test_blocked_two_gpu_job_starts_after_one_move():
    table, running = _cluster()
    result = _cycle(table, running, make_job("big", TWO))
    moves = [d for d in result.decisions if isinstance(d, Move)]
    binds = [d for d in result.decisions if isinstance(d, Bind)]
    assert len(moves) == 1 and moves[0].from_node != moves[0].node
    assert binds[0].job_id == "big" and binds[0].node == moves[0].from_node
    assert "big" not in result.pending


@pytest.mark.parametrize(("preemptible", "checkpointable", "want_moves"),
                         [(False, False, 0), (False, True, 1), (True, False, 1)],
                         ids=["protected task never moves", "checkpointable moves", "preemptible moves"])
def test_only_movable_tasks_move(preemptible, checkpointable, want_moves):
    table, running = _cluster(preemptible, checkpointable)
    result = _cycle(table, running, make_job("big", TWO))
    assert sum(isinstance(d, Move) for d in result.decisions) == want_moves
    assert ("big" in result.pending) == (want_moves == 0)


@pytest.mark.parametrize(("budget", "recent"), [({"max_moves_per_cycle": 0}, ()),
                                                ({"max_moves_per_hour": 3}, (9000.0, 9500.0, 9900.0))],
                         ids=["no moves this cycle", "hourly budget spent"])
def test_budget_is_respected(budget, recent):
    table, running = _cluster()
    result = _cycle(table, running, make_job("big", TWO), recent, **budget)
    assert result.decisions == () and "big" in result.pending


def test_moves_older_than_an_hour_do_not_count():
    table, running = _cluster()
    result = _cycle(table, running, make_job("big", TWO), (1000.0, 2000.0, 3000.0), max_moves_per_hour=3)
    assert any(isinstance(d, Move) for d in result.decisions)


def test_a_job_needing_more_moves_than_the_budget_waits_and_nothing_moves():
    table = table_of(make_node("n1", gpus=4), make_node("n2", gpus=4))
    running = {}
    for k in range(2):
        run_on(table, running, "n1", f"a{k}/0", ONE)
        run_on(table, running, "n2", f"b{k}/0", ONE)
    four = make_shape(1000, gpu_count=4)
    result = _cycle(table, running, make_job("big", four), max_moves_per_cycle=1)
    assert result.decisions == ()
    result = _cycle(table, running, make_job("big", four), max_moves_per_cycle=2)
    assert sum(isinstance(d, Move) for d in result.decisions) == 2
