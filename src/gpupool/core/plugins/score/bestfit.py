"""BestFit: prefer the node with the least CPU and GPU left after placement (ALGORITHMS.md §2.4, 5).

raw = trunc(100 * (1 - [0.5 (c - cpu)/max_cpu + 0.5 (idle - k m)/max_gpu])), in exact integers.
The reference's min-max normalisation is left out: alone it never changes the winner.
"""

from __future__ import annotations

from gpupool.core.framework import ScorePlugin
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.units import MAX_CPU_MILLI, MAX_GPU_MILLI, trunc_div


class BestFitScore(ScorePlugin):
    name = "bestfit"

    def __init__(self, max_cpu_milli: int = MAX_CPU_MILLI, max_gpu_milli: int = MAX_GPU_MILLI) -> None:
        self.max_cpu = max_cpu_milli
        self.max_gpu = max_gpu_milli

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        cpu_left = state.cpu_free - shape.cpu_milli
        gpu_left = state.gpu_idle - shape.total_gpu_milli
        den = 2 * self.max_cpu * self.max_gpu
        used = 100 * (cpu_left * self.max_gpu + gpu_left * self.max_cpu)
        return trunc_div(100 * den - used, den)
