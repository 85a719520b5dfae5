"""GpuClustering: prefer nodes already hosting tasks of the same GPU tag ("share-gpu" or "<k>-gpu"),
then fuller nodes (ALGORITHMS.md §2.4, 4). CPU-only tasks score 0 everywhere."""

from __future__ import annotations

from gpupool.core.framework import ScorePlugin
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState, shape_tag
from gpupool.core.units import MAX_GPU_MILLI, trunc_div


class GpuClusteringScore(ScorePlugin):
    name = "gpuclustering"

    def __init__(self, max_gpu_milli: int = MAX_GPU_MILLI) -> None:
        self.max_gpu = max_gpu_milli

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        tag = shape_tag(shape)
        if not tag:
            return 0
        b = trunc_div(25 * (self.max_gpu - state.gpu_idle), self.max_gpu)
        tags = {t for t, _ in state.tags}
        if not tags:
            return 25 + b
        if tag not in tags:
            return b
        return (75 if len(tags) == 1 else 50) + b
