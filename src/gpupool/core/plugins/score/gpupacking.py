"""GpuPacking: prefer already shared GPUs (least free first), then free GPUs on used nodes, then
empty nodes (ALGORITHMS.md §2.4, 3). CPU-only tasks score 0 everywhere (lowest name wins)."""

from __future__ import annotations

from gpupool.core.framework import ScorePlugin
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.units import MILLI


class GpuPackingScore(ScorePlugin):
    name = "gpupacking"

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        if shape.gpu_count == 0:
            return 0
        free = state.gpu_free
        if all(r >= MILLI for r in free):
            return max(33 - len(free), len(free))
        picked = [r for r in sorted(free) if r >= shape.gpu_milli][: shape.gpu_count]
        whole = sum(1 for r in picked if r >= MILLI)
        if whole:
            return max(50 - whole, 33)
        s = sum(100 * r // MILLI for r in picked)
        return max(100 - s // 10, 50)
