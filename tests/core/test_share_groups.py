"""GPU sharing stays within one sharing group (tenant), and container images go only to nodes that take
untrusted images (RELIABILITY.md §3.2 S8, CPU tier).

A fractional task may use a fully free GPU or one whose current group equals its own; the group of a partly
used GPU is part of the node's free state, and the task's group part of its shape, so placement caches stay
exact. The property test drives the real cycle (allocate, reclaim, preempt; every placement policy) through many
random submissions and completions of several tenants and checks every GPU after every cycle.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core import (
    Bind,
    ClusterSnapshot,
    DeviceShare,
    Evict,
    FixedClock,
    Framework,
    NodeState,
    PendingKind,
    RunningTask,
    TaskShape,
    Workload,
    default_registry,
    placement_profile,
    run_cycle,
    scheduling_profile,
)
from gpupool.core.decisions import Move
from gpupool.core.fit import copies_fit, fitting_gpus, node_fits
from gpupool.core.framework.status import Code
from gpupool.core.nodes import NodeKind
from gpupool.core.plugins.filter.gpu_fit import GpuFitFilter
from gpupool.core.testing.builders import make_job, make_node, make_shape, table_of


def shared(milli: int, group: str, memory_mib: int = 0) -> TaskShape:
    return TaskShape(gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory_mib, share_group=group)


def state_of(gpu_free: tuple[int, ...], groups: tuple[str, ...] = ()) -> NodeState:
    return NodeState(64_000, 262_144, gpu_free, (0,) * len(gpu_free), gpu_groups=groups)


# the shape and the node state ------------------------------------------------------------------------------------


def test_only_a_fraction_keeps_its_group_so_whole_gpu_shapes_stay_one_cache_key():
    assert shared(500, "acme").share_group == "acme"
    assert TaskShape(gpu_count=2, gpu_milli=1000, share_group="acme") == TaskShape(gpu_count=2, gpu_milli=1000)
    assert TaskShape(cpu_milli=1000, share_group="acme").share_group == ""
    assert shared(500, "acme") != shared(500, "globex")


@pytest.mark.parametrize(("gpu_free", "groups", "group", "want"), [
    ((1000, 1000), (), "acme", [0, 1]),  # free GPUs take anyone
    ((500, 1000), ("acme", ""), "acme", [0, 1]),  # its own group's GPU
    ((500, 1000), ("acme", ""), "globex", [1]),  # never another group's
    ((500, 1000), ("acme", ""), "", [1]),  # "" (no tenancy) is a group of its own
    ((500, 1000), (), "", [0, 1]),  # "" shares with ""
    ((500, 1000), (), "acme", [1]),
    ((300, 300), ("acme", "acme"), "acme", []),  # too little left
], ids=["free", "own", "other", "none-vs-tenant", "none-vs-none", "tenant-vs-none", "full"])
def test_a_fraction_fits_a_free_gpu_or_one_of_its_own_group(gpu_free, groups, group, want):
    assert fitting_gpus(state_of(gpu_free, groups), shared(500, group)) == want


def test_the_group_follows_the_gpu_from_first_task_to_last_and_the_state_stays_canonical():
    empty = state_of((1000, 1000))
    a, b = shared(300, "acme"), shared(200, "acme")
    one = empty.take(a, (DeviceShare(0, 300),))
    two = one.take(b, (DeviceShare(0, 200),))
    assert one.gpu_groups == two.gpu_groups == ("acme", "")
    assert two.give(a, (DeviceShare(0, 300),)).gpu_groups == ("acme", "")
    assert two.give(a, (DeviceShare(0, 300),)).give(b, (DeviceShare(0, 200),)) == empty
    whole = TaskShape(gpu_count=1, gpu_milli=1000)
    assert empty.take(whole, (DeviceShare(1, 1000),)).gpu_groups == ()


def test_a_gpu_shared_across_groups_by_outside_state_takes_no_fraction_until_free():
    """The control plane may load allocations made before groups existed: such a GPU is closed to fractions."""
    mixed = state_of((1000,)).take(shared(300, "acme"), (DeviceShare(0, 300),)).take(
        shared(300, "globex"), (DeviceShare(0, 300),))
    for group in ("acme", "globex", ""):
        assert fitting_gpus(mixed, shared(100, group)) == []
    assert mixed.give(shared(300, "globex"), (DeviceShare(0, 300),)).gpu_groups == mixed.gpu_groups


def test_why_a_fraction_waits_names_the_other_group():
    kind = NodeKind.of(make_node(gpus=1))
    busy = state_of((500,), ("acme",))
    assert node_fits(kind, busy, shared(500, "globex")) == "GPU shared by another group"
    assert node_fits(kind, busy, shared(600, "acme")) == "insufficient GPU"
    assert copies_fit(kind, busy, shared(100, "globex")) == 0
    assert copies_fit(kind, busy, shared(100, "acme")) == 5


# untrusted images ------------------------------------------------------------------------------------------------


def test_an_image_task_goes_only_to_a_node_that_takes_untrusted_images():
    gated = NodeKind.of(make_node(untrusted_images=False))
    open_ = NodeKind.of(make_node())
    image, plain = make_shape(500, image=True), make_shape(500)
    state = NodeState.empty(gated)
    assert node_fits(gated, state, image) == "node refuses untrusted images"
    assert node_fits(gated, state, plain) == node_fits(open_, state, image) == ""
    assert copies_fit(gated, state, image) == 0 and copies_fit(open_, state, image) == 4
    status = GpuFitFilter().filter(gated, state, image)
    assert status.code is Code.UNRESOLVABLE, "no preemption makes a gated node take images"


def test_the_cycle_says_why_an_image_job_waits():
    table = table_of(make_node("gated", untrusted_images=False), make_node("full", gpus=1))
    framework = Framework.build(placement_profile("bestfit"), default_registry())
    running = {"x/0": RunningTask("x/0", "x", "full", make_shape(1000), (DeviceShare(0, 1000),))}
    i = table.index["full"]
    table.set_state(i, table.states[i].take(make_shape(1000), (DeviceShare(0, 1000),)))
    jobs = (make_job("img", make_shape(1000, image=True)), make_job("plain", make_shape(1000), submitted_at=1))
    result = run_cycle(ClusterSnapshot(table, jobs, running), framework, clock=FixedClock(), rng=random.Random(0))
    assert [(d.job_id, d.node) for d in result.decisions if isinstance(d, Bind)] == [("plain", "gated")]
    reason = result.pending["img"]
    assert reason.kind is PendingKind.NO_NODE_FITS
    assert dict(reason.details) == {"node refuses untrusted images": 1, "insufficient GPU": 1}


# the property: 0 GPUs with tasks of two groups --------------------------------------------------------------------

TENANTS = ("", "acme", "globex", "initech", "umbrella")
PLACEMENTS = ("best", "fgd", "bestfit", "gpupacking", "spread", "random", "dotprod", "gpuclustering")
PROFILES = ("fifo", "priority", "fair-share")
EXAMPLES, CYCLES = 120, 12
WORKLOAD = Workload.from_shapes([shared(m, "") for m in (100, 200, 300, 400, 500, 700)] + [make_shape(1000)])
WANT_PLACEMENTS = 10_000

submission = st.tuples(st.integers(0, len(TENANTS) - 1), st.sampled_from([100, 200, 300, 400, 500, 700, 1000]),
                       st.integers(-2, 2))
cycles = st.lists(st.tuples(st.lists(submission, min_size=6, max_size=14), st.integers(0, 100)),
                  min_size=CYCLES, max_size=CYCLES)


class Cluster:
    """Applies a cycle's decisions as a control plane would, and checks every GPU's tenants."""

    def __init__(self) -> None:
        self.table = table_of(*[make_node(f"n{i}", gpus=4, cpu_milli=256_000) for i in range(4)])
        self.running: dict[str, RunningTask] = {}

    def apply(self, decisions, jobs) -> int:
        binds = 0
        for d in decisions:
            if isinstance(d, Bind):
                job = jobs[d.job_id]
                self._put(RunningTask(d.task_id, d.job_id, d.node, d.shape, d.shares, priority=job.priority))
                binds += 1
            elif isinstance(d, Evict):
                self._drop(d.task_id)
            elif isinstance(d, Move):
                task = self._drop(d.task_id)
                self._put(RunningTask(d.task_id, d.job_id, d.node, d.shape, d.shares, priority=task.priority))
        return binds

    def finish(self, rng: random.Random, percent: int) -> None:
        for task_id in sorted(self.running):
            if rng.randrange(100) < percent:
                self._drop(task_id)

    def coresident(self) -> int:
        """GPUs holding fractional tasks of more than one group."""
        groups: dict[tuple[str, int], set[str]] = {}
        for task in self.running.values():
            for share in task.shares if task.shape.is_shared else ():
                groups.setdefault((task.node, share.index), set()).add(task.shape.share_group)
        return sum(1 for members in groups.values() if len(members) > 1)

    def _put(self, task: RunningTask) -> None:
        i = self.table.index[task.node]
        self.table.set_state(i, self.table.states[i].take(task.shape, task.shares))
        self.running[task.task_id] = task

    def _drop(self, task_id: str) -> RunningTask:
        task = self.running.pop(task_id)
        i = self.table.index[task.node]
        self.table.set_state(i, self.table.states[i].give(task.shape, task.shares))
        return task


def test_no_gpu_ever_holds_tasks_of_two_groups(s8):
    """At least WANT_PLACEMENTS binds over EXAMPLES random runs; every GPU checked after every cycle."""
    with s8.case("share_groups") as tally:
        tally.update(placements=0, coresident=0)

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(placement=st.sampled_from(PLACEMENTS), profile=st.sampled_from(PROFILES), plan=cycles)
        def run(placement, profile, plan):
            framework = Framework.build(scheduling_profile(profile, placement).with_workload(WORKLOAD),
                                        default_registry())
            cluster, rng, pending = Cluster(), random.Random(len(plan)), {}
            for step, (submitted, finish_percent) in enumerate(plan):
                for n, (tenant, milli, priority) in enumerate(submitted):
                    shape = shared(milli, TENANTS[tenant]) if milli < 1000 else make_shape(1000)
                    job = make_job(f"j{step}-{n}", shape, priority=priority, submitted_at=float(step))
                    pending[job.id] = job
                snapshot = ClusterSnapshot(cluster.table, tuple(pending.values()), dict(cluster.running))
                result = run_cycle(snapshot, framework, clock=FixedClock(float(step)), rng=rng)
                tally["placements"] += cluster.apply(result.decisions, pending)
                pending = {job_id: job for job_id, job in pending.items() if job_id in result.pending}
                tally["coresident"] += cluster.coresident()
                assert cluster.coresident() == 0, f"tasks of two groups on one GPU after cycle {step}"
                cluster.finish(rng, finish_percent)

        run()
        assert tally["placements"] >= WANT_PLACEMENTS, f"only {tally['placements']} placements: raise EXAMPLES"
