"""The hand-computed placement cases of ALGORITHMS.md §2 ("How to test"), one table per policy."""

from __future__ import annotations

import random

import pytest

from gpupool.core import DeviceShare, Framework, Workload, default_registry, placement_profile
from gpupool.core.fragmentation import FragModel, TaskClass
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.plugins.score.bestfit import BestFitScore
from gpupool.core.plugins.score.dotprod import DotProdScore
from gpupool.core.plugins.score.fgd import FgdPolicy
from gpupool.core.plugins.score.gpuclustering import GpuClusteringScore
from gpupool.core.plugins.score.gpupacking import GpuPackingScore
from gpupool.core.testing.builders import make_node, make_shape, table_of

HALF_AND_WHOLE = Workload((TaskClass(0, 500, 1), TaskClass(0, 1000, 1)), (0.5, 0.5))


def state(gpu_free, cpu_free=64_000, tags=()):
    return NodeState(cpu_free, 262_144, tuple(gpu_free), (0,) * len(gpu_free), tuple(tags))


def kind(gpus=2, cpu=64_000):
    return NodeKind.of(make_node(gpus=gpus, cpu_milli=cpu))


@pytest.mark.parametrize(
    ("gpu_free", "want"),
    [([1000, 1000], 0), ([500, 1000], 250), ([0, 1000], 0), ([500, 500], 500)],
    ids=["empty node", "half-used GPU strands 500 for whole tasks", "full GPU is no fragment", "two halves"],
)
def test_fgd_fragmentation(gpu_free, want):
    assert FragModel(HALF_AND_WHOLE).frag("A100", 64_000, tuple(gpu_free)) == want


def test_fgd_cpu_only_class_counts_all_idle_gpu():
    m = Workload((TaskClass(0, 500, 1), TaskClass(4000, 0, 0)), (0.5, 0.5))
    assert FragModel(m).frag("A100", 64_000, (1000, 1000)) == 1000


def test_fgd_prefers_the_gpu_that_lowers_fragmentation():
    fgd = FgdPolicy(HALF_AND_WHOLE)
    half = make_shape(500)
    assert fgd.score(kind(), state([500, 1000]), half) == 56  # trunc(100 sigmoid(0.25)), GPU0
    assert fgd.pick_devices(kind(), state([500, 1000]), half, random.Random(0)) == (DeviceShare(0, 500),)
    # GPU1 alone would have scored trunc(100 sigmoid(-0.25)) = 43
    assert fgd.score(kind(), state([0, 1000]), make_shape(500)) < 56


def test_fgd_node_choice_follows_steepest_descent():
    table = table_of((make_node("a"), [500, 1000]), (make_node("b"), [1000, 1000]))
    profile = placement_profile("fgd").with_args("fgd", workload=HALF_AND_WHOLE)
    placer = Framework.build(profile, default_registry()).plugins.placer
    assert table.names[placer.choose(table, make_shape(500), random.Random(0))] == "a"


@pytest.mark.parametrize(
    ("cpu_free", "idle", "want"),
    [(64_000, 2000, 71), (96_000, 8000, 21)],
    ids=["node1 tight", "node2 loose"],
)
def test_bestfit_raw_scores(cpu_free, idle, want):
    gpus = idle // 1000
    node_kind = kind(gpus=8, cpu=128_000)
    free = [1000] * gpus + [0] * (8 - gpus)
    assert BestFitScore().score(node_kind, state(free, cpu_free), make_shape(1000, cpu_milli=8000)) == want


@pytest.mark.parametrize(
    ("cpu_free", "idle", "want"),
    [(64_000, 2000, 96), (96_000, 8000, 91)],
    ids=["node1", "node2"],
)
def test_dotprod_scores(cpu_free, idle, want):
    gpus = idle // 1000
    free = [1000] * gpus + [0] * (8 - gpus)
    assert DotProdScore().score(kind(gpus=8, cpu=128_000), state(free, cpu_free),
                                make_shape(1000, cpu_milli=8000)) == want


@pytest.mark.parametrize(
    ("gpu_free", "want"),
    [([500, 1000, 1000, 1000], 95), ([1000] * 4, 29), ([0, 1000, 1000, 1000], 49)],
    ids=["X shares a used GPU", "Y fully free node", "Z free GPU on used node"],
)
def test_gpupacking_scores(gpu_free, want):
    assert GpuPackingScore().score(kind(gpus=4), state(gpu_free), make_shape(300)) == want


