"""`best` (strand_aware): its three terms on top of FGD, on hand-computed clusters (docs/design/placement.md)."""

from __future__ import annotations

import pytest

from gpupool.core import Workload
from gpupool.core.fragmentation import FragModel, Leftovers, TaskClass, model_pressure
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.plugins.score.fgd import FgdPolicy
from gpupool.core.plugins.score.strand_aware import StrandAwarePolicy
from gpupool.core.testing.builders import make_node, make_shape

# Half of the tasks run anywhere, half only on a T4; all take 8 cores and one GPU: cpu_per_gpu = 8 milli-CPU
# per milli-GPU. Two T4s and two G2s: the T4-only half needs 500 of every 1000 milli-GPU demanded, and the T4s
# are 2/4 of the supply, so the T4 pressure is 0.5 / 0.5 = 1.0.
ANYWHERE, T4_ONLY = TaskClass(8000, 1000, 1), TaskClass(8000, 1000, 1, ("T4",))
HALF_T4 = Workload((ANYWHERE, T4_ONLY), (0.5, 0.5)).with_supply({"T4": 2, "G2": 2})


def node(model: str, cpu_free: int, gpu_free: tuple[int, ...]) -> tuple[NodeKind, NodeState]:
    spec = make_node(gpus=len(gpu_free), cpu_milli=cpu_free, model=model)
    return NodeKind.of(spec), NodeState(cpu_free, 262_144, gpu_free, (0,) * len(gpu_free), ())


def test_pressure_is_the_confined_demand_share_over_the_supply_share():
    assert model_pressure(HALF_T4) == {"T4": 1.0}


def test_a_class_allowed_on_several_models_is_split_by_supply():
    either = TaskClass(1000, 1000, 1, ("T4", "G2"))
    # all demand may use T4 or G2 (supply 1:3): T4 gets 1/4 of it and has 1/4 of the supply
    assert model_pressure(Workload((either,), (1.0,)).with_supply({"T4": 1, "G2": 3})) == {"T4": 1.0, "G2": 1.0}


def test_no_supply_known_means_no_pressure():
    assert model_pressure(Workload((ANYWHERE, T4_ONLY), (0.5, 0.5))) == {}


@pytest.mark.parametrize(
    ("model", "cpu_free", "gpu_free", "want"),
    [
        # FGD: ANYWHERE fits (0); T4_ONLY cannot use a G2 (0.5 * 2000); no stranding (2000 - 16000 / 8 = 0)
        ("G2", 16_000, (1000, 1000), 1000.0),
        # 12 cores feed 1500 of 2000 idle milli: stranding 500, weight 2
        ("G2", 12_000, (1000, 1000), 2000.0),
        # after one task there: ANYWHERE lacks CPU (0.5 * 1000), T4_ONLY (0.5 * 1000), stranding 2 * (1000 - 500)
        ("G2", 4_000, (0, 1000), 2000.0),
        # a T4 where both classes fit: no FGD fragment, no stranding, but its used GPU weighs 1.0 * 1000
        ("T4", 56_000, (0, 1000), 1000.0),
        ("T4", 64_000, (1000, 1000), 0.0),
    ],
)
def test_fragmentation_with_both_terms(model, cpu_free, gpu_free, want):
    assert FragModel(HALF_T4, strand_weight=2.0, scarcity_weight=1.0).frag(model, cpu_free, gpu_free) == want


def test_a_task_that_runs_anywhere_leaves_the_scarce_model():
    # On a CPU-tight G2 the task removes as much stranding as it adds fragmentation (score 50, as on the T4,
    # where FGD sees nothing change): a tie without the scarcity term. With it, the T4's used GPU costs
    # 1.0 * 1000 milli: trunc(100 * sigmoid(-1)) = 26.
    g2, t4 = node("G2", 12_000, (1000, 1000)), node("T4", 64_000, (1000, 1000))
    task = make_shape(1000, cpu_milli=8000)
    strand_only = StrandAwarePolicy(HALF_T4, strand_weight=2.0, scarcity_weight=0.0)
    assert strand_only.score(*g2, task) == strand_only.score(*t4, task) == 50
    best = StrandAwarePolicy(HALF_T4)
    assert (best.score(*g2, task), best.score(*t4, task)) == (50, 26)


@pytest.mark.parametrize("field", ["strand_weight", "scarcity_weight", "leftover_weight"])
def test_weights_must_not_be_negative(field):
    with pytest.raises(ValueError, match=field):
        StrandAwarePolicy(HALF_T4, **{field: -1.0})


