"""No reclaim or preemption cycles (Hypothesis): a job started by evicting others is never evicted in
turn by the jobs it displaced, in the next cycle. Within a cycle, a job bound on a node displaces every job
evicted from that node (the core does not say who evicted whom, so this over-approximates displacement)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import (
    Bind,
    Evict,
    FixedClock,
    Framework,
    QueueSpec,
    QueueTree,
    default_registry,
    run_cycle,
    scheduling_profile,
)
from gpupool.core.testing.builders import gpu_units, make_job, make_node, make_shape
from gpupool.sim.cluster import SimCluster


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 8), st.integers(0, 8), st.integers(1, 3), st.integers(1, 3),
       st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 4), st.integers(0, 10)), min_size=1, max_size=12),
       st.sampled_from(["fair-share", "default", "drf", "priority"]), st.booleans())
def test_displaced_jobs_never_evict_their_displacer(g_a, g_b, w_a, w_b, submissions, profile_name, extended):
    tree = QueueTree([QueueSpec("A", guaranteed=gpu_units(g_a), over_quota_weight=w_a),
                      QueueSpec("B", guaranteed=gpu_units(g_b), over_quota_weight=w_b)])
    cluster = SimCluster([make_node(f"n{i}", gpus=4) for i in range(2)], tree)
    profile = scheduling_profile(profile_name, "bestfit")
    if "reclaim" in profile.actions:  # with and without KAI's GuaranteeDeservedQuota strategy
        profile = profile.with_args("reclaim", guarantee_deserved_quota=extended)
    if "preempt" in profile.actions:  # with and without Kueue's LowerOrNewerEqualPriority
        profile = profile.with_args("preempt", newer_equal_priority=extended)
    framework = Framework.build(profile, default_registry())
    jobs = {f"j{k}": make_job(f"j{k}", *[make_shape(1000)] * size, queue=q, priority=prio, submitted_at=k)
            for k, (q, size, prio) in enumerate(submissions)}
    pending = dict(jobs)
    displaced: set[tuple[str, str]] = set()  # (displacer, victim) pairs of the previous cycle
    for step in range(4):
        now = 3600.0 * (step + 1)
        result = run_cycle(cluster.snapshot(tuple(pending.values()), now), framework, clock=FixedClock(now),
                           rng=random.Random(step))
        evicted = {d.job_id for d in result.decisions if isinstance(d, Evict)}
        pairs = _displacements(result.decisions)
        back = {(a, b) for a, b in pairs if (b, a) in displaced}
        assert not back, f"{back}: displaced jobs evicted their displacers back"
        started = {d.job_id for d in result.decisions if isinstance(d, Bind)}
        cluster.apply(list(result.decisions), now, jobs)
        for job_id in started:
            pending.pop(job_id, None)
        for job_id in evicted:
            for task in jobs[job_id].tasks:
                if task.id in cluster.running:
                    cluster.release(task.id)
            pending[job_id] = jobs[job_id]
        displaced = pairs


def _displacements(decisions):
    """(displacer, victim) for every job bound on a node that a job was evicted from in the same cycle."""
    victims, binders = {}, {}
    for d in decisions:
        if isinstance(d, Evict):
            victims.setdefault(d.node, set()).add(d.job_id)
        elif isinstance(d, Bind):
            binders.setdefault(d.node, set()).add(d.job_id)
    return {(b, v) for node, vs in victims.items() for v in vs for b in binders.get(node, ()) if b != v}
