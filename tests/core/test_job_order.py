"""Order of jobs inside a fair-share queue: by submission, or by expected end (submission + estimate)."""

from __future__ import annotations

import random

import pytest

from gpupool.core import (
    Bind,
    ClusterSnapshot,
    FixedClock,
    Framework,
    QueueSpec,
    QueueTree,
    ResourceVector,
    default_registry,
    run_cycle,
    scheduling_profile,
)
from gpupool.core.plugins.queue_order.fair_share import FairShareQueueOrder
from gpupool.core.queues import GPU_UNITS
from gpupool.core.testing.builders import make_job, make_node, make_shape, table_of

ONE = make_shape(1000)


def _jobs():
    # a long job first, then a short one a minute later, then one without an estimate
    return [make_job("long", ONE, queue="A", submitted_at=0.0, runtime_estimate_s=7200.0),
            make_job("short", ONE, queue="A", submitted_at=60.0, runtime_estimate_s=600.0),
            make_job("unknown", ONE, queue="A", submitted_at=120.0)]


@pytest.mark.parametrize(("job_order", "expected"), [
    ("submitted", ["long", "short", "unknown"]),
    # expected ends: long 7200, short 660, unknown 120 (no estimate: keeps its submission time)
    ("expected_end", ["unknown", "short", "long"]),
])
def test_job_order_inside_a_queue(job_order, expected):
    plugin = FairShareQueueOrder(job_order)
    assert [j.id for j in sorted(_jobs(), key=plugin.job_key)] == expected


def test_priority_comes_before_the_expected_end():
    plugin = FairShareQueueOrder("expected_end")
    urgent = make_job("urgent", ONE, queue="A", priority=1, submitted_at=500.0, runtime_estimate_s=86_400.0)
    assert sorted([*_jobs(), urgent], key=plugin.job_key)[0] is urgent


def test_a_job_is_passed_only_by_jobs_submitted_before_its_expected_end():
    plugin = FairShareQueueOrder("expected_end")
    long = make_job("long", ONE, queue="A", submitted_at=0.0, runtime_estimate_s=7200.0)
    later = make_job("later", ONE, queue="A", submitted_at=7201.0, runtime_estimate_s=1.0)
    assert sorted([later, long], key=plugin.job_key) == [long, later]


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
