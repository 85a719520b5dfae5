"""Node constraint tags: a task whose `node_labels` a node lacks never goes there (a cluster backend's node
selectors, affinities and taints, compiled to tags), and the cycle says why it waits."""

from __future__ import annotations

import dataclasses
import random

from gpupool.core import (
    Bind,
    ClusterSnapshot,
    FixedClock,
    Framework,
    NodeState,
    PendingKind,
    TaskShape,
    default_registry,
    placement_profile,
    run_cycle,
)
from gpupool.core.fit import copies_fit, node_fits
from gpupool.core.framework.status import Code
from gpupool.core.model import NodeSpec
from gpupool.core.nodes import NodeKind
from gpupool.core.plugins.filter.gpu_fit import GpuFitFilter
from gpupool.core.testing.builders import make_job, make_node, make_shape, table_of


def labelled(name: str, *labels: str, gpus: int = 2) -> NodeSpec:
    return dataclasses.replace(make_node(name, gpus=gpus), labels=frozenset(labels))


def test_a_task_with_tags_fits_only_a_node_with_all_of_them():
    shape = TaskShape(0, 0, 1, 500, node_labels=("zone-b", "gpu-pool"))
    assert shape.node_labels == ("gpu-pool", "zone-b"), "kept sorted, so equal asks are one cache key"
    lacking, having = NodeKind.of(labelled("a", "gpu-pool")), NodeKind.of(labelled("b", "gpu-pool", "zone-b", "x"))
    assert node_fits(lacking, NodeState.empty(lacking), shape) == "node constraints not met"
    assert node_fits(having, NodeState.empty(having), shape) == ""
    assert copies_fit(lacking, NodeState.empty(lacking), shape) == 0
    assert copies_fit(having, NodeState.empty(having), shape) == 4
    assert GpuFitFilter().filter(lacking, NodeState.empty(lacking), shape).code is Code.UNRESOLVABLE
    plain = make_shape(500)
    assert node_fits(lacking, NodeState.empty(lacking), plain) == "", "a task without tags goes anywhere"


def test_the_cycle_places_a_tagged_job_on_its_node_and_says_why_another_waits():
    table = table_of(labelled("a"), labelled("b", "team-x"))
    framework = Framework.build(placement_profile("bestfit"), default_registry())
    jobs = (make_job("x", TaskShape(0, 0, 1, 1000, node_labels=("team-x",))),
            make_job("y", TaskShape(0, 0, 1, 1000, node_labels=("team-y",)), submitted_at=1))
    result = run_cycle(ClusterSnapshot(table, jobs, {}), framework, clock=FixedClock(), rng=random.Random(0))
    assert [(d.job_id, d.node) for d in result.decisions if isinstance(d, Bind)] == [("x", "b")]
    assert result.pending["y"].kind is PendingKind.NO_NODE_FITS
    assert dict(result.pending["y"].details) == {"node constraints not met": 2}
