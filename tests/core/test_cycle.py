"""run_cycle: snapshot in (unchanged), decisions out; gangs all-or-nothing; reasons for what waits."""

from __future__ import annotations

import random

from gpupool.core import Bind, ClusterSnapshot, FixedClock, Framework, PendingKind, default_registry, run_cycle
from gpupool.core import placement_profile as profile
from gpupool.core.testing.builders import make_job, make_node, make_shape, table_of


def _run(table, *jobs, policy="bestfit"):
    framework = Framework.build(profile(policy), default_registry())
    return run_cycle(ClusterSnapshot(table, tuple(jobs)), framework, clock=FixedClock(), rng=random.Random(1))


def test_snapshot_is_returned_unchanged():
    table = table_of(make_node("a"), make_node("b"))
    before = list(table.states)
    result = _run(table, make_job("j1", make_shape(1000)), make_job("j2", make_shape(1000, gpu_count=2)))
    assert len(result.decisions) == 2
    assert table.states == before


def test_gang_places_all_tasks_or_none():
    table = table_of(make_node("a", gpus=2), make_node("b", gpus=2))
    fits = make_job("fits", *[make_shape(1000, gpu_count=2)] * 2)
    too_big = make_job("too-big", *[make_shape(1000, gpu_count=2)] * 3, submitted_at=1)
    result = _run(table, fits, too_big)
    assert {d.job_id for d in result.decisions} == {"fits"}
    result = _run(table, too_big)
    assert result.decisions == ()
    assert result.pending["too-big"].kind is PendingKind.NO_NODE_FITS
    assert "task 3 of 3" in result.pending["too-big"].message


def test_each_job_is_told_which_of_its_own_tasks_fits_nowhere():
    """The "no node fits" explanation is reused across jobs of one shape, but each job's message counts its own
    tasks (a cached reason once told a one-task job about "task 1 of 4")."""
    table = table_of(make_node("a", gpus=1))
    gang = make_job("gang", *[make_shape(1000, gpu_count=2)] * 4)
    single = make_job("single", make_shape(1000, gpu_count=2), submitted_at=1)
    result = _run(table, gang, single)
    assert "task 1 of 4" in result.pending["gang"].message
    assert "the task" in result.pending["single"].message


def test_min_tasks_lets_an_elastic_gang_start_partially():
    table = table_of(make_node("a", gpus=2))
    job = make_job("elastic", *[make_shape(1000)] * 3, min_tasks=2)
    result = _run(table, job)
    assert len(result.decisions) == 2 and "elastic" not in result.pending


def test_later_jobs_see_earlier_placements_in_the_same_cycle():
    table = table_of(make_node("a", gpus=1))
    result = _run(table, make_job("first", make_shape(1000)), make_job("second", make_shape(1000), submitted_at=1))
    assert [d.job_id for d in result.decisions] == ["first"]
    assert "second" in result.pending


def test_why_pending_counts_nodes_by_reason():
    table = table_of(make_node("a", model="T4"), make_node("b", model="T4"), (make_node("c", model="V100"), [0, 0]))
    result = _run(table, make_job("j", make_shape(1000, models=["V100"])))
    reason = result.pending["j"]
    assert dict(reason.details) == {"GPU model not allowed": 2, "insufficient GPU": 1}
    assert reason.message.startswith("0/3 nodes")


def test_binds_carry_exact_devices():
    table = table_of((make_node("a", gpus=2), [400, 1000]))
    (bind,) = _run(table, make_job("j", make_shape(300))).decisions
    assert isinstance(bind, Bind) and bind.shares[0].index == 0 and bind.shares[0].milli == 300


def test_why_no_node_fits_is_counted_on_the_nodes_as_the_pass_leaves_them():
    # One GPU and 4 cores free. "big" (2 GPUs) fails first, for want of a GPU; "small" then takes the GPU and
    # every core. The reason "big" shows is the one that holds after the cycle: its first failing check is CPU.
    table = table_of((make_node("a", gpus=2, cpu_milli=8000), [1000, 0], 4000))
    big = make_job("big", make_shape(1000, gpu_count=2, cpu_milli=1000))
    small = make_job("small", make_shape(1000, cpu_milli=4000), submitted_at=1)
    result = _run(table, big, small)
    assert [d.job_id for d in result.decisions] == ["small"]
    assert result.pending["big"].details == (("insufficient CPU", 1),)


