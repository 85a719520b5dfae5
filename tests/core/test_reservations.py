"""Reservations (ALGORITHMS.md §3.6, §6.5 rule 3) when some running tasks have no expected end."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import (
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
from gpupool.core.actions.reservations import MIN_UNKNOWN_REMAINING_S, blocking, held_nodes, planned_end
from gpupool.core.framework import Cycle, Reservation
from gpupool.core.queues import GPU_UNITS
from gpupool.core.testing.builders import make_job, make_node, make_shape, run_on, table_of

ONE, TWO = make_shape(1000), make_shape(1000, gpu_count=2)
NOW = 1000.0


def rv(gpu_milli: int) -> ResourceVector:
    return ResourceVector({GPU_UNITS: gpu_milli})


def _cycle(jobs, unknown_started_at):
    """Two 2-GPU nodes, one GPU busy on each: n1 until NOW+100, n2 with no expected end."""
    table = table_of(make_node("n1", gpus=2), make_node("n2", gpus=2))
    running = {}
    known = run_on(table, running, "n1", "k/0", ONE)
    running["k/0"] = replace(known, expected_end=NOW + 100)
    run_on(table, running, "n2", "u/0", ONE, started_at=unknown_started_at)
    profile = scheduling_profile("fifo", "bestfit").with_args("allocate", backfill="easy")
    framework = Framework.build(profile, default_registry())
    return run_cycle(ClusterSnapshot(table, tuple(jobs), running), framework, clock=FixedClock(NOW),
                     rng=random.Random(0))


def test_a_gang_needing_a_node_held_by_a_task_of_unknown_length_still_gets_a_reservation():
    gang = make_job("gang", TWO, TWO, runtime_estimate_s=50)
    late = make_job("late", ONE, submitted_at=1, runtime_estimate_s=1000)
    result = _cycle([gang, late], unknown_started_at=NOW - 400)
    # the unknown task has run 400 s, so it is planned to end 400 s from now: the gang holds both nodes then
    assert result.pending["gang"].kind is PendingKind.BACKFILL_WINDOW
    assert result.pending["gang"].at == 1400
    # that start is a guess that slides while the task runs on, so it holds no GPU against a job that fits now
    # (issue 43: a 0.3-GPU job waited minutes beside a free half GPU behind such a start)
    assert [d.job_id for d in result.decisions] == ["late"]


def test_a_short_job_still_backfills_before_the_planned_start():
    short = make_job("short", ONE, submitted_at=1, runtime_estimate_s=300)
    result = _cycle([make_job("gang", TWO, TWO, runtime_estimate_s=50), short], unknown_started_at=NOW - 400)
    assert [d.job_id for d in result.decisions] == ["short"]


@pytest.mark.parametrize(("started_at", "want"), [(NOW - 400, NOW + 400), (NOW - 1, NOW + MIN_UNKNOWN_REMAINING_S)])
def test_a_task_of_unknown_length_is_planned_to_run_as_long_again_as_it_has_run(started_at, want):
    table = table_of(make_node("n1"))
    task = run_on(table, {}, "n1", "u/0", ONE, started_at=started_at)
    assert planned_end(task, NOW) == want
    assert planned_end(replace(task, expected_end=NOW + 5), NOW) == NOW + 5



def test_evicting_actions_keep_off_reserved_nodes():
    # the gang has starved past the guard and holds both nodes from t=1400; "urgent" outranks the
    # running tasks and would preempt one, but it would still run at t=1400, so it must keep off
    gang = make_job("gang", TWO, TWO, submitted_at=NOW - 7201, runtime_estimate_s=50)
    urgent = make_job("urgent", TWO, submitted_at=NOW - 10, priority=10, runtime_estimate_s=1000)
    table = table_of(make_node("n1", gpus=2), make_node("n2", gpus=2))
    running = {}
    for node in ("n1", "n2"):
        run_on(table, running, node, f"{node}-task/0", ONE, started_at=NOW - 400)
    profile = scheduling_profile("priority", "bestfit").with_args("allocate", reserve_after_s=7200.0)
    result = run_cycle(ClusterSnapshot(table, (gang, urgent), running), Framework.build(profile, default_registry()),
                       clock=FixedClock(NOW), rng=random.Random(0))
    assert result.pending["gang"].at == 1400
    assert result.decisions == () and "urgent" in result.pending


def test_a_task_started_in_the_same_cycle_delays_a_later_reservation_to_its_planned_end():
    # n1 has 2 GPUs, one busy until NOW+100; "small" takes the other now (estimate 1000 s), so the gang behind it
    # can hold the node only from NOW+1000, not from NOW+100 (the tasks started this cycle count too)
    table = table_of(make_node("n1", gpus=2))
    running = {}
    task = run_on(table, running, "n1", "k/0", ONE)
    running["k/0"] = replace(task, expected_end=NOW + 100)
    small = make_job("small", ONE, submitted_at=0, runtime_estimate_s=1000)
    gang = make_job("gang", TWO, submitted_at=1, runtime_estimate_s=50)
    profile = scheduling_profile("fifo", "bestfit").with_args("allocate", backfill="easy")
    result = run_cycle(ClusterSnapshot(table, (small, gang), running), Framework.build(profile, default_registry()),
                       clock=FixedClock(NOW), rng=random.Random(0))
    assert [d.job_id for d in result.decisions] == ["small"]
    reason = result.pending["gang"]
    assert reason.kind is PendingKind.BACKFILL_WINDOW and reason.at == 2000


def test_per_table_memos_start_again_past_their_limit():
    from gpupool.core.actions.reservations import SHAPES_MEMO_LIMIT, _memo
    table = table_of(make_node("n1"))
    for k in range(3 * SHAPES_MEMO_LIMIT):
        _memo(table, "owner")[k] = k
        assert len(_memo(table, "owner")) <= SHAPES_MEMO_LIMIT + 1


def test_a_gang_the_full_cluster_has_no_room_for_waits_for_room_with_a_reservation_not_as_over_quota():
    # 3 of the 4 GPUs are busy (b's tasks end at t=1100 and t=1300); a's 4-GPU gang is within every queue rule, but
    # the queues' usage would exceed the cluster: that is no room, not a quota, so the gang gets a reservation (it
    # was refused as over quota every cycle, never reserved, and starved behind jobs that fit the freed GPUs)
    tree = QueueTree([QueueSpec("a", guaranteed=rv(2000)), QueueSpec("b", guaranteed=rv(2000))])
    table = table_of(make_node("n1", gpus=2), make_node("n2", gpus=2))
    running = {}
    for task_id, node, end in (("b1/0", "n1", NOW + 100), ("b2/0", "n1", NOW + 300), ("b3/0", "n2", NOW + 300)):
        running[task_id] = replace(run_on(table, running, node, task_id, ONE, queue="b"), expected_end=end)
    gang = make_job("gang", TWO, TWO, queue="a", runtime_estimate_s=50)
    small = make_job("small", ONE, queue="b", submitted_at=1, runtime_estimate_s=1000)
    profile = scheduling_profile("fifo", "bestfit").with_args("allocate", backfill="easy")
    result = run_cycle(ClusterSnapshot(table, (gang, small), running, queues=tree),
                       Framework.build(profile, default_registry()), clock=FixedClock(NOW), rng=random.Random(0))
    assert result.pending["gang"].kind is PendingKind.BACKFILL_WINDOW
    assert result.pending["gang"].at == 1300
    # the free GPU stays free for the gang: "small" would still run at t=1300
    assert result.pending["small"].kind is PendingKind.RESERVED_FOR and result.decisions == ()
    assert result.reserved_milli == 1000  # SOR counts that idle, held GPU


def test_a_guessed_reservation_holds_no_idle_gpu_in_sor():
    result = _sliding_case((83.0, 83.0))
    assert result.pending["wide"].kind is PendingKind.BACKFILL_WINDOW and result.reserved_milli == 0


def _sliding_case(ages: tuple[float, float], estimate_end: float | None = None):
    """Issue 43's trial: one 2-GPU node, a whole GPU and half of the other busy with tasks of unknown length (or
    past their estimate); a 2-GPU job submitted first waits for the node; a 0.3-GPU job of a queue below its
    guarantee asks for a share of the free half."""
    tree = QueueTree([QueueSpec("a", guaranteed=rv(2000)), QueueSpec("b")])
    table = table_of(make_node("n1", gpus=2))
    running = {}
    run_on(table, running, "n1", "whole/0", ONE, queue="b", started_at=NOW - ages[0])
    half = run_on(table, running, "n1", "half/0", make_shape(500), queue="b", started_at=NOW - ages[1])
    if estimate_end is not None:  # the half's estimate has passed: it was expected to end before now
        running["half/0"] = replace(half, expected_end=estimate_end)
    wide = make_job("wide", TWO, queue="a", submitted_at=0)
    small = make_job("small", make_shape(300), queue="a", submitted_at=1)
    framework = Framework.build(scheduling_profile("default", "bestfit"), default_registry())
    return run_cycle(ClusterSnapshot(table, (wide, small), running, queues=tree, taken_at=NOW), framework,
                     clock=FixedClock(NOW), rng=random.Random(0))


@pytest.mark.parametrize(("ages", "estimate_end"), [((83.0, 83.0), None), ((30.0, 30.0), None),
                                                    ((900.0, 90.0), NOW - 30)],
                         ids=["unknown-length-past-a-minute", "unknown-length-young", "estimate-passed"])
def test_a_reservation_resting_on_a_guess_does_not_block_work_that_fits_now(ages, estimate_end):
    # the wide job's start is a guess that slides every cycle (now + the age of a task of unknown length, or now for
    # a task past its estimate): the 0.3-GPU job that fits in the free half starts at once (it waited ~2.5 min)
    result = _sliding_case(ages, estimate_end)
    assert [d.job_id for d in result.decisions] == ["small"]
    assert result.pending["wide"].kind is PendingKind.BACKFILL_WINDOW


def test_a_reservation_resting_on_estimates_still_blocks_work_that_would_delay_it():
    table = table_of(make_node("n1", gpus=2))
    running = {}
    for task_id, shape in (("whole/0", ONE), ("half/0", make_shape(500))):
        running[task_id] = replace(run_on(table, running, "n1", task_id, shape), expected_end=NOW + 100)
    wide = make_job("wide", TWO, submitted_at=0)
    small = make_job("small", make_shape(300), submitted_at=1)
    framework = Framework.build(scheduling_profile("default", "bestfit"), default_registry())
    result = run_cycle(ClusterSnapshot(table, (wide, small), running), framework, clock=FixedClock(NOW),
                       rng=random.Random(0))
    assert result.decisions == () and result.pending["small"].kind is PendingKind.RESERVED_FOR


def test_why_gives_a_reservation_time_as_iso_and_names_its_holder():
    result = _sliding_case((83.0, 83.0))
    wide = result.pending["wide"]
    assert wide.at == NOW + 83 and "from 1970-01-01T00:18:03Z" in wide.message and "t=" not in wide.message
    assert "a guess" in wide.message  # it rests on tasks of unknown length
    assert wide.holder == "half" and "when job half and 1 more running there ends" in wide.message  # who holds it
    table = table_of(make_node("n1", gpus=2))
    running = {}
    running["k/0"] = replace(run_on(table, running, "n1", "k/0", ONE), expected_end=NOW + 100)
    framework = Framework.build(scheduling_profile("default", "bestfit"), default_registry())
    jobs = (make_job("wide", TWO, submitted_at=0), make_job("small", make_shape(300), submitted_at=1))
    result = run_cycle(ClusterSnapshot(table, jobs, running), framework, clock=FixedClock(NOW), rng=random.Random(0))
    small = result.pending["small"]
    assert small.kind is PendingKind.RESERVED_FOR and small.holder == "wide" and small.at == NOW + 100
    assert "reserved for job wide from 1970-01-01T00:18:20Z" in small.message
    assert "a guess" not in result.pending["wide"].message
    assert result.pending["wide"].holder == "k" and "when job k running there ends" in result.pending["wide"].message


def test_a_task_no_node_could_take_is_told_why_not_that_the_node_is_reserved():
    # issue 43: an 8-GPU job on a 2-GPU node was told in turn "1 node reserved for another job" and "1 too few GPUs
    # on node"; the node is reserved for "wide", but the reason that holds either way is its GPU count
    table = table_of(make_node("n1", gpus=2))
    running = {}
    running["k/0"] = replace(run_on(table, running, "n1", "k/0", ONE), expected_end=NOW + 100)
    eight = make_job("eight", make_shape(1000, gpu_count=8), submitted_at=1)
    framework = Framework.build(scheduling_profile("default", "bestfit"), default_registry())
    result = run_cycle(ClusterSnapshot(table, (make_job("wide", TWO, submitted_at=0), eight), running), framework,
                       clock=FixedClock(NOW), rng=random.Random(0))
    assert result.pending["eight"].details == (("too few GPUs on node", 1),), result.pending["eight"]


# the blocking reservations, found by bisection, are those a scan of every reservation finds --------------------

def _scan(reservations, job, now, fitting):
    return tuple(k for k, r in enumerate(reservations) if r.job_id != job.id
                 and (r.blocks_fitting(now, job.estimate_s) if fitting else r.blocks(now, job.estimate_s)))


@settings(max_examples=200, deadline=None)
@given(starts=st.lists(st.tuples(st.sampled_from([NOW, NOW + 50, NOW + 100, NOW + 400]), st.booleans(),
                                 st.sampled_from(["a", "b", "c", "d"])), max_size=8),
       asks=st.lists(st.tuples(st.sampled_from(["a", "b", "x"]), st.sampled_from([None, 0, 50, 99, 100, 101, 1e9])),
                     min_size=1, max_size=6),
       grow=st.integers(0, 8))
def test_blocking_reservations_are_those_a_scan_finds(starts, asks, grow):
    framework = Framework.build(scheduling_profile("fifo", "bestfit"), default_registry())
    cycle = Cycle(ClusterSnapshot(table_of(*(make_node(f"n{i}", gpus=1) for i in range(4))), (), {}),
                  framework.plugins, FixedClock(NOW), random.Random(0))
    made = [Reservation(job, "q", frozenset({k % 4}), start, start + 10, firm) for k, (start, firm, job)
            in enumerate(starts)]
    for stage in (made[:grow], made):  # asked part-way, then again once all are made (reservations only grow)
        cycle.reservations[:] = stage
        for job_id, estimate in asks:
            job = make_job(job_id, ONE, runtime_estimate_s=estimate)
            for fitting in (False, True):
                assert blocking(cycle, job, fitting) == _scan(stage, job, NOW, fitting)
            assert held_nodes(cycle, job) == frozenset(i for k in _scan(stage, job, NOW, False)
                                                       for i in stage[k].nodes)
