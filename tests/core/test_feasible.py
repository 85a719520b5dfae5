"""Submission check: a job that cannot start even on the empty cluster is recognised (core.feasible)."""

from __future__ import annotations

from gpupool.core import NodeKind
from gpupool.core.feasible import never_fits
from gpupool.core.testing.builders import make_job, make_node, make_shape

# openb's G3 nodes: 8 GPUs and 128 CPUs; a trace task of 8 GPUs and 120 CPUs fits one per G3 node only.
G3 = NodeKind.of(make_node("g3", gpus=8, cpu_milli=128_000, memory_mib=786_432))
G2 = NodeKind.of(make_node("g2", gpus=8, cpu_milli=96_000, memory_mib=393_216))
BIG = make_shape(1000, gpu_count=8, cpu_milli=120_000, memory_mib=640_000)


def test_a_gang_needs_as_many_nodes_as_can_take_its_tasks():
    cluster = [G3] * 7 + [G2] * 54
    assert never_fits(make_job("seven", *[BIG] * 7), cluster) == ""
    assert never_fits(make_job("eight", *[BIG] * 8), cluster) == (
        "7 of its 8 tasks fit even with every node empty (54 insufficient CPU)")


def test_only_the_mandatory_tasks_must_fit():
    cluster = [G3] * 7
    assert never_fits(make_job("elastic", *[BIG] * 8, min_tasks=7), cluster) == ""


def test_tasks_that_share_a_node_count_every_copy():
    small = make_shape(1000, gpu_count=2, cpu_milli=8_000)
    assert never_fits(make_job("four", *[small] * 4), [G2]) == ""
    assert never_fits(make_job("five", *[small] * 5), [G2]) == "4 of its 5 tasks fit even with every node empty"
    assert never_fits(make_job("model", make_shape(1000, models=("H100",))), [G2, G3]) == (
        "0 of its 1 tasks fit even with every node empty (2 GPU model not allowed)")
