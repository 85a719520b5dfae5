"""Reclaim and preemption: the hand-computed cases of ALGORITHMS.md §4 (9-12), §5 (3) and §6 (1-2), and KAI's
GuaranteeDeservedQuota reclaim strategy (§4.4, reclaim rule 2)."""

from __future__ import annotations

import random

import pytest

from gpupool.core import (
    Bind,
    ClusterSnapshot,
    Evict,
    FixedClock,
    Framework,
    QueueSpec,
    QueueTree,
    default_registry,
    scheduling_profile,
)
from gpupool.core.decisions import Move
from gpupool.core.testing.builders import gpu_units, make_job, make_node, make_shape, run_on, table_of

ONE = make_shape(1000)



def _cycle(table, running, jobs, tree, profile="fair-share", now=3600.0, reclaim=None):
    chosen = scheduling_profile(profile, "bestfit")
    framework = Framework.build(chosen.with_args("reclaim", **reclaim) if reclaim else chosen, default_registry())
    snapshot = ClusterSnapshot(table, tuple(jobs), running, queues=tree)
    from gpupool.core import run_cycle
    return run_cycle(snapshot, framework, clock=FixedClock(now), rng=random.Random(0))


def _a_holds_all(reclaim_min_runtime_s=0.0, started_at=0.0):
    tree = QueueTree([QueueSpec("A", guaranteed=gpu_units(4), reclaim_min_runtime_s=reclaim_min_runtime_s),
                      QueueSpec("B", guaranteed=gpu_units(4))])
    table = table_of(make_node("n1", gpus=4), make_node("n2", gpus=4))
    running = {}
    for k in range(8):
        run_on(table, running, f"n{1 + k // 4}", f"a{k}/0", ONE, queue="A", started_at=started_at)
    return tree, table, running


def test_reclaim_takes_back_exactly_what_the_fair_share_allows():
    tree, table, running = _a_holds_all()
    result = _cycle(table, running, [make_job("b", ONE, ONE, queue="B")], tree)
    assert result.fair_shares["A"] == 6000 and result.fair_shares["B"] == 2000
    evicted = {d.job_id for d in result.decisions if isinstance(d, Evict)}
    assert len(evicted) == 2 and all(j.startswith("a") for j in evicted)
    assert {d.job_id for d in result.decisions if isinstance(d, Bind)} == {"b"}


def test_reclaim_refused_beyond_the_fair_share():
    tree, table, running = _a_holds_all()
    result = _cycle(table, running, [make_job("b", *[ONE] * 6, queue="B")], tree)
    assert result.fair_shares["B"] == 4000
    assert result.decisions == () and "b" in result.pending


def _a_over_its_guarantee_with_idle_pieces(b_guaranteed):
    """Three 4-GPU nodes: A (guaranteed 2) runs seven 1-GPU jobs on n1 and n2, C (guaranteed 2) two on n3; the
    three idle GPUs lie on n2 and n3. Fair shares for B asking one whole node: A 6, B 4, C 2."""
    tree = QueueTree([QueueSpec("A", guaranteed=gpu_units(2)), QueueSpec("B", guaranteed=gpu_units(b_guaranteed)),
                      QueueSpec("C", guaranteed=gpu_units(2))])
    table = table_of(*[make_node(f"n{i}", gpus=4) for i in (1, 2, 3)])
    running = {}
    for k in range(7):
        run_on(table, running, f"n{1 + k // 4}", f"a{k}/0", ONE, queue="A")
    for k in range(2):
        run_on(table, running, "n3", f"c{k}/0", ONE, queue="C")
    return tree, table, running


@pytest.mark.parametrize(("guarantee", "b_guaranteed", "want_evicted"),
                         [(True, 6, {"a4", "a5", "a6"}), (True, 3, set()), (False, 6, set())],
                         ids=["within B's guarantee: A keeps its own", "beyond B's guarantee: A keeps its share",
                              "strategy off: A keeps its share"])
def test_reclaim_guarantees_the_deserved_quota(guarantee, b_guaranteed, want_evicted):
    # KAI's GuaranteeDeservedQuota: B's 4 GPUs fit its fair share, but taking them keeps A at its fair share (6)
    # only if one GPU is taken, and the idle pieces fit no whole node. Within B's guarantee, A may fall to its own
    # guarantee (2): the three jobs on n2 go. Beyond it, or with the strategy off, only MaintainFairShare applies
    # and B waits.
    tree, table, running = _a_over_its_guarantee_with_idle_pieces(b_guaranteed)
    result = _cycle(table, running, [make_job("b", make_shape(1000, gpu_count=4), queue="B")], tree,
                    reclaim={"guarantee_deserved_quota": guarantee})
    assert (result.fair_shares["A"], result.fair_shares["B"], result.fair_shares["C"]) == (6000, 4000, 2000)
    assert {d.job_id for d in result.decisions if isinstance(d, Evict)} == want_evicted
    assert ("b" in result.pending) == (not want_evicted)