# The FGD artifact's GpuPackingScore for tasks of several whole GPUs and for free nodes of each size (issue 38): k whole
# GPUs on a used node score 50 - k (at least 33) whatever else the node holds; a free node of n GPUs 33 - n (at least
# n), so the smallest free node opens first.
@pytest.mark.parametrize(
    ("gpus", "gpu_free", "gpu_count", "want"),
    [(8, [0, 300, 1000, 1000, 1000, 1000, 0, 0], 2, 48), (8, [1000] * 8, 8, 25), (1, [1000], 1, 32),
     (2, [1000, 1000], 2, 31), (4, [1000, 1000, 0, 1000], 2, 48)],
    ids=["2 whole GPUs on a used node", "free 8-GPU node", "free 1-GPU node", "free 2-GPU node",
         "a used node's whole GPUs only"],
)
def test_gpupacking_scores_whole_gpu_tasks(gpus, gpu_free, gpu_count, want):
    shape = make_shape(1000, gpu_count=gpu_count)
    assert GpuPackingScore().score(kind(gpus=gpus), state(gpu_free), shape) == want


def test_gpupacking_scores_cpu_only_tasks_zero():
    assert GpuPackingScore().score(kind(), state([1000, 1000]), make_shape(0, cpu_milli=1000)) == 0


@pytest.mark.parametrize(
    ("tags", "gpus", "idle", "gpu_count", "want"),
    [((("share-gpu", 3),), 8, 6000, 1, 81), ((), 8, 8000, 1, 25), ((("1-gpu", 4),), 8, 4000, 1, 12),
     ((("1-gpu", 1), ("share-gpu", 1)), 8, 4000, 1, 62), ((("2-gpu", 1),), 8, 6000, 2, 81),
     ((("1-gpu", 2),), 8, 6000, 2, 6), ((), 1, 1000, 1, 46)],
    ids=["P same tag only", "Q no GPU tasks", "R only other tags", "mixed tags including ours",
         "2-GPU task beside a 2-GPU task", "2-GPU task beside 1-GPU tasks", "free 1-GPU node: 25 + 25 x 7/8 truncated"],
)
def test_gpuclustering_scores(tags, gpus, idle, gpu_count, want):
    free = [1000] * (idle // 1000) + [0] * (gpus - idle // 1000)
    shape = make_shape(500) if gpu_count == 1 else make_shape(1000, gpu_count=gpu_count)
    assert GpuClusteringScore().score(kind(gpus=gpus), state(free, tags=tags), shape) == want


def test_whole_gpu_task_takes_lowest_index_free_gpus():
    table = table_of((make_node("n", gpus=4), [1000, 300, 1000, 1000]))
    placer = Framework.build(placement_profile("bestfit"), default_registry()).plugins.placer
    shares = placer.pick(table, 0, make_shape(1000, gpu_count=2), random.Random(0))
    assert [s.index for s in shares] == [0, 2]


@pytest.mark.parametrize(
    ("policy", "gpu_free", "want_gpu"),
    [("bestfit", [900, 600, 1000], 1), ("spread", [900, 600, 1000], 2), ("dotprod", [600, 600, 1000], 0),
     ("gpupacking", [900, 600, 1000], 1), ("gpuclustering", [1000, 900, 600], 2)],
    ids=["best fit: least free that fits", "worst fit: most free", "best fit ties: lowest index",
         "gpupacking: best fit (the artifact's gpuSelMethod best)", "gpuclustering: best fit as well"],
)
def test_fraction_device_choice(policy, gpu_free, want_gpu):
    table = table_of((make_node("n", gpus=3), gpu_free))
    placer = Framework.build(placement_profile(policy), default_registry()).plugins.placer
    assert placer.pick(table, 0, make_shape(500), random.Random(0))[0].index == want_gpu


def test_ties_go_to_the_lowest_node_name():
    table = table_of(make_node("b"), make_node("a"), make_node("c"))
    placer = Framework.build(placement_profile("bestfit"), default_registry()).plugins.placer
    assert table.names[placer.choose(table, make_shape(1000), random.Random(0))] == "a"


def test_random_draws_every_feasible_node_and_no_infeasible_one():
    table = table_of(make_node("a"), make_node("b"), (make_node("full"), [0, 0]), make_node("c"))
    placer = Framework.build(placement_profile("random"), default_registry()).plugins.placer
    rng = random.Random(7)
    chosen = {table.names[placer.choose(table, make_shape(1000), rng)] for _ in range(200)}
    assert chosen == {"a", "b", "c"}


def test_gpu_model_constraint_is_honoured():
    table = table_of(make_node("a", model="T4"), make_node("b", model="V100"))
    placer = Framework.build(placement_profile("bestfit"), default_registry()).plugins.placer
    assert table.names[placer.choose(table, make_shape(1000, models=["V100"]), random.Random(0))] == "b"
    assert placer.choose(table, make_shape(1000, models=["H100"]), random.Random(0)) is None