# Leftovers: two fractional classes, 500 milli on 4 cores and 300 milli on 2 (a whole-GPU class is not one).
HALF, THIRD, WHOLE = TaskClass(4000, 500, 1), TaskClass(2000, 300, 1), TaskClass(8000, 1000, 1)
PAIR = Workload((HALF, THIRD, WHOLE), (0.25, 0.25, 0.5))


@pytest.mark.parametrize(
    ("free_milli", "cpu_free", "least"),
    [
        (800, 16_000, 0),  # 500 + 300
        (800, 4_000, 200),  # 4 cores: one 500 (300 left) or two 300s (200 left), not both kinds
        (800, 3_999, 500),  # 3 cores: one 300; the node's CPU counts in whole cores, rounded down
        (800, 1_000, 800),  # nothing fits in one core
        (700, 8_000, 100),  # 300 + 300
        (250, 64_000, 250),  # below every class
        (0, 64_000, 0),
    ],
)
def test_least_leftover_on_one_gpu(free_milli, cpu_free, least):
    assert Leftovers(PAIR).least("G2", free_milli, cpu_free) == least


def test_a_class_confined_to_other_models_fills_nothing():
    t4_half = Workload((TaskClass(4000, 500, 1, ("T4",)), THIRD), (0.5, 0.5))
    assert Leftovers(t4_half).least("T4", 800, 64_000) == 0  # 500 + 300
    assert Leftovers(t4_half).least("G2", 800, 64_000) == 200  # 300 + 300


def test_the_leftover_term_counts_partly_used_gpus_only():
    # free (1000, 700) on 8 cores: the whole GPU is left out, the 700 can at best be cut to 100 (weight 2)
    plain, with_term = FragModel(PAIR), FragModel(PAIR, leftover_weight=2.0)
    assert with_term.frag("G2", 8000, (1000, 700)) - plain.frag("G2", 8000, (1000, 700)) == 200.0


def test_a_fraction_goes_where_its_leftover_can_still_be_filled():
    # A 300 on a GPU with 900 free leaves 600 (two more 300s fill it); on a free GPU it leaves 700 (at best
    # 100 idle for good). With only the two fractional classes FGD sees both rooms fit every class (a tie,
    # score 50); the leftover term costs the free GPU 2 * 100: trunc(100 * sigmoid(-0.2)) = 45.
    fractions = Workload((HALF, THIRD), (0.5, 0.5))
    used, fresh = node("G2", 64_000, (900,)), node("G2", 64_000, (1000,))
    task = make_shape(300, cpu_milli=2000)
    fgd = StrandAwarePolicy(fractions, strand_weight=0.0, leftover_weight=0.0)
    assert fgd.score(*used, task) == fgd.score(*fresh, task) == 50
    best = StrandAwarePolicy(fractions)
    assert (best.score(*used, task), best.score(*fresh, task)) == (50, 45)


def test_a_cpu_only_task_descends_fgd_fragmentation_alone():
    # A 4-core CPU-only task on a CPU-tight G2 (12 cores for 2 idle GPUs) would raise the stranding term from
    # 2 * (2000 - 12000 / 8) = 1000 to 2 * (2000 - 8000 / 8) = 2000 (score trunc(100 * sigmoid(-1)) = 26), and
    # on a CPU-rich G2 leave it 0 (50). `best` scores it as FGD does: ANYWHERE still fits both and T4_ONLY fits
    # neither before or after, F_n(M) does not move, a tie at 50 that the node order breaks.
    tight, rich = node("G2", 12_000, (1000, 1000)), node("G2", 64_000, (1000, 1000))
    with_terms = FragModel(HALF_T4, strand_weight=2.0, scarcity_weight=1.0)
    assert with_terms.frag("G2", 8000, (1000, 1000)) - with_terms.frag("G2", 12_000, (1000, 1000)) == 1000.0
    task = make_shape(0, cpu_milli=4000)
    best = StrandAwarePolicy(HALF_T4)
    assert best.score(*tight, task) == best.score(*rich, task) == 50
    # GPU tasks keep the terms: a CPU-light GPU task on the tight node cuts its stranding (81, FGD alone 62)
    gpu_task = make_shape(1000, cpu_milli=4000)
    assert (best.score(*tight, gpu_task), FgdPolicy(HALF_T4).score(*tight, gpu_task)) == (81, 62)
