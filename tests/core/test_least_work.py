"""The least-work victim order: lowest priority, most recently started, smallest, task id; whatever the
order of the candidates, and with a task that restarted ranked by its new start."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.plugins.victims.least_work import LeastWorkVictims
from gpupool.core.snapshot import RunningTask
from gpupool.core.testing.builders import make_job, make_shape

PREEMPTOR = make_job("p", make_shape(1000))


def _task(k: int, priority: int, started_at: float, gpus: int) -> RunningTask:
    return RunningTask(f"t{k}/0", f"t{k}", "n1", make_shape(1000, gpu_count=gpus), (), priority=priority,
                       started_at=started_at)


def test_low_priority_then_recent_then_small_then_id():
    tasks = [_task(0, 1, 10.0, 1), _task(1, 0, 10.0, 2), _task(2, 0, 20.0, 4), _task(3, 0, 10.0, 1),
             _task(4, 0, 10.0, 1)]
    order = LeastWorkVictims().order_victims(PREEMPTOR, tasks)
    assert [t.task_id for t in order] == ["t2/0", "t3/0", "t4/0", "t1/0", "t0/0"]


def test_a_restarted_task_is_ranked_by_its_new_start():
    plugin = LeastWorkVictims()
    old, other = _task(0, 0, 10.0, 1), _task(1, 0, 50.0, 1)
    assert [t.task_id for t in plugin.order_victims(PREEMPTOR, [old, other])] == ["t1/0", "t0/0"]
    restarted = dataclasses.replace(old, started_at=90.0)  # same task id, a new object
    assert [t.task_id for t in plugin.order_victims(PREEMPTOR, [restarted, other])] == ["t0/0", "t1/0"]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_the_order_does_not_depend_on_the_order_of_the_candidates(rows, rng):
    plugin = LeastWorkVictims()
    tasks = [_task(k, p, float(s), g) for k, (p, s, g) in enumerate(rows)]
    shuffled = list(tasks)
    rng.shuffle(shuffled)
    assert plugin.order_victims(PREEMPTOR, shuffled) == LeastWorkVictims().order_victims(PREEMPTOR, tasks)