def test_reclaim_looks_past_nodes_whose_victims_it_may_not_take():
    # n1..n8 each hold a task of C (within its share: protected) and one of A (over its share); n9 holds two of
    # A. All nine hold 2 GPUs of victims, but only on n9 can B's 2-GPU task fit without touching C.
    tree = QueueTree([QueueSpec("A"), QueueSpec("B", guaranteed=gpu_units(2)), QueueSpec("C", guaranteed=gpu_units(8))])
    table = table_of(*[make_node(f"n{i}", gpus=2) for i in range(1, 10)])
    running = {}
    for i in range(1, 9):
        run_on(table, running, f"n{i}", f"c{i}/0", ONE, queue="C")
        run_on(table, running, f"n{i}", f"a{i}/0", ONE, queue="A")
    run_on(table, running, "n9", "a9/0", ONE, queue="A")
    run_on(table, running, "n9", "a10/0", ONE, queue="A")
    result = _cycle(table, running, [make_job("b", make_shape(1000, gpu_count=2), queue="B")], tree)
    assert result.fair_shares["A"] == 8000
    assert {d.job_id for d in result.decisions if isinstance(d, Evict)} == {"a9", "a10"}
    assert [d.node for d in result.decisions if isinstance(d, Bind)] == ["n9"]


def test_reclaim_refuses_a_guarantee_flag_that_is_not_a_bool():
    with pytest.raises(ValueError, match="guarantee_deserved_quota"):
        profile = scheduling_profile("fair-share", "bestfit")
        Framework.build(profile.with_args("reclaim", guarantee_deserved_quota="yes"), default_registry())


@pytest.mark.parametrize(("now", "want_evictions"), [(600.0, 0), (1800.0, 2)],
                         ids=["10 min in: protected", "30 min in: reclaimable"])
def test_reclaim_min_runtime_protects_young_jobs(now, want_evictions):
    tree, table, running = _a_holds_all(reclaim_min_runtime_s=1800.0)
    result = _cycle(table, running, [make_job("b", ONE, ONE, queue="B")], tree, now=now)
    assert len({d.job_id for d in result.decisions if isinstance(d, Evict)}) == want_evictions


@pytest.mark.parametrize(("preemptible", "want_started"), [(False, False), (True, True)],
                         ids=["build (non-preemptible) waits", "train (preemptible) starts"])
def test_non_preemptible_job_must_fit_its_guarantee(preemptible, want_started):
    tree = QueueTree([QueueSpec("q", guaranteed=gpu_units(1), limit=gpu_units(4))])
    table = table_of(make_node("n", gpus=4))
    job = make_job("j", make_shape(1000, gpu_count=2), queue="q", preemptible=preemptible)
    result = _cycle(table, {}, [job], tree)
    assert bool(result.decisions) == want_started
    if not want_started:
        assert "non-preemptible" in result.pending["j"].message


def _one_queue_full_of_two_priorities():
    """Queue q fills a 4-GPU node with w1 (priority 10) and w2 (priority 5), 2 GPUs each."""
    tree = QueueTree([QueueSpec("q", guaranteed=gpu_units(4))])
    table = table_of(make_node("n", gpus=4))
    running = {}
    run_on(table, running, "n", "w1/0", make_shape(1000, gpu_count=2), queue="q", priority=10)
    run_on(table, running, "n", "w2/0", make_shape(1000, gpu_count=2), queue="q", priority=5)
    return tree, table, running


def test_preemption_inside_a_queue_takes_exactly_the_lower_priority_job():
    tree, table, running = _one_queue_full_of_two_priorities()
    w3 = make_job("w3", make_shape(1000, gpu_count=2), queue="q", priority=8)
    result = _cycle(table, running, [w3], tree, profile="priority")
    assert [d.job_id for d in result.decisions if isinstance(d, Evict)] == ["w2"]
    w4 = make_job("w4", make_shape(1000, gpu_count=2), queue="q", priority=5)
    assert _cycle(table, running, [w4], tree, profile="priority").decisions == ()


