"""LP bound: min(1, demand) when nothing binds; lower when GPU models constrain placement."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpupool.core.testing.builders import make_node, make_shape
from gpupool.sim.bound import lp_bound

NODES = [make_node(f"t{i}", gpus=2, model="T4") for i in range(4)] + [make_node(f"v{i}", gpus=2, model="V100")
                                                                      for i in range(4)]


@pytest.mark.parametrize("demand", [Fraction(1, 2), Fraction(1), Fraction(13, 10)])
def test_unconstrained_bound_is_the_capacity_bound(demand):
    shapes = [make_shape(1000)] * 10 + [make_shape(500)] * 4
    assert lp_bound(NODES, shapes, demand).pct == pytest.approx(100 * min(Fraction(1), demand))


def test_model_constraint_lowers_the_bound():
    shapes = [make_shape(1000, models=["V100"])] * 3 + [make_shape(1000)]  # 3/4 of demand wants half the GPUs
    bound = lp_bound(NODES, shapes, Fraction(1))
    # V100 work can use at most the 8 V100 GPUs: 4 of the 16 GPUs of demand are any-model -> 8 + 4 = 12
    assert bound.pct == pytest.approx(75.0)
    assert bound.allocated_milli == pytest.approx(12_000)


def test_cpu_per_node_binds_in_aggregate():
    nodes = [make_node("a", gpus=4, cpu_milli=4000)]
    shapes = [make_shape(1000, cpu_milli=2000)] * 8
    assert lp_bound(nodes, shapes, Fraction(1)).pct == pytest.approx(50.0)


def test_matches_the_published_openb_figure(openb):
    from gpupool.sim.traces.openb import read_nodes, read_pods
    nodes = read_nodes(openb / "openb_node_list_gpu_node.csv")
    shapes = [p.shape for p in read_pods(openb / "openb_pod_list_gpuspec33.csv")]
    assert lp_bound(nodes, shapes, Fraction(9, 10)).pct == pytest.approx(88.18, abs=0.01)
    assert lp_bound(nodes, shapes, Fraction(1)).pct == pytest.approx(96.46, abs=0.01)