def test_a_placement_dearer_than_the_cheapest_model_is_checked_again():
    # the queue may hold 2 GPU units and holds 1; an A100 counts 2 units, a T4 one. The precheck passes the
    # cheapest charge (T4: 1 unit), but only the A100 is free, where the job would hold 3 units: refused
    from gpupool.core import QueueSpec, QueueTree, ResourceVector, scheduling_profile
    from gpupool.core.queues import GPU_UNITS
    from gpupool.core.testing.builders import run_on
    tree = QueueTree([QueueSpec("q", guaranteed=ResourceVector({GPU_UNITS: 2000}),
                                limit=ResourceVector({GPU_UNITS: 2000}))], gpu_units={"A100": 2000, "T4": 1000})
    table = table_of(make_node("a", gpus=1, model="A100"), make_node("t", gpus=1, model="T4"))
    running = {}
    run_on(table, running, "t", "held/0", make_shape(1000), queue="q")
    job = make_job("dear", make_shape(1000, models=["A100", "T4"]), queue="q")
    framework = Framework.build(scheduling_profile("fifo", "bestfit"), default_registry())
    result = run_cycle(ClusterSnapshot(table, (job,), running, queues=tree), framework, clock=FixedClock(0.0),
                       rng=random.Random(0))
    assert result.decisions == ()
    assert result.pending["dear"].kind is PendingKind.OVER_QUOTA and "limit" in result.pending["dear"].message


def test_the_quota_precheck_tells_preemptible_from_non_preemptible_jobs_of_one_shape():
    # minimal charges are remembered per job on the tree: a non-preemptible job must fit the guarantee (0 here), a
    # preemptible one of the same shape only the limit, in whichever order they are asked, also under one job id
    from gpupool.core import QueueSpec, QueueTree, ResourceVector, scheduling_profile
    from gpupool.core.framework import Cycle
    from gpupool.core.queues import GPU_UNITS
    tree = QueueTree([QueueSpec("q", limit=ResourceVector({GPU_UNITS: 4000}))])
    table = table_of(make_node("a", gpus=4))
    framework = Framework.build(scheduling_profile("fifo", "bestfit"), default_registry())
    shape = make_shape(1000)
    for first in (True, False):
        jobs = [make_job(f"j{k}", shape, queue="q", preemptible=p) for k, p in enumerate((first, not first))]
        cycle = Cycle(ClusterSnapshot(table, tuple(jobs), {}, queues=tree), framework.plugins, FixedClock(0.0),
                      random.Random(0))
        verdicts = {job.preemptible: cycle.quota_precheck(job) for job in jobs}
        assert verdicts[True] == "" and "guarantee" in verdicts[False], verdicts


def test_a_new_job_under_a_remembered_id_is_charged_for_its_own_tasks():
    from gpupool.core import QueueSpec, QueueTree, ResourceVector, scheduling_profile
    from gpupool.core.framework import Cycle
    from gpupool.core.queues import GPU_UNITS
    tree = QueueTree([QueueSpec("q", limit=ResourceVector({GPU_UNITS: 4000}))])
    table = table_of(make_node("a", gpus=8))
    framework = Framework.build(scheduling_profile("fifo", "bestfit"), default_registry())
    for gpus, refused in ((8, True), (1, False), (8, True)):
        job = make_job("j", make_shape(1000, gpu_count=gpus), queue="q")
        cycle = Cycle(ClusterSnapshot(table, (job,), {}, queues=tree), framework.plugins, FixedClock(0.0),
                      random.Random(0))
        assert bool(cycle.quota_precheck(job)) is refused, gpus


def test_garbage_collection_waits_for_the_cycle_to_end():
    import gc

    from gpupool.core.framework import Action
    seen = []

    class Probe(Action):
        name = "probe"

        def execute(self, cycle):
            seen.append(gc.isenabled())

    registry = default_registry()
    registry.register(Probe)
    framework = Framework.build(profile("bestfit").with_actions("probe"), registry)
    snapshot = ClusterSnapshot(table_of(make_node("n1")), (), {})
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            run_cycle(snapshot, framework, clock=FixedClock(0.0), rng=random.Random(0))
            assert seen[-1] is False and gc.isenabled() is enabled
        finally:
            gc.enable()
