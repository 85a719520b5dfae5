"""Spread: prefer the node with the most free CPU and GPU share left after placement (least
allocated first), for availability-sensitive work. Pair with the `worst_fit` device plugin."""

from __future__ import annotations

from gpupool.core.framework import ScorePlugin
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState


class SpreadScore(ScorePlugin):
    name = "spread"

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        cpu_pct = 100 * (state.cpu_free - shape.cpu_milli) // kind.cpu_milli if kind.cpu_milli else 100
        if not kind.gpu_count:
            return cpu_pct
        gpu_pct = 100 * (state.gpu_idle - shape.total_gpu_milli) // kind.gpu_milli
        return (cpu_pct + gpu_pct) // 2