@pytest.mark.parametrize(("newer_equal", "submitted_at", "want"), [(True, 20.0, ["w2"]), (True, 40.0, []),
                                                                    (False, 20.0, [])],
                         ids=["passed by w2: takes it", "newest: takes none", "option off: takes none"])
def test_preemption_of_newer_jobs_of_equal_priority(newer_equal, submitted_at, want):
    # Kueue's LowerOrNewerEqualPriority: w1 (submitted at 10) and w2 (at 30) fill the node, all priority 5
    tree = QueueTree([QueueSpec("q", guaranteed=gpu_units(4))])
    table = table_of(make_node("n", gpus=4))
    running = {}
    two = make_shape(1000, gpu_count=2)
    run_on(table, running, "n", "w1/0", two, queue="q", priority=5, submitted_at=10.0)
    run_on(table, running, "n", "w2/0", two, queue="q", priority=5, submitted_at=30.0)
    framework = Framework.build(scheduling_profile("priority", "bestfit").with_args(
        "preempt", newer_equal_priority=newer_equal), default_registry())
    w3 = make_job("w3", two, queue="q", priority=5, submitted_at=submitted_at)
    from gpupool.core import run_cycle
    result = run_cycle(ClusterSnapshot(table, (w3,), running, queues=tree), framework, clock=FixedClock(3600.0),
                       rng=random.Random(0))
    assert [d.job_id for d in result.decisions if isinstance(d, Evict)] == want


def test_two_gangs_never_split_the_cluster_three_and_three():
    table = table_of(*[make_node(f"n{i}", gpus=1) for i in range(6)])
    g1 = make_job("g1", *[ONE] * 4, submitted_at=0)
    g2 = make_job("g2", *[ONE] * 4, submitted_at=0)
    result = _cycle(table, {}, [g1, g2], None, profile="fifo")
    assert len(result.decisions) == 4 and {d.job_id for d in result.decisions} == {"g1"}


@pytest.mark.parametrize(("free", "want_bound"), [(4, 4), (2, 0)], ids=["4 free: 3 + 1 optional", "2 free: none"])
def test_elastic_gang_binds_min_plus_what_fits(free, want_bound):
    table = table_of(make_node("n", gpus=free))
    job = make_job("g", *[ONE] * 5, min_tasks=3)
    assert len(_cycle(table, {}, [job], None, profile="fifo").decisions) == want_bound


@pytest.mark.parametrize(("profile", "want"), [("fair-share", ["w2"]), ("default", [])])
def test_default_profile_does_not_preempt_inside_a_queue(profile, want):
    # the preemption case above: "fair-share" evicts the lower-priority job; "default" lets w3 wait for
    # capacity (on the openb replay, preemption inside queues evicted a third of the jobs, many of them
    # again and again, and lost about a fifth of the GPU time)
    tree, table, running = _one_queue_full_of_two_priorities()
    w3 = make_job("w3", make_shape(1000, gpu_count=2), queue="q", priority=8)
    result = _cycle(table, running, [w3], tree, profile=profile)
    assert [d.job_id for d in result.decisions if isinstance(d, Evict)] == want


@pytest.mark.parametrize(("now", "submitted_at", "moved"), [(20_000.0, 12_800.0, True), (20_000.0, 13_000.0, False),
                                                           (40_000.0, 32_800.0, False)],
                         ids=["waited 2 h, restart loses less", "waited under 2 h",
                              "restart loses more than the job waited"])
def test_fair_share_moves_a_long_small_task_for_a_starving_job_no_eviction_may_start(now, submitted_at, moved):
    """A's 4-GPU job finds no free node: A's own 1-GPU tasks (same priority, so no preemption; same queue, so no
    reclaim) hold a GPU on each. After 2 h of waiting (4 GPUs x 7,200 s) it may restart one elsewhere if that
    throws away no more GPU-time (1 GPU x its age) than it has lost waiting."""
    tree = QueueTree([QueueSpec("A", guaranteed=gpu_units(4)), QueueSpec("B", guaranteed=gpu_units(4))])
    table = table_of(make_node("n1", gpus=4), make_node("n2", gpus=4))
    running = {}
    for k in range(2):
        run_on(table, running, f"n{1 + k}", f"a{k}/0", ONE, queue="A")
    big = make_job("big", make_shape(1000, gpu_count=4), queue="A", submitted_at=submitted_at)
    result = _cycle(table, running, [big], tree, now=now)
    assert not any(isinstance(d, Evict) for d in result.decisions)
    assert ("big" in result.pending) != moved
    assert sum(isinstance(d, Move) for d in result.decisions) == (1 if moved else 0)
