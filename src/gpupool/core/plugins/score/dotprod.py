"""DotProd (Tetris-style, merge/max): prefer the node whose free vector is least aligned with the
request (ALGORITHMS.md §2.4, 2).

score = trunc(100 * (1 - (v . u) / 2)), v = [c/max_cpu, idle/max_gpu], u = [cpu/max_cpu, k m/max_gpu],
computed in exact integers.
"""

from __future__ import annotations

from gpupool.core.framework import ScorePlugin
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.units import MAX_CPU_MILLI, MAX_GPU_MILLI, trunc_div


class DotProdScore(ScorePlugin):
    name = "dotprod"

    def __init__(self, max_cpu_milli: int = MAX_CPU_MILLI, max_gpu_milli: int = MAX_GPU_MILLI) -> None:
        self.cpu2 = max_cpu_milli * max_cpu_milli
        self.gpu2 = max_gpu_milli * max_gpu_milli

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        if state.cpu_free < shape.cpu_milli:
            return 0
        den = self.cpu2 * self.gpu2
        dot = state.cpu_free * shape.cpu_milli * self.gpu2 + state.gpu_idle * shape.total_gpu_milli * self.cpu2
        return trunc_div(100 * (2 * den - dot), 2 * den)
