"""Order of jobs inside a fair-share queue: by submission, or by expected end (submission + estimate), and overdue
jobs (waited longer than their estimate) first."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpupool.core import (
    Bind,
    ClusterSnapshot,
    FixedClock,
    Framework,
    PendingKind,
    QueueSpec,
    QueueTree,
    ResourceVector,
    default_registry,
    run_cycle,
    scheduling_profile,
)
from gpupool.core.plugins.queue_order.fair_share import FairShareQueueOrder
from gpupool.core.queues import GPU_UNITS
from gpupool.core.testing.builders import make_job, make_node, make_shape, run_on, table_of

ONE, TWO = make_shape(1000), make_shape(1000, gpu_count=2)


def _jobs():
    # a long job first, then a short one a minute later, then one without an estimate
    return [make_job("long", ONE, queue="A", submitted_at=0.0, runtime_estimate_s=7200.0),
            make_job("short", ONE, queue="A", submitted_at=60.0, runtime_estimate_s=600.0),
            make_job("unknown", ONE, queue="A", submitted_at=120.0)]


def _ordered(plugin, jobs, now=0.0):
    return sorted(jobs, key=lambda j: plugin.job_key(j, now))


@pytest.mark.parametrize(("job_order", "expected"), [
    ("submitted", ["long", "short", "unknown"]),
    # expected ends: long 7200, short 660, unknown 120 (no estimate: keeps its submission time)
    ("expected_end", ["unknown", "short", "long"]),
])
def test_job_order_inside_a_queue(job_order, expected):
    plugin = FairShareQueueOrder(job_order)
    assert [j.id for j in _ordered(plugin, _jobs())] == expected
    assert [j.id for j in _ordered(plugin, _jobs(), now=10**6)] == expected  # without overdue_first, time is no matter


def test_priority_comes_before_the_expected_end():
    plugin = FairShareQueueOrder("expected_end")
    urgent = make_job("urgent", ONE, queue="A", priority=1, submitted_at=500.0, runtime_estimate_s=86_400.0)
    assert _ordered(plugin, [*_jobs(), urgent])[0] is urgent


def test_a_job_is_passed_only_by_jobs_submitted_before_its_expected_end():
    plugin = FairShareQueueOrder("expected_end")
    long = make_job("long", ONE, queue="A", submitted_at=0.0, runtime_estimate_s=7200.0)
    later = make_job("later", ONE, queue="A", submitted_at=7201.0, runtime_estimate_s=1.0)
    assert _ordered(plugin, [later, long]) == [long, later]


def test_the_default_profile_starts_the_shorter_job_on_the_last_free_gpu():
    tree = QueueTree([QueueSpec("A", guaranteed=ResourceVector({GPU_UNITS: 1000}))])
    snapshot = ClusterSnapshot(table_of(make_node("n1", gpus=1)), tuple(_jobs()[:2]), {}, queues=tree)
    started = {}
    for name in ("fair-share", "default"):
        framework = Framework.build(scheduling_profile(name, "bestfit"), default_registry())
        result = run_cycle(snapshot, framework, clock=FixedClock(300.0), rng=random.Random(0))
        started[name] = [d.job_id for d in result.decisions if isinstance(d, Bind)]
    assert started == {"fair-share": ["long"], "default": ["short"]}


def test_an_unknown_job_order_is_refused():
    with pytest.raises(ValueError, match="job_order"):
        FairShareQueueOrder("shortest")
    with pytest.raises(ValueError, match="overdue_first"):
        FairShareQueueOrder("expected_end", overdue_first="yes")
    for bad in (0, -0.5, "half", True):
        with pytest.raises(ValueError, match="overdue_after"):
            FairShareQueueOrder("expected_end", overdue_first=True, overdue_after=bad)


# a low-priority job of 10 min submitted at 0; high-priority jobs of 1 h submitted at 60 and 120; one without an
# estimate at 0 (never overdue)
LOW = make_job("low", ONE, queue="A", submitted_at=0.0, runtime_estimate_s=600.0)
HIGH = [make_job(f"high{i}", ONE, queue="A", priority=10, submitted_at=60.0 * i, runtime_estimate_s=3600.0)
        for i in (1, 2)]
NONE = make_job("none", ONE, queue="A", submitted_at=0.0)


@pytest.mark.parametrize(("now", "expected"), [
    (599.0, ["high1", "high2", "none", "low"]),  # low is not overdue yet: priority first
    (600.0, ["low", "high1", "high2", "none"]),  # low's expected end has passed: it goes first
    (3660.0, ["low", "high1", "high2", "none"]),  # high1 overdue too: overdue jobs by expected end (600 < 3660)
    (3720.0, ["low", "high1", "high2", "none"]),
])
def test_overdue_jobs_go_first_by_expected_end(now, expected):
    plugin = FairShareQueueOrder("expected_end", overdue_first=True)
    assert [j.id for j in _ordered(plugin, [*HIGH, NONE, LOW], now)] == expected


@pytest.mark.parametrize(("now", "expected"), [
    (299.0, ["high1", "high2", "none", "low"]),
    (300.0, ["low", "high1", "high2", "none"]),  # low has waited half its estimate
])
def test_overdue_after_a_fraction_of_the_estimate(now, expected):
    plugin = FairShareQueueOrder("expected_end", overdue_first=True, overdue_after=0.5)
    assert [j.id for j in _ordered(plugin, [*HIGH, NONE, LOW], now)] == expected


def test_overdue_jobs_by_submission_when_the_order_is_by_submission():
    plugin = FairShareQueueOrder("submitted", overdue_first=True)
    late_short = make_job("late_short", ONE, queue="A", submitted_at=100.0, runtime_estimate_s=1.0)
    early_long = make_job("early_long", ONE, queue="A", submitted_at=0.0, runtime_estimate_s=500.0)
    assert [j.id for j in _ordered(plugin, [late_short, early_long], 500.0)] == ["early_long", "late_short"]
    assert [j.id for j in _ordered(plugin, [late_short, early_long, *HIGH], 200.0)] == [
        "late_short", "high1", "high2", "early_long"]


@pytest.mark.parametrize(("overdue_first", "holder"), [(False, "high"), (True, "low")])
def test_the_reservation_goes_to_the_overdue_job_whatever_its_priority(overdue_first, holder):
    # one 2-GPU node, busy until t=3000; "low" (10 min, submitted at 0) is overdue at t=2000, "high" is not
    tree = QueueTree([QueueSpec("A", guaranteed=ResourceVector({GPU_UNITS: 2000}))])
    table = table_of(make_node("n1", gpus=2))
    running = {}
    task = run_on(table, running, "n1", "busy/0", make_shape(1000, gpu_count=2), started_at=0.0)
    running["busy/0"] = replace(task, expected_end=3000.0)
    low = make_job("low", TWO, queue="A", submitted_at=0.0, runtime_estimate_s=600.0)
    high = make_job("high", TWO, queue="A", priority=10, submitted_at=100.0, runtime_estimate_s=3600.0)
    profile = scheduling_profile("default", "bestfit").with_args(
        "fair_share", job_order="expected_end", overdue_first=overdue_first)
    result = run_cycle(ClusterSnapshot(table, (high, low), running, queues=tree),
                       Framework.build(profile, default_registry()), clock=FixedClock(2000.0), rng=random.Random(0))
    other = ({"low", "high"} - {holder}).pop()
    reason = result.pending[holder]
    assert reason.kind is PendingKind.BACKFILL_WINDOW and reason.at == 3000
    assert result.pending[other].kind is PendingKind.NO_NODE_FITS


@pytest.mark.parametrize("name", ["fair-share", "default"])
def test_queues_take_turns_as_each_start_changes_their_share(name):
    # two queues with equal guarantees, 4 jobs each, 4 free GPUs: a queue's key is recomputed after each of its jobs
    # starts, so they alternate and each gets 2 (queue A, submitting first, does not take all 4)
    tree = QueueTree([QueueSpec(q, guaranteed=ResourceVector({GPU_UNITS: 2000})) for q in ("A", "B")])
    jobs = tuple(make_job(f"{q}{k}", ONE, queue=q, submitted_at=float(k + (q == "B")), runtime_estimate_s=600.0)
                 for q in ("A", "B") for k in range(4))
    snapshot = ClusterSnapshot(table_of(make_node("n1", gpus=4)), jobs, {}, queues=tree)
    framework = Framework.build(scheduling_profile(name, "bestfit"), default_registry())
    result = run_cycle(snapshot, framework, clock=FixedClock(60.0), rng=random.Random(0))
    assert sorted(d.job_id for d in result.decisions if isinstance(d, Bind)) == ["A0", "A1", "B0", "B1"]
