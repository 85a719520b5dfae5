"""The queue meter: GPU time received against fair share per window, measured on the state after each cycle."""

from __future__ import annotations

import pytest

from gpupool.core import QueueSpec, QueueTree, ResourceVector, scheduling_profile
from gpupool.core.queues import GPU_UNITS
from gpupool.core.testing.builders import make_job, make_node, make_shape
from gpupool.sim.meter import QueueMeter
from gpupool.sim.replay import JobArrival, Replay
from gpupool.sim.replay_report import run_summary

TREE = QueueTree([QueueSpec("a", guaranteed=ResourceVector({GPU_UNITS: 2000})),
                  QueueSpec("b", guaranteed=ResourceVector({GPU_UNITS: 2000}))])


def _gpus(**per_queue):
    return {q: ResourceVector({GPU_UNITS: 1000 * n}) for q, n in per_queue.items()}


def test_a_waiting_queue_is_due_its_fair_share_and_an_idle_one_what_it_uses():
    meter = QueueMeter(TREE, start=0.0, window_s=100.0)
    meter.update(0.0, _gpus(a=1, b=1), {"a": 3000, "b": 1000}, {"a"}, 4000)
    meter.advance(100.0)
    window = meter.windows[0]
    assert window.received == {"a": 100_000, "b": 100_000}
    assert window.fair == {"a": 300_000, "b": 100_000}
    assert window.demand == {"a"}
    assert meter.worst_deviation() == (pytest.approx(2 / 3), 0, "a")


def test_only_complete_windows_count_and_a_drain_window_is_one():
    meter = QueueMeter(TREE, start=0.0, window_s=100.0)
    meter.update(0.0, _gpus(a=2), {"a": 2000}, {"a"}, 4000)
    meter.update(150.0, _gpus(a=1), {"a": 2000}, {"a"}, 4000)  # arrivals stopped; a still waits
    meter.advance(220.0)
    assert meter.worst_deviation() == (pytest.approx(0.25), 1, "a")  # window 1: 50·2 + 50·1 of 200
    meter.advance(320.0)  # window 2 is complete now: a received half of what it was due
    assert meter.worst_deviation() == (pytest.approx(0.5), 2, "a")
    assert [(w, q, received / fair) for w, q, received, fair in meter.window_deviations()] == [
        (0, "a", 1.0), (1, "a", pytest.approx(0.75)), (2, "a", pytest.approx(0.5))]


def test_the_summary_lists_every_window_of_every_queue_with_demand():
    day = 86_400.0
    run = _replay([_arrival("b-long", "b", 0.0, 2 * day, gpus=2), _arrival("a-long", "a", 1.0, 2 * day, gpus=2)],
                  nodes=1)
    summary = run_summary(run, timing=False)
    windows = summary["fair_share_windows"]
    assert windows and {row["window"] for row in windows} <= {0, 1, 2, 3}
    assert {row["queue"] for row in windows} <= {"a", "b"}
    worst = max(abs(row["deviation_pct"]) for row in windows)
    assert worst == pytest.approx(summary["fair_share_max_deviation_pct"], abs=0.01) and worst > 0


def _replay(arrivals, nodes=2):
    profile = scheduling_profile("fair-share", "bestfit")
    run = Replay([make_node(f"n{i}", gpus=2) for i in range(nodes)], arrivals, profile, seed=1, queues=TREE).run()
    return run


def _arrival(name, queue, at, runtime, gpus=1):
    job = make_job(name, make_shape(1000, gpu_count=gpus), queue=queue, submitted_at=at, runtime_estimate_s=runtime)
    return JobArrival(at, job, runtime)


def test_jobs_placed_in_the_cycle_of_their_arrival_make_no_wait():
    run = _replay([_arrival(f"a{k}", "a", 10.0 * k, 50.0) for k in range(10)])
    window = run.meter.windows[0]
    assert window.fair["a"] == window.received["a"] > 0
    assert run.meter.worst_deviation()[0] == 0


def test_a_job_that_never_fits_is_rejected_and_is_no_demand():
    run = _replay([_arrival("a-huge", "a", 0.0, 50.0, gpus=4), _arrival("b1", "b", 0.0, 86_400.0 * 2)], nodes=1)
    huge = run.records["a-huge"]
    assert huge.rejected and huge.first_start is None and "rejected at submission" in huge.last_reason.message
    assert "a" not in run.meter.windows[0].demand
    assert run.meter.worst_deviation()[0] == 0
