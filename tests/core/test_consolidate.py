"""Consolidation: a blocked job starts after moves; only movable tasks move; budgets hold."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from gpupool.core import Bind, ClusterSnapshot, FixedClock, Framework, default_registry, placement_profile, run_cycle
from gpupool.core.actions.consolidate import ConsolidateAction
from gpupool.core.decisions import Move
from gpupool.core.testing.builders import make_job, make_node, make_shape, run_on, table_of

ONE, TWO = make_shape(1000), make_shape(1000, gpu_count=2)


def _cluster(preemptible=True, checkpointable=False, started_at=9_900.0):
    table = table_of(make_node("n1", gpus=2), make_node("n2", gpus=2))
    running = {}
    run_on(table, running, "n1", "a/0", ONE, [0], preemptible, checkpointable, started_at=started_at)
    run_on(table, running, "n2", "b/0", ONE, [0], preemptible, checkpointable, started_at=started_at)
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


@pytest.mark.parametrize(("checkpointable", "ran_s", "moves"),
                         [(False, 600.0, 1), (False, 601.0, 0), (True, 10_000.0, 1)],
                         ids=["lost work within the cap", "more work than the cap", "checkpointable loses none"])
def test_a_task_that_would_start_over_moves_only_if_little_work_is_lost(checkpointable, ran_s, moves):
    table, running = _cluster(checkpointable=checkpointable, started_at=10_000.0 - ran_s)
    result = _cycle(table, running, make_job("big", TWO))
    assert sum(isinstance(d, Move) for d in result.decisions) == moves


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
        run_on(table, running, "n1", f"a{k}/0", ONE, started_at=9_900.0)
        run_on(table, running, "n2", f"b{k}/0", ONE, started_at=9_900.0)
    four = make_shape(1000, gpu_count=4)
    result = _cycle(table, running, make_job("big", four), max_moves_per_cycle=1)
    assert result.decisions == ()
    result = _cycle(table, running, make_job("big", four), max_moves_per_cycle=2)
    assert sum(isinstance(d, Move) for d in result.decisions) == 2


def _reserved_cycle(with_head: bool):
    """n2's free GPU is the only place a task moved off n1 can go; the A100 head job H holds n2 from t=100."""
    table = table_of(make_node("n1", gpus=2, model="T4"), make_node("n2", gpus=2, model="A100"))
    running = {}
    run_on(table, running, "n1", "a/0", ONE)
    b = run_on(table, running, "n2", "b/0", ONE, preemptible=False)
    running["b/0"] = replace(b, expected_end=100.0)
    pending = (make_job("x", make_shape(1000, gpu_count=2), runtime_estimate_s=10_000.0),)
    if with_head:
        pending = (make_job("h", make_shape(1000, gpu_count=2, models=["A100"]), priority=10,
                            runtime_estimate_s=50.0), *pending)
    profile = placement_profile("bestfit").with_actions("allocate", "consolidate").with_args(
        "allocate", backfill="easy", max_reservations=1).with_args("consolidate", max_moves_per_cycle=4)
    snapshot = ClusterSnapshot(table, pending, running)
    return run_cycle(snapshot, Framework.build(profile, default_registry()), clock=FixedClock(10.0),
                     rng=random.Random(0))


def test_moves_keep_off_nodes_reserved_for_another_job():
    free = _reserved_cycle(with_head=False)
    assert "x" not in free.pending and any(isinstance(d, Move) and d.node == "n2" for d in free.decisions)
    held = _reserved_cycle(with_head=True)
    assert held.decisions == () and {"h", "x"} <= set(held.pending)


def test_checkpointable_tasks_move_before_tasks_that_would_start_over():
    table = table_of(make_node("n1", gpus=3), make_node("n2", gpus=2))
    running = {}
    run_on(table, running, "n1", "old/0", ONE, preemptible=False, checkpointable=True, started_at=0.0)
    run_on(table, running, "n1", "new/0", ONE, started_at=9_000.0)  # least work lost, but it would start over
    run_on(table, running, "n2", "c/0", ONE, preemptible=False)
    result = _cycle(table, running, make_job("big", TWO))
    assert [d.task_id for d in result.decisions if isinstance(d, Move)] == ["old/0"]
    assert "big" not in result.pending


def test_no_search_without_attempts():
    table, running = _cluster()
    assert _cycle(table, running, make_job("big", TWO), max_attempts=0).decisions == ()
    with pytest.raises(ValueError, match="max_attempts"):
        ConsolidateAction(max_attempts=-1)


@pytest.mark.parametrize(("submitted_at", "moves"), [(2_801.0, 0), (2_800.0, 1)],
                         ids=["waited under min_wait_s", "waited min_wait_s"])
def test_only_a_job_that_has_waited_long_enough_moves_tasks(submitted_at, moves):
    table, running = _cluster()
    result = _cycle(table, running, make_job("big", TWO, submitted_at=submitted_at), min_wait_s=7_200.0)
    assert sum(isinstance(d, Move) for d in result.decisions) == moves


@pytest.mark.parametrize(("checkpointable", "ran_s", "moves"),
                         [(False, 2_000.0, 1), (False, 2_001.0, 0), (True, 1e6, 1)],
                         ids=["restart loses what the job waited", "restart loses more", "checkpointable loses none"])
def test_lost_work_within_wait_bounds_a_restart_by_the_jobs_waited_gpu_time(checkpointable, ran_s, moves):
    """The 2-GPU job has waited 1,000 s (2,000 GPU-seconds); each 1-GPU victim loses what it has run."""
    table, running = _cluster(checkpointable=checkpointable, started_at=10_000.0 - ran_s)
    result = _cycle(table, running, make_job("big", TWO, submitted_at=9_000.0), max_lost_work_s=math.inf,
                    lost_work_within_wait=True)
    assert sum(isinstance(d, Move) for d in result.decisions) == moves


@pytest.mark.parametrize(("args", "field"), [({"min_wait_s": -1.0}, "min_wait_s"),
                                             ({"min_wait_s": math.nan}, "min_wait_s"),
                                             ({"lost_work_within_wait": "yes"}, "lost_work_within_wait")])
def test_bad_starvation_arguments_are_refused_by_name(args, field):
    with pytest.raises(ValueError, match=field):
        ConsolidateAction(**args)
