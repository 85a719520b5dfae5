"""Stranding-aware FGD: gpupool's recommended placement (`--policy best`); see docs/design/placement.md.

FGD descends the workload-aware fragmentation F_n(M), which asks only whether the *next* task could
still use a node. It misses two ways GPUs end up idle for good:
- stranded by CPU: a node whose free CPU cannot feed its idle GPUs at the workload's CPU-per-GPU ratio
  leaves them idle however the next tasks are drawn (term: w_s * max(0, idle_gpu - free_cpu / cpu_per_gpu));
- taken from a scarce model: a task that could run anywhere, placed on a model that other tasks are
  confined to, makes one of those fail later (term: w_p * pressure(model) * used_gpu);
- left over on a shared GPU: a fraction that leaves a GPU with room no combination of the workload's
  fractional classes can fill idles that room for good (term: w_l * sum over partly used GPUs of the least
  such leftover, `Leftovers`).
This policy descends F_n(M) plus the three terms for GPU tasks, everything else as FGD. CPU-only tasks descend
F_n(M) alone: with the terms they spread over the nodes with CPU to spare and trim CPU that GPU tasks need later
(1.2 to 1.4 points of allocation lost on openb's cpu250 list).
"""

from __future__ import annotations

from gpupool.core.fragmentation import FragModel, Workload
from gpupool.core.model import TaskShape
from gpupool.core.plugins.score.fgd import FgdPolicy

DEFAULT_STRAND_WEIGHT = 2.0
DEFAULT_SCARCITY_WEIGHT = 1.0
DEFAULT_LEFTOVER_WEIGHT = 2.0


class StrandAwarePolicy(FgdPolicy):
    name = "strand_aware"

    def __init__(self, workload: Workload, strand_weight: float = DEFAULT_STRAND_WEIGHT,
                 scarcity_weight: float = DEFAULT_SCARCITY_WEIGHT,
                 leftover_weight: float = DEFAULT_LEFTOVER_WEIGHT) -> None:
        weights = {"strand_weight": strand_weight, "scarcity_weight": scarcity_weight,
                   "leftover_weight": leftover_weight}
        for field, value in weights.items():
            if value < 0:
                raise ValueError(f"{field}: must be >= 0")
        self.strand_weight, self.scarcity_weight = strand_weight, scarcity_weight
        self.leftover_weight = leftover_weight
        super().__init__(workload)
        self._plain = FragModel(workload)

    def frag_model(self, workload: Workload) -> FragModel:
        return FragModel(workload, self.strand_weight, self.scarcity_weight, self.leftover_weight)

    def frag_for(self, shape: TaskShape) -> FragModel:
        return self.frag if shape.gpu_count else self._plain
